"""The one-call rollout correction of verl — IS weights, rejection mask and every ``rollout_corr/`` metric
(chapter §2–§3; verl `rollout_corr_helper.py::compute_rollout_correction_and_rejection_mask`).

``loss_mode=bypass_mode`` calls :func:`rollout_correction_and_rejection_mask` with the *current* log-probs in
the place of the old ones (IS ratio π_θ/π_rollout). The weights themselves come from
:func:`ppolab.algos.correction.rollout_is_weights` and the rejection from
:func:`ppolab.algos.correction.rollout_rejection_mask`; this module adds verl's optional batch normalisation
and the metrics exactly as verl names and computes them (``compute_is_metrics``, ``compute_offpolicy_metrics``).
Shapes: all (bs, T).
"""
from __future__ import annotations

import math

import torch

from ppolab.algos.correction import (IS_LOG_RATIO_CLAMP, parse_is_threshold, raw_is_weights, rollout_rejection_mask,
                                     truncate_is_weights)
from ppolab.algos.masked import masked_mean, masked_sum

PREFIX = "rollout_corr/"


def rollout_is_weight_metrics(weights: torch.Tensor, raw: torch.Tensor, log_ratio_for_metrics: torch.Tensor,
                              response_mask: torch.Tensor, level: str, upper: float,
                              lower: float | None = None) -> dict[str, float]:
    """verl's ``compute_is_metrics`` (keys without the ``rollout_corr/`` prefix): mean/max/min of the weights,
    the share of raw ratios above ``upper`` / below ``lower`` (1/upper for TIS), a std and the effective sample
    size of the weights clamped to [0, upper], and per-sequence statistics of the mean weight."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    lower = 1.0 / upper if lower is None else lower
    log_hi, log_lo = math.log(upper), math.log(lower)
    m: dict[str, float] = {}
    if level == "sequence":
        m["rollout_is_max"] = float(torch.exp(torch.clamp(log_ratio_for_metrics.max(), max=IS_LOG_RATIO_CLAMP)))
        m["rollout_is_min"] = float(torch.exp(log_ratio_for_metrics.min()))
        m["rollout_is_mean"] = float(masked_mean(weights, response_mask))
        m["rollout_is_ratio_fraction_high"] = float((log_ratio_for_metrics > log_hi).float().mean())
        m["rollout_is_ratio_fraction_low"] = float((log_ratio_for_metrics < log_lo).float().mean())
    else:
        valid = response_mask.bool()
        m["rollout_is_mean"] = float(masked_mean(weights, response_mask))
        m["rollout_is_ratio_fraction_high"] = float(masked_mean((raw > upper).float(), response_mask))
        m["rollout_is_ratio_fraction_low"] = float(masked_mean((raw < lower).float(), response_mask))
        m["rollout_is_max"] = float(weights.masked_fill(~valid, float("-inf")).max())
        m["rollout_is_min"] = float(weights.masked_fill(~valid, float("inf")).min())
    clamped = weights.clamp(min=0.0, max=upper)
    if response_mask.sum() > 1:
        var = masked_mean(clamped.square(), response_mask) - masked_mean(clamped, response_mask).square()
        m["rollout_is_std"] = float(torch.sqrt(torch.clamp(var, min=0.0)))
    else:
        m["rollout_is_std"] = 0.0
    normalized = clamped / (masked_mean(clamped, response_mask) + 1e-8)
    m["rollout_is_eff_sample_size"] = 1.0 / float(masked_mean(normalized.square(), response_mask))
    if weights.dim() > 1:
        seq = masked_mean(weights, response_mask, axis=-1)
        m["rollout_is_seq_mean"] = float(seq.mean())
        m["rollout_is_seq_std"] = float(seq.std()) if seq.numel() > 1 else 0.0
        m["rollout_is_seq_max"] = float(seq.max())
        m["rollout_is_seq_min"] = float(seq.min())
        m["rollout_is_seq_max_deviation"] = float((seq - 1.0).abs().max())
        raw_seq = masked_mean(raw, response_mask, axis=-1)
        m["rollout_is_seq_fraction_high"] = float((raw_seq > upper).float().mean())
        m["rollout_is_seq_fraction_low"] = float((raw_seq < lower).float().mean())
    return m


def batch_normalize_is_weights(weights: torch.Tensor, response_mask: torch.Tensor,
                               level: str) -> tuple[torch.Tensor, float]:
    """Divide IS weights by their batch mean (``rollout_is_batch_normalize``): the token mean for ``token``, the
    mean over non-empty rows of each row's token mean for ``sequence``; skipped (factor 1.0) if that mean is
    ≤ 1e-8. Local only — verl all-reduces the mean when torch.distributed is initialised. → (weights, factor)."""
    if level == "token":
        mean = masked_mean(weights, response_mask)
    else:
        seq = masked_mean(weights, response_mask, axis=-1)
        seq_mask = (response_mask.sum(dim=-1) > 0).to(weights.dtype)
        mean = (seq * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
    if mean > 1e-8:
        return weights / mean, float(mean)
    return weights, 1.0


def offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                      response_mask: torch.Tensor) -> dict[str, float]:
    """verl's ``compute_offpolicy_metrics`` (unprefixed): training/rollout perplexities (per-row exp of minus the
    row's mean log-prob, averaged over **all** rows, fully masked ones included), kl = mean(rollout − old) and
    k3_kl without clamping, log-ppl differences, and χ² of the token and sequence ratios (clamped ±20)."""
    assert response_mask.any(), "Expected at least one valid token in response_mask"
    lp_train = masked_mean(old_log_prob, response_mask, axis=-1)
    lp_roll = masked_mean(rollout_log_prob, response_mask, axis=-1)
    log_ratio = old_log_prob - rollout_log_prob
    diff = lp_roll - lp_train
    safe = torch.clamp(log_ratio, -IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP)
    seq_sum = torch.clamp(masked_sum(log_ratio, response_mask, axis=-1), -IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP)
    return {
        "training_ppl": float(torch.exp(-lp_train).mean()),
        "training_log_ppl": float((-lp_train).mean()),
        "kl": float(masked_mean(rollout_log_prob - old_log_prob, response_mask)),
        "k3_kl": float(masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask)),
        "rollout_ppl": float(torch.exp(-lp_roll).mean()),
        "rollout_log_ppl": float((-lp_roll).mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "log_ppl_diff_max": float(diff.max()),
        "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(torch.exp(diff).mean()),
        "chi2_token": float(masked_mean(torch.exp(safe).square(), response_mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq_sum).mean() - 1.0),
    }


@torch.no_grad()
def rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights (or None), the rejection-modified response_mask and all ``rollout_corr/`` metrics in one call
    (verl `rollout_corr_helper.py::compute_rollout_correction_and_rejection_mask`).

    log_ratio = old − rollout. Weights only when ``rollout_is`` and ``rollout_is_threshold`` are both set
    (truncated/IcePop, detached, optionally batch-normalised — metrics are taken before the normalisation); the
    rejection mask only when ``rollout_rs`` is set (``rollout_rs_threshold`` then required); the off-policy
    metrics always. Raises ``ValueError`` when the mask has no valid token or shapes differ.
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    if old_log_prob.shape != rollout_log_prob.shape:
        raise ValueError(f"old_log_prob shape {old_log_prob.shape} does not match rollout_log_prob shape "
                         f"{rollout_log_prob.shape}.")
    if old_log_prob.shape != response_mask.shape:
        raise ValueError(f"log_prob shape {old_log_prob.shape} does not match response_mask shape "
                         f"{response_mask.shape}.")
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        if rollout_is not in ("token", "sequence"):
            raise ValueError(f"Invalid rollout_is: {rollout_is}. Must be one of {{'token', 'sequence'}}.")
        upper, lower = parse_is_threshold(rollout_is_threshold)
        raw, for_metrics = raw_is_weights(old_log_prob, rollout_log_prob, response_mask, rollout_is)
        weights = truncate_is_weights(raw, upper, lower)
        metrics.update(rollout_is_weight_metrics(weights, raw, for_metrics, response_mask, rollout_is, upper, lower))
        if lower is not None:
            metrics["rollout_is_oob_ratio"] = float(masked_mean(((raw < lower) | (raw > upper)).float(),
                                                                response_mask))
        if rollout_is_batch_normalize:
            weights, factor = batch_normalize_is_weights(weights, response_mask, rollout_is)
            metrics["rollout_is_batch_norm_factor"] = factor
    metrics = {PREFIX + k: v for k, v in metrics.items()}
    mask = response_mask.clone()
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise ValueError("rollout_rs_threshold must be explicitly provided when rollout_rs is enabled. "
                             "Set rollout_rs_threshold to the desired threshold value.")
        mask, rs_metrics = rollout_rejection_mask(old_log_prob, rollout_log_prob, response_mask, rollout_rs,
                                                  rollout_rs_threshold)
        metrics.update(rs_metrics)  # already prefixed
    metrics.update({PREFIX + k: v for k, v in offpolicy_metrics(old_log_prob, rollout_log_prob,
                                                                response_mask).items()})
    return weights, mask, metrics
