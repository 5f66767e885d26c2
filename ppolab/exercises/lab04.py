"""Lab 04 — the clipped objective (chapter §4.1–4.3). Recorded data: ``ppo_fire_tiny`` (ε = 0.07)."""
from __future__ import annotations

import math

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers.cases import clip_case, clip_window_case

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
    from ppolab.numbers.cases import _clip_terms, _opt_pairs

    r = resolve_run(run, default=RUN)
    c = clip_case(r, CODE, default=RUN)
    avoid = _e2(r)

    def clipfrac(s: int, k: int) -> float:
        b, terms = _clip_terms(r, s, k)
        return algos.masked_mean(terms["clipped"], b["response_mask"]).item()
    if not math.isclose(clipfrac(c["step"], c["opt_step"]), avoid, rel_tol=1e-6, abs_tol=1e-9):
        return c
    for s, k in sorted(_opt_pairs(r, first_opt=1), key=lambda p: -clipfrac(*p)):
        f = clipfrac(s, k)
        if f > 0 and not math.isclose(f, avoid, rel_tol=1e-6, abs_tol=1e-9):
            return {**c, "step": s, "opt_step": k}
    return c


def _t(x: float) -> torch.Tensor:
    return torch.tensor([[x]], dtype=torch.float64)


def _batch(run, step: int, opt_step: int) -> dict[str, torch.Tensor]:
    from ppolab.numbers import optimizer_step_batch, step_tensors

    return optimizer_step_batch(step_tensors(run, step, default=RUN), opt_step)


@exercise("04.1", "ε = 0.2, A = +1, ratio 0.7: the per-token loss, and does the gradient flow? (loss, flows)",
          hints=("With A > 0 the clip only bites above 1 + ε. Which branch of the max wins at r = 0.7?",
                 "ℓ = max(−A·r, −A·clip(r, 1−ε, 1+ε)) = max(−0.7, −0.8); the gradient flows when the "
                 "unclipped branch −A·r is the larger one."))
def _e1() -> tuple[float, bool]:
    lp = _t(math.log(0.7)).requires_grad_(True)
    terms = algos.ppo_clip_terms(_t(0.0), lp, _t(1.0), 0.2, 0.2)
    terms["pg_losses"].sum().backward()
    return terms["pg_losses"].item(), bool(lp.grad.item() != 0)


@exercise("04.2", "Predict, then verify: actor/pg_clipfrac of recorded step {step}, optimizer step {opt_step}, at "
                  "ε_low = ε_high = 0.05 — a narrower window than the run's ε = {eps} (3 decimals).",
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


@exercise("04.4", "§4.3 mirrored: ε = 0.2, A = −1, ratio 0.7. The per-token loss, and does the gradient flow? "
                  "(loss, flows)",
          hints=("With A < 0 the clip only bites below 1 − ε: the policy already made this bad token less likely "
                 "by more than ε allows. Which branch of the max wins?",
                 "ℓ = max(−A·r, −A·clip(r, 1−ε, 1+ε)) = max(0.7, 0.8); the clipped branch wins, so the loss is a "
                 "constant in θ and no gradient flows."))
def _e4() -> tuple[float, bool]:
    lp = _t(math.log(0.7)).requires_grad_(True)
    terms = algos.ppo_clip_terms(_t(0.0), lp, _t(-1.0), 0.2, 0.2)
    terms["pg_losses"].sum().backward()
    return terms["pg_losses"].item(), bool(lp.grad.item() != 0)
