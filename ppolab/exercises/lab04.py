"""Lab 04 — the clipped objective (chapter §4.1–4.3). Recorded data: ``ppo_fire_tiny`` (ε = 0.07)."""
from __future__ import annotations

import math

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers.cases import clip_case, clip_window_case, run_eps

#: The lab's run: PPO + GAE trained at clip_ratio 0.07, where the clip binds on a few % of the tokens.
RUN = "ppo_fire_tiny"
#: The recorded steps and optimizer steps the lab's explorer and exercises use on ppo_fire_tiny: 04.2 an epoch-2
#: pass over step 3's first mini-batch (where ε = 0.05 clips twice the tokens ε = 0.07 does), 04.3 an epoch-3 pass
#: over step 24's third mini-batch (another step and mini-batch, so 04.3 is not 04.2 again).
PREDICT, CODE = (3, 4), (24, 14)


def predict_case(run=None) -> dict:
    """Exercise 04.2's (step, optimizer step): the explorer's, where the clip binds in this run and ε = 0.05 clips
    other tokens than the run's ε (else the run's own pg_clipfrac would pass)."""
    return clip_window_case(run, PREDICT, 0.05, 0.05, default=RUN)


def code_case(run=None) -> dict:
    """Exercise 04.3's (step, optimizer step): ``CODE``'s where the clip binds there, else the pair where it binds
    most — in either case one whose pg_clipfrac at the run's ε differs from exercise 04.2's truth (resubmitting the
    previous answer must not pass), searched in order of clipped tokens when the first choice collides."""
    from ppolab.numbers import resolve_run
    from ppolab.numbers.cases import clip_terms, opt_pairs

    r = resolve_run(run, default=RUN)
    c = clip_case(r, CODE, default=RUN)
    avoid = _e2(r)

    def clipfrac(s: int, k: int) -> float:
        b, terms = clip_terms(r, s, k)
        return algos.masked_mean(terms["clipped"], b["response_mask"]).item()
    if not math.isclose(clipfrac(c["step"], c["opt_step"]), avoid, rel_tol=1e-6, abs_tol=1e-9):
        return c
    for s, k in sorted(opt_pairs(r, first_opt=1), key=lambda p: -clipfrac(*p)):
        f = clipfrac(s, k)
        if f > 0 and not math.isclose(f, avoid, rel_tol=1e-6, abs_tol=1e-9):
            return {**c, "step": s, "opt_step": k}
    return c


def _batch(run, step: int, opt_step: int) -> dict[str, torch.Tensor]:
    from ppolab.numbers import optimizer_step_batch, step_tensors

    return optimizer_step_batch(step_tensors(run, step, default=RUN), opt_step)


def below_window_case(run=None) -> dict:
    """Exercise 04.1's two tokens: in the first recorded (step, optimizer step ≥ 1) that has both — the explorer's
    ``PREDICT`` pair first — a real token A with A > 0 and one B with A < 0, each with its ratio below the window's
    lower edge 1 − ε_low (the one with the lowest ratio of each sign); where no optimizer step has both, the lowest
    ratio of each sign. §4.3 and its mirror, on recorded tokens."""
    from ppolab.numbers import RunLacks, resolve_run
    from ppolab.numbers.cases import clip_terms, opt_pairs

    r = resolve_run(run, default=RUN)
    low = algos.policy_loss.clip_bounds(actor_config_of(r))[0]
    pairs = opt_pairs(r, first_opt=1)
    pairs = ([PREDICT] if PREDICT in pairs else []) + pairs
    # first choice: both tokens below the window; a run whose tokens never drift that far (ε = 0.2 on grpo_tiny)
    # gets the lowest ratio of each sign instead: the same two maxima to work out, another branch may win
    for strict in (True, False):
        for s, k in pairs:
            b, terms = clip_terms(r, s, k)
            valid = (b["response_mask"] > 0) & ((terms["ratio"] < 1 - low) if strict else True)
            picks = {}
            for name, sign in (("a", b["advantages"] > 0), ("b", b["advantages"] < 0)):
                where = valid & sign
                if not where.any():
                    break
                ratio = torch.where(where, terms["ratio"], torch.full_like(terms["ratio"], 9.0))
                i, j = divmod(int(ratio.flatten().argmin()), where.shape[1])
                picks[f"row_{name}"], picks[f"pos_{name}"] = int(b["rows"][i]), j
            if len(picks) == 4:
                return {"step": s, "opt_step": k, "eps": run_eps(r), **picks}
    raise RunLacks("real tokens with each sign of advantage after the first optimizer step", r)


def actor_config_of(r):
    from ppolab.numbers import actor_config

    return actor_config(r)


@exercise("04.1", "§4.3 and its mirror on two real tokens: recorded step {step}, optimizer step {opt_step}, at the "
                  "run's ε = {eps}. Token A is row {row_a}, position {pos_a}; token B is row {row_b}, position {pos_b} "
                  "(rows of the recorded batch). For each, from its ratio and advantage: the per-token loss, and does "
                  "the gradient flow? Answer ((loss A, flows A), (loss B, flows B)).",
          kind="compute",
          hints=("Read each token's log_prob (actor_log_probs[{opt_step}]), old_log_prob and advantage; ratio = "
                 "exp(log_prob − old_log_prob). With A > 0 the clip only bites above 1 + ε; with A < 0 only "
                 "below 1 − ε. Which branch of the max wins for each?",
                 "ℓ = max(−A·r, −A·clip(r, 1 − ε, 1 + ε)); the gradient flows when the unclipped branch −A·r is the "
                 "larger one (ppo_clip_terms(...)['pg_losses'] and autograd give both)."),
          rel=1e-5, abs=1e-7, context=("run",), needs=("opt_steps",), case=below_window_case, default_run=RUN)
def _e1(run=None) -> tuple[tuple[float, bool], tuple[float, bool]]:
    from ppolab.numbers import resolve_run

    r = resolve_run(run, default=RUN)
    c = below_window_case(r)
    t = r.step(c["step"]).tensors
    low, high = algos.policy_loss.clip_bounds(actor_config_of(r))
    out = []
    for row, pos in ((c["row_a"], c["pos_a"]), (c["row_b"], c["pos_b"])):
        lp = t["actor_log_probs"][c["opt_step"]][row:row + 1, pos:pos + 1].clone().requires_grad_(True)
        terms = algos.ppo_clip_terms(t["old_log_probs"][row:row + 1, pos:pos + 1], lp,
                                     t["advantages"][row:row + 1, pos:pos + 1], low, high)
        terms["pg_losses"].sum().backward()
        out.append((terms["pg_losses"].item(), bool(lp.grad.item() != 0)))   # autograd says whether it flows
    return tuple(out)


@exercise("04.2", "Predict, then verify: actor/pg_clipfrac of recorded step {step}, optimizer step {opt_step}, at "
                  "ε_low = ε_high = 0.05 — a narrower window than the run's ε = {eps} (3 decimals).",
          kind="predict",
          hints=("The explorer opens at ε = {eps} and shows every token's ratio. ε = 0.05 narrows the window to "
                 "[0.95, 1.05]: every token clipped at {eps} stays clipped, and the tokens with A > 0 and a ratio "
                 "in (1.05, 1 + {eps}], or A < 0 and a ratio in [1 − {eps}, 0.95), join them. Set both ε sliders to "
                 "0.05 to check.",
                 "pg_clipfrac = masked_mean(ppo_clip_terms(old, log_prob, A, 0.05, 0.05)['clipped'], "
                 "response_mask) on optimizer_step_batch(run.step({step}), {opt_step})."),
          rel=0.0, abs=5e-4, context=("run",), needs=("opt_steps",), case=predict_case, default_run=RUN)
def _e2(run=None) -> float:
    c = predict_case(run)
    b = _batch(run, c["step"], c["opt_step"])
    terms = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], 0.05, 0.05)
    return algos.masked_mean(terms["clipped"], b["response_mask"]).item()


@exercise("04.3", "Write code: recompute actor/pg_clipfrac of recorded step {step}, optimizer step {opt_step}, at the "
                  "run's own ε = {eps} (a fraction of that optimizer step's real response tokens). It must equal the "
                  "number compute_policy_loss_vanilla reports (the explorer's readout at that optimizer step).",
          kind="code",
          hints=("Take the rows of that optimizer step (optimizer_step_batch), ppo_clip_terms(...)['clipped'] on "
                 "them, and average over the tokens that count — not over every padded position.",
                 "masked_mean(ppo_clip_terms(b['old_log_probs'], b['log_prob'], b['advantages'], {eps}, {eps})"
                 "['clipped'], b['response_mask']) with b = optimizer_step_batch(run.step({step}), {opt_step})."),
          context=("run",), needs=("opt_steps",), case=code_case, default_run=RUN)
def _e3(run=None) -> float:
    from ppolab.numbers import actor_config, resolve_run

    r = resolve_run(run, default=RUN)
    c = code_case(r)
    b = _batch(r, c["step"], c["opt_step"])
    _, metrics = algos.compute_policy_loss_vanilla(b["old_log_probs"], b["log_prob"], b["advantages"],
                                                   b["response_mask"], config=actor_config(r))
    return metrics["actor/pg_clipfrac"]
