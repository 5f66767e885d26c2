"""Lab 05 — asymmetric clip and dual clip (chapter §4.4). Recorded data: ``ppo_fire_tiny`` (ε = 0.07,
clip_ratio_c = 1.2), where the dual clip binds on real optimizer steps."""
from __future__ import annotations

import math

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers.cases import clip_window_case, dual_clip_case

#: The lab's run: trained with clip_ratio 0.07 and clip_ratio_c 1.2.
RUN = "ppo_fire_tiny"
#: (step, optimizer step) of the asymmetric-window exercise; the recorded step where the dual clip binds, the
#: optimizer step its explorer opens on, and the optimizer step of the write-the-metric exercise.
ASYM = (6, 8)
DUAL_STEP, DUAL_OPEN, DUAL_CODE = 18, 4, 12


def asym_case(run=None) -> dict:
    """Exercise 05.3's (step, optimizer step): the lab's where clip-higher (ε_high = 0.2) releases tokens there, else
    where it releases the most (else the two counts would be equal and a repeated count would pass)."""
    from ppolab.numbers import actor_config, resolve_run

    eps = actor_config(resolve_run(run, default=RUN)).clip_ratio
    return clip_window_case(run, ASYM, eps, 0.2, default=RUN)


def dual_case(run=None) -> dict:
    """Exercises 05.4–05.5: the first recorded step where the dual clip binds, and two of its optimizer steps."""
    return dual_clip_case(run, (DUAL_STEP, DUAL_OPEN, DUAL_CODE), default=RUN)


def _t(x: float) -> torch.Tensor:
    return torch.tensor([[x]], dtype=torch.float64)


def _batch(run, step: int, opt_step: int) -> dict[str, torch.Tensor]:
    from ppolab.numbers import optimizer_step_batch, step_tensors

    return optimizer_step_batch(step_tensors(run, step, default=RUN), opt_step)


@exercise("05.1", "ε = 0.2, clip_ratio_c = 3, A = −2, ratio 4. What is the per-token loss (the minimised form)?",
          hints=("Three candidates: −A·r, −A·clip(r, 1−ε, 1+ε) and −A·c. The ordinary clip takes the max of the "
                 "first two; for A < 0 the dual clip then takes the min with the third.",
                 "ℓ = min(max(−A·r, −A·clip(r)), −A·c) = min(max(8, 2.4), 6)."))
def _e1() -> float:
    return algos.ppo_clip_terms(_t(0.0), _t(math.log(4.0)), _t(-2.0), 0.2, 0.2, 3.0)["pg_losses"].item()


def _dual_bites(ratio: float, c: float, advantage: float) -> bool:
    terms = algos.ppo_clip_terms(_t(0.0), _t(math.log(ratio)), _t(advantage), 0.2, 0.2, c)
    return bool(terms["dual_clipped"].item())


@exercise("05.2", "With clip_ratio_c = 3, above which ratio does the dual clip start to bite for a token with A < 0 "
                  "(whatever the size of A)? (3 decimals)",
          hints=("For A < 0 and r > 1 + ε the ordinary clip leaves −A·r in place. When is −A·r larger than the "
                 "dual bound −A·c?",
                 "−A·r > −A·c ⇔ r > c (−A > 0 divides out): the threshold is clip_ratio_c itself."),
          rel=0.0, abs=1e-3)
def _e2() -> float:
    lo, hi = 1.0, 100.0                        # bisection on ppolab's own dual_clipped flag
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _dual_bites(mid, 3.0, -0.7) else (mid, hi)
    assert _dual_bites(hi, 3.0, -5.0) and not _dual_bites(lo, 3.0, -5.0)   # the same for another A < 0
    return hi


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
