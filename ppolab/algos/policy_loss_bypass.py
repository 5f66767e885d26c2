"""``loss_mode=bypass_mode``: two policies instead of three (chapter §2.2, §5.1–5.2; verl `core_algos.py`).

In bypass mode the trainer skips the old-log-prob forward and hands the *rollout* log-probs in as
``old_log_prob``. The loss then computes the rollout correction itself, against the current log-probs
(IS ratio π_θ/π_rollout, rejection mask), and dispatches on ``policy_loss.rollout_correction.loss_type``:

* ``ppo_clip`` (default): the vanilla clipped loss on the rejection-modified mask, **without** IS weights — the
  PPO ratio already is π_θ/π_rollout, so weights would count the correction twice (they feed only metrics);
* ``reinforce``: L = −A·log π·w (w = the IS weights, or none), no ratio and no clip.

Shapes: all (bs, T).
"""
from __future__ import annotations

import torch

from ppolab.algos.aggregation import GlobalBatchInfo, agg_loss, batch_info_kwargs
from ppolab.algos.correction_metrics import rollout_correction_and_rejection_mask
from ppolab.algos.masked import masked_mean
from ppolab.algos.policy_loss import _float, compute_policy_loss_vanilla, register_policy_loss


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE with optional IS correction, the ``reinforce`` branch of bypass mode — *not* a registry entry
    (chapter §5.1; verl `core_algos.py::compute_policy_loss_reinforce`).

        L = −A · log π_θ · w      (w = detached IS weights π_θ/π_rollout, or 1)

    Shapes: all (bs, T) → (scalar, metrics). Aggregated with ``loss_agg_mode`` (its own default is
    ``seq-mean-token-sum``; bypass mode passes the actor's) and the global counts ``global_batch_info``.
    Metric ``actor/ppo_kl`` = masked mean of rollout − lp.
    """
    assert config is not None, "ActorConfig must be provided for REINFORCE loss"
    pg_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **batch_info_kwargs(config, global_batch_info))
    return pg_loss, {"actor/ppo_kl": _float(masked_mean(rollout_log_prob - log_prob, response_mask))}


def _get(cfg, key, default):
    return cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bypass-mode loss: correction computed here, then PPO-clip or REINFORCE (chapter §2.2; verl
    `core_algos.py::compute_policy_loss_bypass_mode`).

    ``old_log_prob`` must be the rollout log-probs. With rc = ``config.policy_loss.rollout_correction``:

        w, M' = rollout_correction_and_rejection_mask(lp, rollout, M, rc.rollout_is, rc.rollout_is_threshold,
                                                     rc.rollout_is_batch_normalize, rc.rollout_rs,
                                                     rc.rollout_rs_threshold)        (no gradient)
        ppo_clip:  vanilla(rollout, lp, A, M', rollout_is_weights=None)
        reinforce: −A·lp·w aggregated over M', plus actor/ppo_kl = masked mean of (rollout − lp) over M'

    The ``rollout_is_weights`` argument is ignored (the weights are recomputed against lp). Shapes: all (bs, T)
    → (scalar, metrics = the branch's ``actor/*`` plus every ``rollout_corr/*``). Raises ``ValueError`` when
    there is no rollout_correction config, for an unknown ``loss_type``, or when M has no valid token.
    """
    assert config is not None, "config is required for bypass_mode loss"
    pl = getattr(config, "policy_loss", None)
    rc = _get(pl, "rollout_correction", None) if pl is not None else None
    if rc is None:
        raise ValueError("rollout_correction config not found in policy_loss. "
                         "When using loss_mode='bypass_mode', ensure rollout_correction config is passed.")
    loss_type = _get(rc, "loss_type", "ppo_clip")
    rollout_log_prob = old_log_prob
    weights, mask, corr_metrics = rollout_correction_and_rejection_mask(
        log_prob.detach(), rollout_log_prob, response_mask,
        rollout_is=_get(rc, "rollout_is", None),
        rollout_is_threshold=_get(rc, "rollout_is_threshold", 2.0),
        rollout_is_batch_normalize=_get(rc, "rollout_is_batch_normalize", False),
        rollout_rs=_get(rc, "rollout_rs", None),
        rollout_rs_threshold=_get(rc, "rollout_rs_threshold", None),
    )
    if loss_type == "reinforce":
        pg_loss, metrics = compute_policy_loss_reinforce(rollout_log_prob, log_prob, advantages, mask, loss_agg_mode,
                                                         config, weights, global_batch_info=global_batch_info)
    elif loss_type == "ppo_clip":
        pg_loss, metrics = compute_policy_loss_vanilla(rollout_log_prob, log_prob, advantages, mask, loss_agg_mode,
                                                       config, None, global_batch_info=global_batch_info)
    else:
        raise ValueError(f"Invalid loss_type: {loss_type}. Must be 'reinforce' or 'ppo_clip'.")
    metrics.update(corr_metrics)
    return pg_loss, metrics
