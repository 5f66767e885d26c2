"""Rollout correction: truncated importance-sampling weights π_old/π_rollout (chapter §2–§3; facts §13).

The PPO ratio π_θ/π_old only limits how far the actor moves from its anchor; it does not correct for
the tokens having been sampled by the rollout engine's π_rollout (chapter §3). With
``algorithm.rollout_correction.rollout_is`` set, the trainer computes these weights once per step
(decoupled mode) and the policy loss multiplies them into the per-token loss *after* clipping;
entropy and the reference KL are not reweighted.
"""
from __future__ import annotations

import math

import torch

from ppolab.algos.masked import masked_mean, masked_sum

#: Log-ratio clamp before exp, as for the PPO ratio.
IS_LOG_RATIO_CLAMP = 20.0
ROLLOUT_IS_LEVELS = ("token", "sequence")


def _parse_threshold(threshold: float | str) -> tuple[float | None, float]:
    """``2.0`` → TIS (upper bound only); ``"0.5_5.0"`` → IcePop (lower, upper)."""
    if isinstance(threshold, str) and "_" in threshold:
        lo, hi = (float(x) for x in threshold.split("_"))
        return lo, hi
    return None, float(threshold)


@torch.no_grad()
def rollout_is_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    threshold: float | str = 2.0,
) -> torch.Tensor:
    """Truncated IS weights w ≈ π_old/π_rollout, detached, × mask (facts §13).

    log_ratio = old − rollout;
    token:    w_t = exp(clamp(log_ratio_t, ±20))
    sequence: w_i = exp(clamp(Σ_t log_ratio·m, ±20)), broadcast over the row.
    Then TIS: w = min(w, threshold); or IcePop (``"lo_hi"``): w = 0 outside [lo, hi].
    Shapes: (bs, T) → (bs, T).
    """
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is={level!r} is not valid; choose one of {', '.join(ROLLOUT_IS_LEVELS)}")
    log_ratio = old_log_probs - rollout_log_probs
    if level == "token":
        log_w = log_ratio
    else:
        log_w = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1).expand_as(log_ratio)
    weights = torch.exp(torch.clamp(log_w, -IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP)) * response_mask
    lo, hi = _parse_threshold(threshold)
    if lo is None:
        return torch.clamp(weights, max=hi)
    return torch.where((weights >= lo) & (weights <= hi), weights, torch.zeros_like(weights))


@torch.no_grad()
def rollout_corr_metrics(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> dict[str, float]:
    """Off-policy diagnostics between the rollout engine and the trainer (all ``rollout_corr/`` metrics).

    kl = mean(rollout − old) (k1 of KL(π_rollout‖π_old) on tokens sampled by π_rollout), k3_kl,
    training/rollout perplexity (exp of minus the per-sequence mean log-prob, averaged over rows),
    their log difference and ratio, chi2_token = E[ρ²] − 1 and chi2_seq over sequence ratios ρ = π_old/π_rollout.
    With ``weights``: their mean/max/min over valid tokens.
    """
    mask = response_mask.to(old_log_probs.dtype)
    log_ratio = torch.clamp(old_log_probs - rollout_log_probs, -IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP)
    rows = mask.sum(-1) > 0
    train_lp = masked_mean(old_log_probs, mask, axis=-1)[rows]
    roll_lp = masked_mean(rollout_log_probs, mask, axis=-1)[rows]
    seq_log_ratio = masked_sum(log_ratio, mask, axis=-1)[rows].clamp(-IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP)
    metrics = {
        "rollout_corr/kl": float(masked_mean(-log_ratio, mask)),
        "rollout_corr/k3_kl": float(masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)),
        "rollout_corr/training_ppl": float(torch.exp(-train_lp).mean()) if rows.any() else math.nan,
        "rollout_corr/rollout_ppl": float(torch.exp(-roll_lp).mean()) if rows.any() else math.nan,
        "rollout_corr/log_ppl_diff": float((roll_lp - train_lp).mean()) if rows.any() else math.nan,
        "rollout_corr/ppl_ratio": float(torch.exp(roll_lp - train_lp).mean()) if rows.any() else math.nan,
        "rollout_corr/chi2_token": float(masked_mean(torch.exp(2 * log_ratio), mask) - 1),
        "rollout_corr/chi2_seq": float(torch.exp(2 * seq_log_ratio).mean() - 1) if rows.any() else math.nan,
    }
    if weights is not None:
        valid = response_mask.bool()
        w = weights[valid]
        metrics.update(
            {
                "rollout_corr/rollout_is_mean": float(w.mean()) if w.numel() else math.nan,
                "rollout_corr/rollout_is_max": float(w.max()) if w.numel() else math.nan,
                "rollout_corr/rollout_is_min": float(w.min()) if w.numel() else math.nan,
            }
        )
    return metrics


@torch.no_grad()
def rollout_probs_diff(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                       response_mask: torch.Tensor) -> dict[str, float]:
    """``training/rollout_probs_diff_{max,mean,std}``: |π_old − π_rollout| in probability space over the valid
    tokens (chapter §2: how far the engine's policy is from the trainer's recomputation). Shapes (bs, T)."""
    diff = (old_log_probs.exp() - rollout_log_probs.exp()).abs()[response_mask.bool()]
    if diff.numel() == 0:
        return {}
    return {"training/rollout_probs_diff_max": float(diff.max()),
            "training/rollout_probs_diff_mean": float(diff.mean()),
            "training/rollout_probs_diff_std": float(diff.std()) if diff.numel() > 1 else 0.0}
