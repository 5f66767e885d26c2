"""Lab 02 — the four policies, rollout correction and bypass mode (chapter §2, §2.1, §2.2)."""
from __future__ import annotations

import torch

from ppolab import algos
from ppolab.exercises import exercise


def bypass_stages(run=None):
    """Stages 4 and 7 of ``ppolab.trainer.PPOTrainer`` run on recorded step 1 of ``run`` (default: the vLLM bf16
    run, which trained with ``rollout_is=token``) with ``algorithm.rollout_correction.bypass_mode=true``.
    Returns (the recorded tensors, the batch after stage 7, the config)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from ppolab.engine import Batch
    from ppolab.trainer import PPOTrainer
    from ppolab.record import resolve_run

    r = resolve_run(run, default="grpo_tiny_vllm_bf16")
    rec = r.step(r.steps[0])
    raw = r.ppo_config()
    cfg = replace(raw, algorithm=replace(raw.algorithm, rollout_correction=replace(
        raw.algorithm.rollout_correction, bypass_mode=True)))
    produced_later = ("old_log_probs", "entropy", "rollout_is_weights", "token_level_rewards", "advantages",
                      "returns", "actor_log_probs", "critic_vpreds")
    batch = Batch({k: v.clone() for k, v in rec.tensors.items() if k not in produced_later})
    trainer = SimpleNamespace(config=cfg, kl_ctrl_in_reward=_reward_kl_controller(r, rec.step),
                              verl_data=PPOTrainer.verl_data)
    batch, _ = PPOTrainer.compute_old_log_prob(trainer, batch)
    batch, _ = PPOTrainer.compute_advantage(trainer, batch)
    return rec.tensors, batch, cfg


def _reward_kl_controller(r, step: int):
    """A fixed controller at the β the run's reward-side KL used at ``step`` (None without a reward-side KL): stage
    7 replayed once needs that β, not a controller that moves."""
    alg = r.ppo_config().algorithm
    if not alg.use_kl_in_reward:
        return None
    m = r.metrics
    col = "actor/reward_kl_penalty_coeff"
    beta = float(m.loc[step, col]) if col in m.columns and step in m.index else float(alg.kl_ctrl.kl_coef)
    return algos.FixedKLController(kl_coef=beta)


@exercise("02.1", "With algorithm.rollout_correction.bypass_mode=true (and rollout_is=token, as the vLLM run had): "
                  "(a) which recorded tensor becomes old_log_probs, the denominator of the PPO ratio, and (b) does "
                  "stage 7 still add rollout_is_weights? Answer (field name, True/False).",
          hints=("In bypass mode stage 4 runs no forward pass: the anchor is a tensor the batch already holds. "
                 "Once old and rollout are the same tensor, is there a gap left for IS weights to correct?",
                 "V1 stage 4: old_log_probs := rollout_log_probs; stage 7 skips the rollout correction in bypass "
                 "mode (verl trainer_base.py; ppolab PPOTrainer.compute_old_log_prob / compute_advantage)."),
          context=("run",), default_run="grpo_tiny_vllm_bf16")
def _e1(run=None) -> tuple[str, bool]:
    recorded, batch, _ = bypass_stages(run)
    anchor = [k for k in sorted(recorded) if k != "old_log_probs" and recorded[k].shape == batch["old_log_probs"]
              .shape and recorded[k].dtype == batch["old_log_probs"].dtype
              and torch.equal(recorded[k], batch["old_log_probs"])]
    return anchor[0], "rollout_is_weights" in batch


@exercise("02.2", "You set algorithm.rollout_correction.bypass_mode=true and leave the actor's config alone. Which "
                  "actor_rollout_ref.actor.policy_loss.loss_mode computes the actor loss in verl V1 (and ppolab)?",
          hints=("verl registers a policy loss named bypass_mode, and the legacy trainer (≤ 0.8) switched to it. "
                 "Does the V1 trainer touch the actor's policy_loss config at all?",
                 "V1 only replaces old_log_probs; policy_loss.loss_mode keeps its configured value (the default "
                 "is vanilla), and algorithm.rollout_correction.loss_type is not propagated to the actor."),
          context=("run",), default_run="grpo_tiny_vllm_bf16")
def _e2(run=None) -> str:
    _, _, cfg = bypass_stages(run)       # stages 4 and 7 ran in bypass mode; the actor config after them:
    return cfg.actor_rollout_ref.actor.policy_loss.loss_mode


def bypass_first_ratio(run=None, step: int | None = None) -> torch.Tensor:
    """exp(clamp(actor_log_probs[0] − rollout_log_probs, ±20)) on the valid tokens of optimizer step 0's rows:
    the ratio bypass mode's vanilla loss would have seen at the first optimizer step."""
    from ppolab.record import resolve_run

    r = resolve_run(run, default="grpo_tiny_vllm_bf16")
    t = r.step(r.steps[0] if step is None else step).tensors
    lp = t["actor_log_probs"][0]
    rows = ~torch.isnan(lp).all(dim=-1)
    terms = algos.ppo_clip_terms(t["rollout_log_probs"][rows], lp[rows], t["advantages"][rows], 0.2, 0.2)
    return terms["ratio"][t["response_mask"][rows].bool()]


@exercise("02.3", "Predict, then verify: on the vLLM bf16 run, recorded step 1, optimizer step 0, the decoupled "
                  "ratio π_θ/π_old is 1 on every token. With bypass mode the denominator is π_rollout instead: what "
                  "is the largest |r − 1| over the valid tokens of that optimizer step's rows? (3 decimals)",
          hints=("At optimizer step 0 the actor has not moved yet: π_θ equals the trainer's π_old, so the bypass "
                 "ratio is π_old/π_rollout on those tokens — the bf16 training–inference gap, as a ratio.",
                 "r = exp(clamp(actor_log_probs[0] − rollout_log_probs, ±20)) on the rows where actor_log_probs[0] "
                 "is not NaN, masked by response_mask; answer (r − 1).abs().max()."),
          rel=0.0, abs=5.1e-4, context=("run",), needs=("rollout_gap",), default_run="grpo_tiny_vllm_bf16")
def _e3(run=None) -> float:
    return (bypass_first_ratio(run) - 1).abs().max().item()


@exercise("02.4", "In the last recorded step, what is the largest PPO ratio π_θ/π_old over the valid response "
                  "tokens of the LAST optimizer step? (4 decimals)",
          hints=("π_θ of optimizer step k is actor_log_probs[k] (NaN on rows outside its mini-batch); π_old is "
                 "old_log_probs. The clip bounds the loss, not the ratio: the ratio itself can exceed 1 + ε.",
                 "ppo_clip_terms(old_log_probs[rows], actor_log_probs[-1][rows], advantages[rows], 0.2, 0.2)"
                 "['ratio'], masked by response_mask[rows], then .max()."),
          rel=0.0, abs=5.1e-5, context=("run",))
def _e4(run=None) -> float:
    from ppolab.record import resolve_run

    r = resolve_run(run)
    t = r.step(r.steps[-1]).tensors
    lp = t["actor_log_probs"][-1]
    m = t["response_mask"].bool() & ~torch.isnan(lp)
    return (lp - t["old_log_probs"])[m].max().exp().item()   # exp is monotone: exp of the largest log-ratio
