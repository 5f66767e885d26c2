"""Lab 08 — the two reference-KL paths and their estimators (chapter §7)."""
from __future__ import annotations

import inspect

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers.cases import proportional_kl_case, recorded_step_case

#: π_θ of the §7.3 exercises: the base model at this temperature (π_ref: the base model at the run's temperature).
T_THETA = 0.7
#: The lab's run: PPO + GAE with the adaptive reward-side KL AND the k3 loss-side KL on at once.
RUN = "ppo_fire_tiny"


def _run(run=None):
    from ppolab.run.reader import resolve_run

    return resolve_run(run, RUN)


def reward_kl_statistic(run=None, step: int = 3, mask: str = "loss_mask", real_rows_only: bool = False,
                        kl_penalty: str | None = None) -> float:
    """``current_kl`` of apply_kl_penalty recomputed from recorded step ``step``: kl_penalty(old, ref) under
    ``mask`` (the recorded loss_mask is the response_mask stage 7 received, before rejection sampling), the token
    mean of every row, then the mean over the rows (padding rows count as 0 unless ``real_rows_only``)."""
    r = _run(run)
    t = r.step(step).tensors
    m = t[mask].float()
    name = kl_penalty or r.ppo_config().algorithm.kl_penalty
    kld = algos.kl_penalty(t["old_log_probs"].float(), t["ref_log_prob"].float(), name) * m
    per_row = algos.masked_mean(kld, m, axis=-1)
    if real_rows_only:
        per_row = per_row[~t["is_pad"].bool()]
    return torch.mean(per_row).item()


@exercise("08.4", "Which log-probs does each path compare with ref_log_prob? A dict {'reward-side': …, 'loss-side': …} "
          "with values among 'old_log_probs', 'rollout_log_probs', 'log_prob' (the current actor).",
          kind="lookup",
          hints=("The reward is shaped once per step, before the advantage and before any actor update; the loss is "
                 "recomputed in every actor forward pass.",
                 "apply_kl_penalty(token_level_scores, old_log_probs, ref_log_prob, …) vs "
                 "ppo_loss's kl_penalty(log_prob, ref_log_prob, kl_loss_type) (chapter §7 table)."))
def _e2() -> dict[str, str]:
    # reward-side: the one log-prob argument of apply_kl_penalty (the trainer passes batch[<that name>])
    params = inspect.signature(algos.apply_kl_penalty).parameters
    reward_side = next(p for p in params if p.endswith("log_probs") or p.endswith("log_prob"))
    # loss-side: which of ppo_loss's inputs its k1 term measures against the reference
    from ppolab.config import ActorConfig

    candidates = {"log_prob": torch.tensor([[-1.0, -2.0]], dtype=torch.float64),
                  "old_log_probs": torch.tensor([[-1.5, -0.5]], dtype=torch.float64)}
    ref = torch.tensor([[-1.2, -1.1]], dtype=torch.float64)
    cfg = ActorConfig(use_kl_loss=True, kl_loss_type="k1")
    _, metrics = algos.ppo_loss(cfg, old_log_prob=candidates["old_log_probs"], log_prob=candidates["log_prob"],
                                advantages=torch.ones_like(ref), response_mask=torch.ones_like(ref), ref_log_prob=ref)
    loss_side = next(name for name, lp in candidates.items()
                     if abs((lp - ref).mean().item() - metrics["actor/kl_loss"]) < 1e-12)
    return {"reward-side": reward_side, "loss-side": loss_side}


def _distinct_policies(run=None) -> None:
    """§7.3's π_θ is the base model at T_θ, π_ref the base model at the run's temperature: a run sampled at T_θ
    itself would make them one policy (every KL 0), so it lacks these exercises."""
    from ppolab.numbers import RunLacks

    r = _run(run)
    if float(r.ppo_config().actor_rollout_ref.rollout.temperature) == T_THETA:
        raise RunLacks(f"a rollout temperature other than T_θ = {T_THETA} (π_θ and π_ref would be one policy)", r)


def _lps(run=None, temperature: float = T_THETA):
    _distinct_policies(run)
    from ppolab.numbers.kl import full_log_probs, response_logits

    src = response_logits(_run(run), 1)
    m = src["mask"]
    return full_log_probs(src["logits"][m], temperature), full_log_probs(src["logits"][m], src["temperature"])


@exercise("08.5", f"The exact KL(π_θ‖π_ref) averaged over the valid response positions of recorded step 1, with "
          f"π_θ = the base model at T_θ = {T_THETA} and π_ref = the base model at the run's temperature.",
          kind="compute",
          hints=("At every position both policies are full distributions over the 29 tokens: no sampling is "
                 "needed. Sum over the vocabulary, then average over the positions.",
                 "KL = Σ_a π_θ(a)·(log π_θ(a) − log π_ref(a)) on the last dimension of lp_theta, lp_ref; "
                 "then .mean() over positions."),
          rel=1e-4, abs=1e-9, context=("run",), needs=("step1",), default_run=RUN)
def _e3(run=None) -> float:
    from ppolab.numbers.kl import exact_kl

    lp_theta, lp_ref = _lps(run)
    return exact_kl(lp_theta, lp_ref).mean().item()


def _step1(run=None) -> dict:
    """Exercise 08.6's recorded step: step 1 (the base model sampled it; §7.3's π_ref)."""
    return {"step": 1}


@exercise("08.6", f"Predict, then verify: tokens sampled from π_ref instead of π_θ (T_θ = {T_THETA}). The mean over "
          "the positions of recorded step 1 of E_{a∼π_ref}[k1] (3 decimals).",
          kind="predict",
          hints=("k1 = log π_θ(a) − log π_ref(a). Average it under π_ref, not π_θ: what KL is that, and in which "
                 "direction, and with which sign?",
                 "E_{a∼π_ref}[log π_θ(a) − log π_ref(a)] = −KL(π_ref‖π_θ): Σ_a π_ref(a)·(lp_theta − lp_ref)(a), "
                 "averaged over positions."),
          rel=0.0, abs=5e-4, context=("run",), needs=("step1",), case=_step1, default_run=RUN)
def _e4(run=None) -> float:
    lp_theta, lp_ref = _lps(run)
    return (lp_ref.exp() * (lp_theta - lp_ref)).sum(-1).mean().item()


@exercise("08.7", "Predict, then verify with the T_θ slider: under a ∼ π_θ, which of k1 and k3 has the smaller mean "
          "per-token variance on recorded step 1 — at T_θ = 0.8, and at T_θ = 0.5? A pair of names.",
          kind="predict",
          hints=("k3 = r − 1 − log r with r = π_ref(a)/π_θ(a): small when r stays near 1. How large can r get on a "
                 "token that a much sharper π_θ has almost ruled out?",
                 "Compare estimator_table(run, 1, T)['rows'][name]['pi_theta']['var'] for k1 and k3 at T = 0.8 and "
                 "at T = 0.5."),
          context=("run",), needs=("step1",), default_run=RUN)
def _e5(run=None) -> tuple[str, str]:
    from ppolab.numbers.kl import estimator_table

    out = []
    _distinct_policies(run)
    for temperature in (0.8, 0.5):
        rows = estimator_table(_run(run), 1, temperature, ("k1", "k3"))["rows"]
        out.append(min(("k1", "k3"), key=lambda n: rows[n]["pi_theta"]["var"]))
    return tuple(out)


@exercise("08.8", "Sampled tokens a ∼ π_θ are data (no gradient flows through the sampling). Which of the names k1, "
          "abs, k2, k3, k1+, abs+, k2+, k3+ give, on average, exactly the gradient of KL(π_θ‖π_ref)? A set of names.",
          kind="lookup",
          hints=("Write each estimator's derivative with respect to log π_θ(a), then average "
                 "∂k/∂log π_θ(a) · ∇log π_θ(a) over a ∼ π_θ; remember E_{π_θ}[∇log π_θ] = 0.",
                 "∇KL(π_θ‖π_ref) = E_{π_θ}[d·∇log π_θ] with d = log π_θ − log π_ref: the estimators whose "
                 "derivative is d, i.e. k2 and every '+' form (value of the base, gradient of k2). k1's average "
                 "gradient is 0; k3's is that of KL(π_ref‖π_θ). gradient_table(run, 1, 0.7) shows it."),
          context=("run",), needs=("step1",), default_run=RUN)
def _e6(run=None) -> set[str]:
    from ppolab.numbers.kl import gradient_table

    _distinct_policies(run)
    table = gradient_table(_run(run), 1, T_THETA)
    return {name for name, row in table.items() if row["to KL(θ‖ref)"] < 1e-6}


def e1_case(run=None) -> dict:
    """Exercise 08.1's step: recorded step 3, or the run's first recorded step; with its number of rows, the run's
    reward-side ``estimator`` and the ``other`` one the exercise asks for (k3 = low_var_kl, or k1 = kl for a run that
    already uses k3): the log holds the run's own statistic, not the other one."""
    from ppolab.algos.kl import canonical_kl_name

    r = _run(run)
    c = recorded_step_case(run, 3, default=RUN)
    own = r.ppo_config().algorithm.kl_penalty
    other = "kl" if canonical_kl_name(own) in ("k3", "k3+") else "low_var_kl"
    return {**c, "rows": int(r.step(c["step"]).tensors["responses"].shape[0]), "estimator": own, "other": other}


@exercise("08.1", "Recompute actor/reward_kl_penalty of recorded step {step} — the KL statistic apply_kl_penalty "
          "fed the adaptive controller — from the recorded old_log_probs, ref_log_prob and the right mask, with the "
          "run's estimator ({estimator}), and compare yours with the log. Then answer what a run with "
          "algorithm.kl_penalty = {other} would have fed the controller at that step, from the same tensors.",
          kind="compute",
          hints=("Stage 7 applies the reward KL BEFORE rejection sampling rewrites response_mask: which recorded mask "
                 "is the one it saw? And verl averages per sequence first, then over every row of the batch. Only "
                 "the estimator changes in the answer; the mask and the averaging stay.",
                 "kld = kl_penalty(old_log_probs, ref_log_prob, '{other}') * loss_mask; "
                 "torch.mean(masked_mean(kld, loss_mask, axis=-1)) over all {rows} rows, padding rows (0) included "
                 "(verl ray_trainer.py::apply_kl_penalty, chapter §7.1)."),
          rel=1e-5, abs=1e-9, context=("run",), needs=("kl_in_reward", "reference"), case=e1_case, default_run=RUN)
def _e8(run=None) -> float:
    # float32 tensors summed in another order (a learner may work in float64): agreement to ~1e-7 relative
    c = e1_case(run)
    return reward_kl_statistic(run, c["step"], kl_penalty=c["other"])


def e2_case(run=None) -> dict:
    """Exercise 08.2's step: a recorded step where the adaptive controller is proportional (the error
    KL/target − 1 inside ±0.2, not clipped) and the next step logged β — step 3 of ppo_fire_tiny — and the
    ``what_if`` horizon the exercise asks about: half the run's (the log holds β at the run's own)."""
    c = proportional_kl_case(run, 3, default=RUN)
    half = c["horizon"] / 2
    return {**c, "what_if": int(half) if float(half).is_integer() else half}


def next_beta(run=None, step: int | None = None, mask: str = "loss_mask", real_rows_only: bool = False,
              n_steps: int | None = None, horizon: float | None = None, target_kl: float | None = None) -> float:
    """β after the controller's update at recorded step ``step``: AdaptiveKLController started at the β that step
    used (its logged actor/reward_kl_penalty_coeff), updated with :func:`reward_kl_statistic` recomputed from the
    step's tensors and ``n_steps`` (default: the step's rows, padding rows included), as
    ray_trainer.py::apply_kl_penalty does; with the run's ``horizon`` and ``target_kl`` unless others are given."""
    r = _run(run)
    s = e2_case(r)["step"] if step is None else step
    ctrl_cfg = r.ppo_config().algorithm.kl_ctrl
    beta = float(r.metrics.loc[s, "actor/reward_kl_penalty_coeff"])
    target = ctrl_cfg.target_kl if target_kl is None else target_kl
    ctrl = algos.AdaptiveKLController(init_kl_coef=beta, target_kl=float(target),
                                      horizon=float(ctrl_cfg.horizon if horizon is None else horizon))
    rows = int(r.step(s).tensors["responses"].shape[0]) if n_steps is None else n_steps
    ctrl.update(current_kl=reward_kl_statistic(r, s, mask=mask, real_rows_only=real_rows_only), n_steps=rows)
    return ctrl.value


@exercise("08.2", "Predict, then verify: recorded step {step} used the β logged as its "
          "actor/reward_kl_penalty_coeff and then fed the adaptive controller the KL statistic of 08.1 (the run's "
          "own estimator). From the step's tensors and the run's algorithm.kl_ctrl (target_kl {target_kl}, horizon "
          "{horizon}) compute the β the reward-side penalty of step {next} uses, and check it against the log. Then "
          "answer: which β would step {next} use had algorithm.kl_ctrl.horizon been {what_if}?",
          kind="predict",
          hints=("Is the error KL/target − 1 of this step inside ±0.2? Then nothing is clipped and the size of the "
                 "KL matters, not just its sign. n_steps counts the rows apply_kl_penalty saw — padding rows too. "
                 "The horizon divides the step the controller takes, not the error.",
                 "β_{next} = β_{step} · (1 + clip(KL / target_kl − 1, −0.2, 0.2) · n_steps / {what_if}), KL = your "
                 "08.1 statistic with the run's estimator (loss_mask: the mask before rejection sampling), n_steps = "
                 "{rows} rows — AdaptiveKLController(β_{step}, target_kl, {what_if}).update(KL, n_steps) (verl "
                 "core_algos.py::AdaptiveKLController.update, chapter §7.1)."),
          rel=1e-7, abs=1e-12, context=("run",), needs=("adaptive_kl", "reference"), case=e2_case, default_run=RUN)
def _e2_beta(run=None) -> float:
    # the KL is a float32 statistic recomputed in another order (~1e-7 relative); inside the proportional band it
    # moves β by e·n/horizon, so β agrees to ~1e-9 relative: rel 1e-7 still refuses n = 60 rows (3.7e-4 off)
    return next_beta(run, horizon=e2_case(run)["what_if"])


def e3_case(run=None) -> dict:
    """Exercise 08.3's what-if: 08.2's step with a target_kl ten times the run's, so that the error KL/target − 1
    lies far below −0.2 and the controller's clip acts (at the run's own target it does not)."""
    c = e2_case(run)
    return {**c, "what_if": round(10 * float(c["target_kl"]), 12)}


@exercise("08.3", "The controller's clip on the same step: recorded step {step} of 08.2, its KL statistic, its β and "
          "its rows, at the run's horizon {horizon} — but had algorithm.kl_ctrl.target_kl been {what_if} instead of "
          "{target_kl}, which β would step {next} use?",
          kind="compute",
          hints=("Compute the error KL/target − 1 at the new target first: it is far outside ±0.2, so the clip acts "
                 "and only its sign survives. n_steps is still the rows apply_kl_penalty saw, padding rows too.",
                 "β_{next} = β_{step} · (1 + clip(KL / {what_if} − 1, −0.2, 0.2) · n_steps / {horizon}) with your 08.1 "
                 "KL (loss_mask) — AdaptiveKLController(β_{step}, {what_if}, {horizon}).update(KL, n_steps) (chapter "
                 "§7.1)."),
          rel=1e-7, abs=1e-12, context=("run",), needs=("adaptive_kl", "reference"), case=e3_case, default_run=RUN)
def _e3_beta(run=None) -> float:
    return next_beta(run, target_kl=e3_case(run)["what_if"])
