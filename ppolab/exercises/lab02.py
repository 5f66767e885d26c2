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

    from ppolab.batch import Batch
    from ppolab.trainer import PPOTrainer
    from ppolab.run.reader import resolve_run

    r = resolve_run(run, default="grpo_tiny_vllm_bf16")
    rec = r.step(r.steps[0])
    raw = r.ppo_config()
    cfg = replace(raw, algorithm=replace(raw.algorithm, rollout_correction=replace(
        raw.algorithm.rollout_correction, bypass_mode=True)))
    produced_later = ("old_log_probs", "entropy", "rollout_is_weights", "token_level_rewards", "advantages",
                      "returns")
    batch = Batch({k: v.clone() for k, v in rec.batch_tensors().items() if k not in produced_later})
    if "loss_mask" in rec.tensors:   # response_mask as stage 7 found it: rejection sampling rewrote it there
        batch["response_mask"] = rec.tensors["loss_mask"].clone()
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


def first_step_case(run=None, default: str = "grpo_tiny_vllm_bf16") -> dict:
    """The first recorded step of ``run`` (the step bypass_stages replays)."""
    from ppolab.run.reader import resolve_run

    return {"step": resolve_run(run, default=default).steps[0]}


@exercise("02.1", "Bypass mode, stage 4: had the vLLM run set algorithm.rollout_correction.bypass_mode=true, what "
                  "actor/ppo_kl would compute_policy_loss_vanilla report at optimizer step 0 of recorded step {step} "
                  "(one call on all that optimizer step's rows)? Decoupled mode reports 0 there. (a signed number)",
          kind="compute",
          hints=("actor/ppo_kl is the mean of (old − log_prob) over the valid tokens, with whatever tensor is the "
                 "anchor. In bypass mode stage 4 runs no forward pass: which tensor the batch already holds becomes "
                 "old_log_probs? At optimizer step 0 log_prob is still the trainer's π_old.",
                 "masked_mean(rollout_log_probs[rows] − actor_log_probs[0][rows], response_mask[rows]) with rows "
                 "where actor_log_probs[0] is not NaN — verl trainer_base.py::_compute_old_log_prob sets "
                 "old_log_probs := rollout_log_probs in bypass mode."),
          rel=1e-4, abs=1e-8, context=("run",), needs=("rollout_gap",), case=first_step_case,
          default_run="grpo_tiny_vllm_bf16")
def _e1(run=None) -> float:
    from ppolab.numbers import actor_config, resolve_run
    from ppolab.numbers.steps import optimizer_step_batch

    recorded, batch, _ = bypass_stages(run)        # the trainer's own stages 4 and 7, in bypass mode
    r = resolve_run(run, default="grpo_tiny_vllm_bf16")
    b = optimizer_step_batch(r.step(r.steps[0]), 0)
    old = batch["old_log_probs"][b["rows"]].float()
    _, metrics = algos.compute_policy_loss_vanilla(old, b["log_prob"], b["advantages"], b["response_mask"],
                                                   config=actor_config(r))
    return metrics["actor/ppo_kl"]


def _tokens_in_loss(tensors, response_mask) -> int:
    real = ~tensors["is_pad"].bool() if "is_pad" in tensors else torch.ones(response_mask.shape[0], dtype=torch.bool)
    return int(response_mask[real].sum())


@exercise("02.2", "Bypass mode, stage 7: ppo_fire_tiny trained in decoupled mode with rejection sampling "
                  "(rollout_rs). Had it set bypass_mode=true, how many MORE response tokens would enter the actor "
                  "loss of recorded step {step} (response_mask = 1, real rows)?",
          kind="compute",
          hints=("In bypass mode stage 7 skips the whole rollout correction (verl trainer_base.py): no IS weights, "
                 "and no rejection sampling either. Which tokens did rejection sampling take out of response_mask? "
                 "loss_mask is the copy of response_mask made at generation, before stage 7.",
                 "the tokens rejection zeroed: int((t['loss_mask'].bool() & ~t['response_mask'].bool())[real].sum()) "
                 "with real = ~t['is_pad'].bool() (ppolab PPOTrainer.compute_advantage skips the correction in "
                 "bypass mode)."),
          context=("run",), needs=("rejection",), case=lambda run=None: first_step_case(run, "ppo_fire_tiny"),
          default_run="ppo_fire_tiny")
def _e2(run=None) -> int:
    from ppolab.run.reader import resolve_run

    r = resolve_run(run, default="ppo_fire_tiny")
    recorded, batch, _ = bypass_stages(r)          # stage 7 in bypass mode: response_mask as generated
    return _tokens_in_loss(recorded, batch["response_mask"]) - _tokens_in_loss(recorded, recorded["response_mask"])


def bypass_first_ratio(run=None, step: int | None = None) -> torch.Tensor:
    """exp(clamp(actor_log_probs[0] − rollout_log_probs, ±20)) on the valid tokens of optimizer step 0's rows:
    the ratio bypass mode's vanilla loss would have seen at the first optimizer step."""
    from ppolab.run.reader import resolve_run

    r = resolve_run(run, default="grpo_tiny_vllm_bf16")
    rec = r.step(r.steps[0] if step is None else step)
    t = rec.tensors
    lp = t["actor_log_probs"][0]
    rows = rec.opt_step(0).rows()
    terms = algos.ppo_clip_terms(t["rollout_log_probs"][rows], lp[rows], t["advantages"][rows], 0.2, 0.2)
    return terms["ratio"][t["response_mask"][rows].bool()]


@exercise("02.3", "Predict, then verify: on the vLLM bf16 run, recorded step 1, optimizer step 0, the decoupled "
                  "ratio π_θ/π_old is 1 on every token. With bypass mode the denominator is π_rollout instead: what "
                  "is the largest |r − 1| over the valid tokens of that optimizer step's rows? (4 decimals)",
          kind="predict",
          hints=("At optimizer step 0 the actor has not moved yet: π_θ equals the trainer's π_old, so the bypass "
                 "ratio is π_old/π_rollout on those tokens — the bf16 training–inference gap, as a ratio.",
                 "r = exp(clamp(actor_log_probs[0] − rollout_log_probs, ±20)) on the rows where actor_log_probs[0] "
                 "is not NaN, masked by response_mask; answer (r − 1).abs().max()."),
          rel=0.0, abs=5.1e-5, context=("run",), needs=("rollout_gap",), default_run="grpo_tiny_vllm_bf16")
def _e3(run=None) -> float:
    return (bypass_first_ratio(run) - 1).abs().max().item()


@exercise("02.4", "In the last recorded step, what is the largest PPO ratio π_θ/π_old over the valid response "
                  "tokens of the LAST optimizer step? (4 decimals)",
          kind="compute",
          hints=("π_θ of optimizer step k is actor_log_probs[k] (NaN on rows outside its mini-batch); π_old is "
                 "old_log_probs. The clip bounds the loss, not the ratio: the ratio itself can exceed 1 + ε.",
                 "ppo_clip_terms(old_log_probs[rows], actor_log_probs[-1][rows], advantages[rows], 0.2, 0.2)"
                 "['ratio'], masked by response_mask[rows], then .max()."),
          rel=0.0, abs=5.1e-5, context=("run",))
def _e4(run=None) -> float:
    from ppolab.run.reader import resolve_run

    r = resolve_run(run)
    t = r.step(r.steps[-1]).tensors
    lp = t["actor_log_probs"][-1]
    m = t["response_mask"].bool() & ~torch.isnan(lp)
    return (lp - t["old_log_probs"])[m].max().exp().item()   # exp is monotone: exp of the largest log-ratio


@exercise("02.5", "The IS weights in the loss (§3, §5), a what-if: had algorithm.rollout_correction."
                  "rollout_is_threshold been {threshold} instead of the run's {run_threshold}, what would "
                  "actor/pg_loss of recorded step {step} of the vLLM run have been? Recompute the step's IS weights "
                  "at that threshold from its recorded log-probs, then the loss from its tensors the way the trainer "
                  "logs it (each optimizer step's token-mean, then the mean over the optimizer steps). Answer "
                  "(pg_loss at {threshold}) − (pg_loss with the run's own weights). (a signed number)",
          kind="compute",
          hints=("the weights are w = min(exp(old_log_probs − rollout_log_probs), C) per token (rollout_is=token; "
                 "detached, × response_mask); verl's compute_policy_loss_vanilla multiplies the per-token loss by "
                 "them after the clip and the dual clip, and the entropy and KL terms never see them. The run's own "
                 "weights are recorded as rollout_is_weights.",
                 "w_C = algos.rollout_is_weights(old, rollout, mask, 'token', C); for every optimizer step k: b = "
                 "optimizer_step_batch(rec, k); compute_policy_loss_vanilla(b['old_log_probs'], b['log_prob'], "
                 "b['advantages'], b['response_mask'], cfg.loss_agg_mode, cfg, w[b['rows']], global_batch_info="
                 "global_batch_info(run, rec, k)); average over k, once with w_C and once with the recorded weights, "
                 "then subtract."),
          rel=2e-5, abs=1e-7, context=("run",), case=lambda run=None: _is_case(run),
          default_run="grpo_tiny_vllm_bf16")
def _e5(run=None) -> float:
    from ppolab.numbers.rollout_is import pg_loss_is_what_if

    return pg_loss_is_what_if(run, _is_step(run))


def _is_case(run=None) -> dict:
    from ppolab.numbers.rollout_is import tighter_is_threshold
    from ppolab.run.reader import resolve_run

    r = resolve_run(run, default="grpo_tiny_vllm_bf16")
    s = _is_step(r)
    return {"step": s, "threshold": tighter_is_threshold(r, s),
            "run_threshold": r.ppo_config().algorithm.rollout_correction.rollout_is_threshold}


def _is_step(run=None) -> int:
    from ppolab.numbers.rollout_is import is_weighted_step

    return is_weighted_step(run)
