"""Lab 16 — nine common mistakes (chapter §16; §7 for the KL halves of mistake 9). Recorded data: ``ppo_fire_tiny``
(both KL paths on, adaptive β, synthetic padding rows, rejection sampling) unless an exercise names another run."""
from __future__ import annotations

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers.cases import padded_mini_batch_case, proportional_kl_case, rejection_case
from ppolab.numbers.steps import loss_mask_of_real_rows

#: The lab's run, and the recorded step its explorers open on.
RUN, STEP = "ppo_fire_tiny", 12
#: Exercise 16.5's optimizer step: the last one of recorded step 12, whose mini-batch holds the 4 synthetic padding
#: rows and a real row that rejection sampling emptied.
AGG_STEP, AGG_OPT = 12, 15


def grad_case(run=None) -> dict:
    """Exercise 16.7's step: :data:`STEP` if the run recorded it, else its last recorded step."""
    from ppolab.run.reader import resolve_run

    steps = resolve_run(run, default=RUN).steps
    return {"step": STEP if STEP in steps else steps[-1]}


#: Exercise 16.2's step: step 3 → 4 of ppo_fire_tiny, where KL/target ≈ 1.02 — the controller is proportional, so
#: the mask and the row count it is fed both move β (at step 12 the error is clipped and they would not).
BETA_STEP = 3


def beta_case(run=None) -> dict:
    """Exercise 16.2's step: :data:`BETA_STEP`, or the first recorded step where the adaptive controller is
    proportional (``proportional_kl_case``: |KL/target − 1| < 0.2) and the next step logged β."""
    return proportional_kl_case(run, BETA_STEP, default=RUN)


def rejected_case(run=None) -> dict:
    """Exercise 16.3's (step, optimizer step): the lab's, or the one whose mini-batch holds the most rejected
    tokens."""
    return rejection_case(run, (STEP, 14), default=RUN)


def agg_case(run=None) -> dict:
    """Exercise 16.5's (step, optimizer step): the lab's, or the first whose mini-batch holds padding rows."""
    return padded_mini_batch_case(run, (AGG_STEP, AGG_OPT), default=RUN)


@exercise("16.1", "Mistake 2 yourself: on the run's last recorded step, the token-mean k1 reference KL of the rollout "
                  "batch — old_log_probs against ref_log_prob over every real response token of response_mask "
                  "(5 significant digits).",
          kind="compute",
          hints=("Which two policies does the reward-side path compare? Both are stored on the step (π_old from "
                 "stage 4, π_ref from stage 5); mask out padding positions and synthetic padding rows.",
                 "masked_mean(kl_penalty(old_log_probs, ref_log_prob, 'k1'), response_mask × real_rows) — k1 is "
                 "log π_old − log π_ref."),
          rel=1e-5, abs=1e-9, context=("run",), needs=("reference",), default_run=RUN)
def _e1(run=None) -> float:
    from ppolab.numbers import real_rows, resolve_run

    r = resolve_run(run, default=RUN)
    rec = r.step(r.steps[-1])
    t = rec.tensors
    mask = t["response_mask"].float() * real_rows(rec).float().unsqueeze(-1)
    return algos.masked_mean(algos.kl_penalty(t["old_log_probs"], t["ref_log_prob"], "k1"), mask).item()


@exercise("16.4", "Predict, then verify — mistake 5 in a config: data.train_batch_size=128, rollout.n=4, one GPU, "
                  "ppo_micro_batch_size_per_gpu=8, ppo_epochs=1. A colleague wants 64 trajectories per optimizer "
                  "step and, forgetting the × n, sets ppo_mini_batch_size=64. How many optimizer steps does the "
                  "trainer then take per training step, how many trajectories does each see, and which "
                  "ppo_mini_batch_size gives the 64 they wanted? Answer (optimizer steps, trajectories per optimizer "
                  "step, ppo_mini_batch_size).",
          kind="predict",
          hints=("The trainer multiplies ppo_mini_batch_size by rollout.n before it cuts the batch (verl "
                 "trainer_base.py::_update_actor): the colleague's 64 are prompts, not trajectories.",
                 "plan_batches(128, 4, 64, 1, 8, 1).optimizer_steps and .global_mini_batch; the wanted size is "
                 "the M with M × 4 = 64."))
def _e4() -> tuple[int, int, int]:
    from ppolab.batching import plan_batches

    plan = plan_batches(128, 4, 64, 1, 8, 1)
    # the ppo_mini_batch_size (a divisor of the 128 prompts) whose global mini-batch is 64 trajectories
    wanted = next(m for m in range(1, 129)
                  if 128 % m == 0 and plan_batches(128, 4, m, 1, None, 1).global_mini_batch == 64)
    return plan.optimizer_steps, plan.global_mini_batch, wanted


@exercise("16.6", "Mistake 9, reward side: on the last recorded step of the run (trained with the reward-side "
                  "KL, kl_penalty = kl), find β* at which the mean penalty per trajectory, β·Σ_t KL_t, equals the "
                  "mean score per trajectory — over the tokens the trainer shaped, loss_mask (real trajectories; "
                  "4 significant digits).",
          kind="compute",
          hints=("The penalty is linear in β, so β* is a ratio of two means over trajectories. Sum the token "
                 "KL over each trajectory first — the score is one number per trajectory too. The penalty is applied "
                 "before rejection sampling rewrites response_mask, so it covers every token of loss_mask.",
                 "β* = mean_i Σ_t token_level_scores / mean_i Σ_t kl_penalty(old_log_probs, ref_log_prob, 'kl')"
                 "·loss_mask over the real rows (kl_drowning's penalty_mean at β = 1 is the denominator)."),
          rel=1e-4, abs=1e-9, context=("run",), needs=("kl_in_reward", "reference"), default_run=RUN)
def _e6(run=None) -> float:
    from ppolab.numbers import real_rows, resolve_run

    r = resolve_run(run, default=RUN)
    rec = r.step(r.steps[-1])
    t, real = rec.tensors, real_rows(rec)
    kld = (algos.kl_penalty(t["old_log_probs"], t["ref_log_prob"], r.ppo_config().algorithm.kl_penalty)
           * loss_mask_of_real_rows(rec))
    return float(t["token_level_scores"].sum(-1)[real].mean() / kld.sum(-1)[real].mean())


@exercise("16.7", "Mistake 9, loss side: on the last optimizer step of recorded step {step} of the run, at "
                  "which kl_loss_coef c does the KL term's gradient with respect to the token log-probs, "
                  "‖∂(c·kl_loss)/∂log π‖, equal the policy loss's, ‖∂pg_loss/∂log π‖? (2 decimals)",
          kind="compute",
          hints=("The KL term's gradient is linear in c; read grad_ratio off the table for any c and scale. The "
                 "value ratio (loss_ratio) is another question.",
                 "c* = ‖∂pg_loss/∂log π‖ / ‖∂kl_loss/∂log π‖ = c / grad_ratio(c) in "
                 "kl_term_vs_policy_gradient(RUN, step={step})."),
          rel=0.0, abs=5e-3, context=("run",), needs=("kl_loss", "reference"), case=grad_case, default_run=RUN)
def _e7(run=None) -> float:
    from ppolab.numbers.mistakes import kl_term_vs_policy_gradient

    import math

    from ppolab.numbers import RunLacks
    from ppolab.run.reader import resolve_run

    ratio = float(kl_term_vs_policy_gradient(run, step=grad_case(run)["step"], coefs=(1.0,)).loc[1.0, "grad_ratio"])
    if not math.isfinite(ratio) or ratio == 0:  # all advantages 0, or π_θ = π_ref: no crossing to find
        raise RunLacks("a policy-loss gradient and a KL-term gradient that are both non-zero",
                       resolve_run(run, default=RUN))
    return 1.0 / ratio


@exercise("16.8", "Predict, then verify: in the run (default grpo_tiny), what share of the real responses contains the "
                  "answer format '#### ' at the first recorded step, and at the last? Answer (first, last), "
                  "3 decimals.",
          kind="predict",
          hints=("The reward pays only for '#### <the right number>'. What does π_ref (the start) do, and where "
                 "does a policy go that nothing holds near π_ref?",
                 "reference_drift(run)['format_share'] at the first and the last recorded step: the share of "
                 "rec.info['texts']['responses'] of the real rows that contain '#### '."),
          rel=0.0, abs=5e-4, context=("run",))
def _e8(run=None) -> tuple[float, float]:
    from ppolab.numbers.mistakes import reference_drift

    share = reference_drift(run)["format_share"]
    return float(share.iloc[0]), float(share.iloc[-1])


def beta_next(run=None, mask: str = "loss_mask", drop_padding: bool = False) -> float:
    """β of step ``next`` as the trainer computes it from step ``step`` (``mask="loss_mask"``, every row), or as a
    mistaken model does: the KL averaged over another mask, or with the synthetic padding rows left out (of the
    batch mean and of n). One call of ``algos.apply_kl_penalty`` on the recorded tensors, then the controller's
    value."""
    from ppolab.run.reader import resolve_run

    r = resolve_run(run, default=RUN)
    step = beta_case(r)["step"]
    t, alg = r.step(step).tensors, r.ppo_config().algorithm
    rows = ~t["is_pad"].bool() if drop_padding else torch.ones(t["responses"].shape[0], dtype=torch.bool)
    ctrl = algos.AdaptiveKLController(float(r.metrics.loc[step, "actor/reward_kl_penalty_coeff"]),
                                      alg.kl_ctrl.target_kl, alg.kl_ctrl.horizon)
    algos.apply_kl_penalty(t["token_level_scores"][rows].float(), t["old_log_probs"][rows].float(),
                           t["ref_log_prob"][rows].float(), t.get(mask, t["response_mask"])[rows].float(), ctrl,
                           alg.kl_penalty)
    return float(ctrl.value)


@exercise("16.2", "Predict, then verify — mistake 3's reward side moves, and two ways to get it wrong: at step {step} "
                  "the run's adaptive controller (target_kl {target_kl}, horizon {horizon}) is proportional — "
                  "KL/target is within ±0.2 of 1, so the error is not clipped. From step {step}'s recorded tensors, "
                  "what β would a colleague predict for step {next} (a) who averages the KL over response_mask (the "
                  "mask after rejection sampling) instead of loss_mask, and (b) who leaves the synthetic padding "
                  "rows out of the batch mean and out of n? Answer (β with response_mask, β without the padding "
                  "rows), 4 significant digits each.",
          kind="predict",
          hints=("The trainer's own β of step {next} is logged (actor/reward_kl_penalty_coeff): each mistake moves "
                 "it a little, because β ← β·(1 + e·n/horizon) with e = KL/target − 1 unclipped here. Mistake (a) "
                 "changes the KL; mistake (b) changes both the KL (a mean over fewer rows) and n.",
                 "(a) apply_kl_penalty(token_level_scores, old_log_probs, ref_log_prob, response_mask, "
                 "AdaptiveKLController(β_{step}, {target_kl}, {horizon}), 'kl') on run.step({step}), then .value; "
                 "(b) the same with loss_mask on the rows with is_pad == 0 only (n = the real rows)."),
          rel=1e-4, abs=1e-9, context=("run",), needs=("adaptive_kl", "reference"), case=beta_case, default_run=RUN)
def _e2(run=None) -> tuple[float, float]:
    return beta_next(run, mask="response_mask"), beta_next(run, drop_padding=True)


@exercise("16.3", "Mistake 4's denominator: on recorded step {step}, optimizer step {opt_step}, the engine divides "
                  "every "
                  "micro-batch's token sum by batch_num_tokens = Σ loss_mask over the global mini-batch. How many of "
                  "those tokens carry no loss, because rejection sampling zeroed them in response_mask?",
          kind="compute",
          hints=("Rejection sampling (rollout_rs) rewrites response_mask before the advantage, but loss_mask is the "
                 "copy made at rollout: the loss's numerator loses the rejected tokens, the denominator keeps them.",
                 "Σ loss_mask − Σ response_mask over the rows of optimizer_step_batch(run.step("
                 "{step}), {opt_step}) (real rows) — reproduce('micro_is_not_the_batch', RUN, {step}, {opt_step})"
                 ".details."),
          context=("run",), needs=("rejection",), case=rejected_case, default_run=RUN)
def _e3(run=None) -> int:
    from ppolab.numbers import optimizer_step_batch, resolve_run

    c = rejected_case(run)
    rec = resolve_run(run, default=RUN).step(c["step"])
    b = optimizer_step_batch(rec, c["opt_step"])
    return int(loss_mask_of_real_rows(rec)[b["rows"]].sum() - b["response_mask"].sum())


@exercise("16.5", "Predict, then verify — mistake 7 with padding rows: on recorded step {step}, optimizer step "
                  "{opt_step} (its mini-batch holds the {n_pad} synthetic padding rows), in seq-mean-token-mean with "
                  "the "
                  "trainer's global_batch_size = ppo_mini_batch_size × n = {gbs}, what total weight do the real "
                  "trajectories carry in the loss? (4 decimals)",
          kind="predict",
          hints=("Every trajectory with at least one token in the loss weighs 1/global_batch_size, and the count "
                 "includes the padding rows. Does every real row still have a token? Rejection sampling can empty a "
                 "whole row (seq_max_k2).",
                 "(number of rows of the mini-batch with Σ_t response_mask > 0) / {gbs} — or the sum of the weights "
                 "reproduce('agg_mode_weights', RUN, {step}, {opt_step}).pair[1] (its details: "
                 "seq_mean_weight_sum)."),
          rel=0.0, abs=5e-5, context=("run",), needs=("padding_rows",), case=agg_case, default_run=RUN)
def _e5(run=None) -> float:
    from ppolab.numbers import optimizer_step_batch, resolve_run

    r = resolve_run(run, default=RUN)
    c = agg_case(r)
    rec = r.step(c["step"])
    b = optimizer_step_batch(rec, c["opt_step"])
    x = torch.ones_like(b["response_mask"], requires_grad=True)
    gbs = rec.opt_step(c["opt_step"]).step.global_batch_size  # the trainer's, from the step's plan
    algos.agg_loss(x, b["response_mask"], "seq-mean-token-mean", global_batch_size=gbs).backward()
    return float((x.grad * b["response_mask"]).sum())
