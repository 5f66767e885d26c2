"""Lab 05 — asymmetric clip and dual clip (chapter §4.4). Recorded data: ``ppo_fire_tiny`` (ε = 0.07,
clip_ratio_c = 1.2), where the dual clip binds on real optimizer steps."""
from __future__ import annotations

import math

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers.cases import clip_window_case, dual_clip_case, run_eps

#: The lab's run: trained with clip_ratio 0.07 and clip_ratio_c 1.2.
RUN = "ppo_fire_tiny"
#: (step, optimizer step) of the asymmetric-window exercise; the recorded step where the dual clip binds, the
#: optimizer step its explorer opens on, and the optimizer step of the write-the-metric exercise.
ASYM = (6, 8)
DUAL_STEP, DUAL_OPEN, DUAL_CODE = 21, 9, 13


def asym_case(run=None) -> dict:
    """Exercise 05.3's (step, optimizer step): the lab's where clip-higher (ε_high = 0.2) releases tokens there, else
    where it releases the most (else the two counts would be equal and a repeated count would pass)."""
    from ppolab.numbers import resolve_run

    eps = run_eps(resolve_run(run, default=RUN))
    return clip_window_case(run, ASYM, eps, 0.2, default=RUN)


def dual_case(run=None) -> dict:
    """Exercises 05.4–05.5: the first recorded step where the dual clip binds, and two of its optimizer steps."""
    return dual_clip_case(run, (DUAL_STEP, DUAL_OPEN, DUAL_CODE), default=RUN)


def _batch(run, step: int, opt_step: int) -> dict[str, torch.Tensor]:
    from ppolab.numbers import optimizer_step_batch, step_tensors

    return optimizer_step_batch(step_tensors(run, step, default=RUN), opt_step)


def _negative_tokens(run=None) -> tuple[dict, dict, dict, torch.Tensor]:
    """The dual clip's second optimizer step (:func:`dual_case`'s ``code``; the lab prints the token the explorer opens
    on, at ``open``): its case, its batch, ppo_clip_terms at the run's ε and clip_ratio_c, and the mask of its real
    tokens with A < 0 (the only ones the dual clip can touch)."""
    from ppolab.numbers import actor_config, resolve_run

    c = dual_case(run)
    cfg = actor_config(resolve_run(run, default=RUN))
    low, high = algos.policy_loss.clip_bounds(cfg)
    b = _batch(run, c["step"], c["code"])
    terms = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], low, high, cfg.clip_ratio_c)
    return c, b, terms, (b["response_mask"] > 0) & (b["advantages"] < 0)


def top_negative_case(run=None) -> dict:
    """Exercise 05.1's token and what-if: of the dual clip's second optimizer step, the real token with A < 0 and the
    largest ratio (a row of the recorded batch and a response position), and a bound ``what_if`` halfway between the
    run's clip_ratio_c and that ratio — the lab prints this token's loss at the run's c, not at this one."""
    c, b, terms, neg = _negative_tokens(run)
    ratio = torch.where(neg, terms["ratio"], torch.zeros_like(terms["ratio"]))
    i, j = divmod(int(ratio.flatten().argmax()), ratio.shape[1])
    return {**c, "row": int(b["rows"][i]), "pos": j, "what_if": round((c["c"] + float(ratio[i, j])) / 2, 3)}


@exercise("05.1", "The dual clip on a real token: recorded step {step}, optimizer step {code}, row {row}, position "
                  "{pos} (a row of the recorded batch) — of that optimizer step's real tokens with A < 0, the one with "
                  "the largest ratio. At the run's ε = {eps} but with clip_ratio_c = {what_if} instead of the run's "
                  "{c}: its per-token loss (the minimised form), and the loss it would have without the dual clip. "
                  "Answer (with, without).",
          kind="compute",
          hints=("Read the token's log_prob (actor_log_probs[{code}]), old_log_prob and advantage and form its "
                 "ratio. Three candidates: −A·r, −A·clip(r, 1−ε, 1+ε) and −A·c. The ordinary clip takes the max of "
                 "the first two; for A < 0 the dual clip then takes the min with the third.",
                 "with = min(max(−A·r, −A·clip(r)), −A·{what_if}); without = max(−A·r, −A·clip(r)) — "
                 "ppo_clip_terms(old, log_prob, A, {eps}, {eps}, {what_if})['pg_losses'] and ['pg_losses_clip'] on "
                 "that token."),
          rel=1e-5, abs=1e-7, context=("run",), needs=("opt_steps",), case=top_negative_case, default_run=RUN)
def _e1(run=None) -> tuple[float, float]:
    from ppolab.numbers import actor_config, resolve_run

    r = resolve_run(run, default=RUN)
    c = top_negative_case(r)
    t = r.step(c["step"]).tensors
    low, high = algos.policy_loss.clip_bounds(actor_config(r))
    one = (slice(c["row"], c["row"] + 1), slice(c["pos"], c["pos"] + 1))
    args = (t["old_log_probs"][one], t["actor_log_probs"][c["code"]][one], t["advantages"][one], low, high)
    with_dual = algos.ppo_clip_terms(*args, c["what_if"])["pg_losses"].item()
    without = algos.ppo_clip_terms(*args, math.inf)["pg_losses"].item()   # a bound no ratio reaches
    return with_dual, without


@exercise("05.2", "The dual-clip threshold on real tokens: on recorded step {step}, optimizer step {code}, the run's "
                  "clip_ratio_c = {c} binds on some real tokens. Above which value would clip_ratio_c bind on none "
                  "of that optimizer step's real tokens — the smallest c that leaves them all alone? (3 decimals)",
          kind="compute",
          hints=("For A < 0 and r > 1 + ε the ordinary clip leaves −A·r in place. When is −A·r larger than the "
                 "dual bound −A·c, and does the size of A matter?",
                 "−A·r > −A·c ⇔ r > c (−A > 0 divides out): the dual clip binds on a token with A < 0 exactly when "
                 "its ratio exceeds c, so the answer is the largest ratio over the real tokens with A < 0 of "
                 "optimizer_step_batch(run.step({step}), {code})."),
          rel=0.0, abs=5e-4, context=("run",), needs=("opt_steps",), case=dual_case, default_run=RUN)
def _e2(run=None) -> float:
    from ppolab.numbers import actor_config, resolve_run

    c, b, terms, neg = _negative_tokens(run)
    top = float(terms["ratio"][neg].max())
    low, high = algos.policy_loss.clip_bounds(actor_config(resolve_run(run, default=RUN)))
    at_top = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], low, high, top)
    # ppolab's own dual_clipped flag agrees: at c = the largest ratio nothing binds
    assert not bool((at_top["dual_clipped"].bool() & neg).any())
    return top


def clipped_counts(run=None, step: int | None = None, opt_step: int | None = None, low: float | None = None,
                   highs: tuple[float | None, float] = (None, 0.2)) -> tuple[int, int]:
    """Clipped real tokens of one recorded optimizer step (default: :func:`asym_case`'s) at ε_low and each ε_high
    (None: the run's ε)."""
    c = asym_case(run)
    step = c["step"] if step is None else step
    opt_step = c["opt_step"] if opt_step is None else opt_step
    low = c["eps"] if low is None else low
    highs = tuple(low if h is None else h for h in highs)
    b = _batch(run, step, opt_step)

    def count(eps_high: float) -> int:
        terms = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], low, eps_high)
        return int(algos.masked_sum(terms["clipped"], b["response_mask"]).item())

    return count(highs[0]), count(highs[1])


@exercise("05.3", "Predict, then verify with the asymmetric explorer: on recorded step {step}, optimizer step "
                  "{opt_step}, how many real response tokens does the clip take out with the run's symmetric window "
                  "ε_low = ε_high = {eps}, and how many with clip-higher ε_low = {eps}, ε_high = 0.2? Answer "
                  "(symmetric count, clip-higher count).",
          kind="predict",
          hints=("Raising ε_high only moves the upper edge 1 + ε_high: it can only release tokens with A > 0 and "
                 "a ratio between 1 + {eps} and 1.2. Tokens with A < 0 below 1 − ε_low stay clipped.",
                 "Count ppo_clip_terms(old, log_prob, A, {eps}, ε_high)['clipped'] over response_mask on "
                 "optimizer_step_batch(run.step({step}), {opt_step}), for ε_high = {eps} and 0.2."),
          context=("run",), needs=("opt_steps",), case=asym_case, default_run=RUN)
def _e3(run=None) -> tuple[int, int]:
    return clipped_counts(run)


def dual_binding_opt_steps(run=None, step: int | None = None, c: float | None = None) -> list[int]:
    """The optimizer steps of one recorded step (default: :func:`dual_case`'s) at which the dual clip binds on at
    least one real token."""
    from ppolab.algos.policy_loss import clip_bounds
    from ppolab.numbers import actor_config, optimizer_step_batch, resolve_run

    r = resolve_run(run, default=RUN)
    rec = r.step(dual_case(r)["step"] if step is None else step)
    cfg = actor_config(r)
    low, high = clip_bounds(cfg)
    c = cfg.clip_ratio_c if c is None else c
    out = []
    for k in range(int(rec.tensors["actor_log_probs"].shape[0])):
        b = optimizer_step_batch(rec, k)
        terms = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], low, high, c)
        if algos.masked_sum(terms["dual_clipped"], b["response_mask"]).item() > 0:
            out.append(k)
    return out


@exercise("05.4", "Predict, then verify: the dual-clip explorer opens on recorded step {step}, optimizer step "
                  "{open}, where the run's clip_ratio_c = {c} bounds a real token. At which optimizer steps of "
                  "step {step} does the dual clip bind (pg_clipfrac_lower > 0)? Answer the list of optimizer "
                  "steps, e.g. [1, 5].",
          kind="predict",
          hints=("A token can only be dual-clipped at the optimizer steps that train its row: its mini-batch comes "
                 "back once per epoch ({per_epoch} mini-batches per epoch here, so every {per_epoch}-th optimizer "
                 "step). Is its ratio above {c} at each of those visits — the first one included: by then the "
                 "optimizer steps on the other mini-batches have already moved the policy. Move the opt step slider "
                 "to check.",
                 "[k for k in range({n_opt}) if masked_sum(ppo_clip_terms(old, log_prob, A, {eps}, {eps}, {c})"
                 "['dual_clipped'], response_mask) > 0] on optimizer_step_batch(run.step({step}), k)."),
          context=("run",), needs=("opt_steps",), case=dual_case, default_run=RUN)
def _e4(run=None) -> list[int]:
    return dual_binding_opt_steps(run)


@exercise("05.5", "Write code: recompute actor/pg_clipfrac_lower of recorded step {step}, optimizer step "
                  "{code}, at the run's clip_ratio_c = {c} (a fraction of that optimizer step's real response "
                  "tokens). It must equal the number compute_policy_loss_vanilla reports.",
          kind="code",
          hints=("pg_clipfrac_lower counts the tokens where the dual bound is active — A < 0 and the ordinary "
                 "clipped loss above −A·c — and divides by all the real response tokens, not only those with A < 0.",
                 "masked_mean(ppo_clip_terms(b['old_log_probs'], b['log_prob'], b['advantages'], {eps}, {eps}, {c})"
                 "['dual_clipped'], b['response_mask']) with b = optimizer_step_batch(run.step({step}), "
                 "{code})."),
          context=("run",), needs=("opt_steps",), case=dual_case, default_run=RUN)
def _e5(run=None) -> float:
    from ppolab.numbers import actor_config, resolve_run

    r = resolve_run(run, default=RUN)
    c = dual_case(r)
    b = _batch(r, c["step"], c["code"])
    _, metrics = algos.compute_policy_loss_vanilla(b["old_log_probs"], b["log_prob"], b["advantages"],
                                                   b["response_mask"], config=actor_config(r))
    return metrics["actor/pg_clipfrac_lower"]
