"""Policy losses that replace PPO's ratio clip by another trust region (chapter §5.2; verl `core_algos.py`).

* ``dppo_tv`` / ``dppo_kl`` (DPPO): a token is dropped when the *probability* moved too far — total variation
  |π − π_old| or the binary KL — instead of when the ratio left [1−ε, 1+ε]; the kept tokens are a truncated-IS
  policy gradient −A·sg(min(r, c))·log π.
* ``geo_mean`` (GMPO): the ratio of a sequence is the geometric mean of its token ratios, clipped in log space.
* ``dro``: −(A·log π − ½β(log π − log π_old)²), a quadratic penalty instead of a clip.

All share verl's signature ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights) -> (pg_loss, metrics)`` with (bs, T) tensors, and are found by name in
:data:`ppolab.algos.policy_loss.POLICY_LOSS_REGISTRY`. Unlike vanilla, geo_mean and dro do not clamp the
log-ratio at ±20.
"""
from __future__ import annotations

from typing import Callable

import torch

from ppolab.algos.masked import masked_mean, row_token_mean
from ppolab.algos.aggregation import GlobalBatchInfo
from ppolab.algos.policy_loss import LOG_RATIO_CLAMP, _aggregate, _float, clip_bounds, register_policy_loss

#: ``clip_ratio_c`` fallback of DPPO when the config has no such key. ppolab's ActorConfig (like verl's) always
#: has one, default 3.0, so the truncation is at 3, not 20, unless ``clip_ratio_c`` is set.
DPPO_CLIP_RATIO_C_FALLBACK = 20.0
#: Added inside DPPO's binary-KL logs and to geo_mean's IS weights before the log.
DPPO_BKL_EPS = 1e-8
GEO_MEAN_IS_EPS = 1e-10


def _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
          global_batch_info,
          valid_fn: Callable[[torch.Tensor, torch.Tensor, float, float], tuple[torch.Tensor, torch.Tensor]]):
    """Shared body of the two DPPO losses; ``valid_fn(prob, old_prob, δ_low, δ_high)`` → (valid if A>0, if A≤0)."""
    assert config is not None, "DPPO losses need an ActorConfig"
    div_low, div_high = clip_bounds(config)  # here: divergence thresholds δ, not ratio clip ranges
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(negative_approx_kl)
    clip_ratio_c = config.get("clip_ratio_c", DPPO_CLIP_RATIO_C_FALLBACK)
    truncated_ratio = torch.clamp(ratio, max=clip_ratio_c).detach()
    valid_pos, valid_neg = valid_fn(torch.exp(log_prob), torch.exp(old_log_prob), div_low, div_high)
    valid = torch.where(advantages > 0, valid_pos, valid_neg).detach().float()
    pg_losses = -advantages * truncated_ratio * log_prob * valid
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_batch_info)
    return pg_loss, {
        "actor/pg_clipfrac": _float(masked_mean(1.0 - valid, response_mask)),
        "actor/ppo_kl": _float(masked_mean(-negative_approx_kl, response_mask)),
        "actor/pg_clipfrac_lower": _float(masked_mean((ratio > clip_ratio_c).float() * valid, response_mask)),
    }


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
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
    """DPPO-Binary-TV: keep a token only while its probability moved by at most δ (chapter §5.2; verl
    `core_algos.py::compute_policy_loss_dppo_tv`).

    Shapes: all (bs, T) → (scalar, metrics). With p = e^{lp}, p_old = e^{old}, r = exp(clamp(lp − old, ±20)),
    δ_low/δ_high = clip_ratio_low/high (fallback clip_ratio — here divergence thresholds, not ratio ranges):

        valid = (p − p_old ≤ δ_high) if A > 0 else (p − p_old ≥ −δ_low)        (detached; A = 0 uses the second)
        L = −A · sg(min(r, c)) · lp · valid,   c = clip_ratio_c

    c is read as ``config.get("clip_ratio_c", 20.0)``, so the ActorConfig default **3.0 wins** over the 20 that
    the DPPO paper recommends; set ``clip_ratio_c`` to get it. Metrics: ``actor/pg_clipfrac`` = share of dropped
    tokens, ``actor/ppo_kl`` = masked mean of old − lp (clamped), ``actor/pg_clipfrac_lower`` = share of kept tokens
    whose ratio was truncated (r > c).
    """

    def tv(prob, old_prob, low, high):
        return (prob - old_prob) <= high, (prob - old_prob) >= -low

    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
                 global_batch_info, tv)


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
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
    """DPPO-Binary-KL: as ``dppo_tv`` with the binary KL between Bernoulli(p_old) and Bernoulli(p) (chapter §5.2;
    verl `core_algos.py::compute_policy_loss_dppo_kl`).

        bkl = p_old·(old − lp) + (1 − p_old)·log((1 − p_old + 1e-8) / (1 − p + 1e-8))
        valid = (bkl ≤ δ_high or p ≤ p_old) if A > 0 else (bkl ≤ δ_low or p ≥ p_old)

    A move *against* the advantage's direction is never dropped. Loss, c (3.0 from the config unless set) and
    metrics as ``dppo_tv``. Shapes: all (bs, T) → (scalar, metrics).
    """

    def binary_kl(prob, old_prob, low, high):
        bkl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + DPPO_BKL_EPS) / (1.0 - prob + DPPO_BKL_EPS))
        return (bkl <= high) | (prob <= old_prob), (bkl <= low) | (prob >= old_prob)

    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
                 global_batch_info, binary_kl)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
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
    """GMPO: one ratio per sequence, the geometric mean of its token ratios, clipped token-wise in log space
    (chapter §5.2; verl `core_algos.py::compute_policy_loss_geo_mean`).

    Shapes: all (bs, T) → (scalar, metrics). d = lp − old (no ±20 clamp), d_c = clamp(d, −ε_low, ε_high),
    s = sign(A):

        d*   = s · min(s·d, s·d_c)                       (the pessimistic side, as PPO's min)
        ρ_i  = exp(Σ_t d*·m / (Σ_t m + 1e-8)),   Ā_i = Σ_t A·m / (Σ_t m + 1e-8)
        L_i  = −Ā_i · ρ_i · w̄_i,   w̄_i = exp(Σ_t log(w + 1e-10)·m / (Σ_t m + 1e-8)) with IS weights w
        pg_loss = mean_i L_i                             (plain torch.mean over *all* rows)

    ``loss_agg_mode`` and ``global_batch_info`` are ignored, so the loss is neither DP- nor micro-batch
    invariant, and a fully masked row still counts in the mean with L_i = 0. Metrics: ``actor/pg_clipfrac`` /
    ``actor/pg_clipfrac_lower`` = share of tokens with d ≠ d_c and A > 0 / A < 0; ``actor/ppo_kl`` = masked
    mean of old − lp.
    """
    assert config is not None, "compute_policy_loss_geo_mean needs an ActorConfig"
    eps_low, eps_high = clip_bounds(config)
    negative_approx_kl = log_prob - old_log_prob
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    sgn = torch.sign(advantages)
    clamped = torch.clamp(negative_approx_kl, -eps_low, eps_high)
    pessimistic = sgn * torch.min(sgn * negative_approx_kl, sgn * clamped)
    ratio = torch.exp(row_token_mean(pessimistic, response_mask))
    seq_advantage = row_token_mean(advantages, response_mask)
    pg_losses = -seq_advantage * ratio
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights + GEO_MEAN_IS_EPS) * response_mask
        pg_losses = pg_losses * torch.exp(row_token_mean(log_w, response_mask))
    pg_loss = torch.mean(pg_losses)
    clipped = torch.ne(negative_approx_kl, clamped)
    return pg_loss, {
        "actor/pg_clipfrac": _float(masked_mean((clipped * (advantages > 0)).float(), response_mask)),
        "actor/ppo_kl": _float(ppo_kl),
        "actor/pg_clipfrac_lower": _float(masked_mean((clipped * (advantages < 0)).float(), response_mask)),
    }


@register_policy_loss("dro")
def compute_policy_loss_dro(
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
    """Direct Reward Optimisation: policy gradient plus a quadratic log-ratio penalty (chapter §5.2; verl
    `core_algos.py::compute_policy_loss_dro`).

        L = −(lp·A − ½·β·(lp − old)²),   β = policy_loss.dro_beta (no ±20 clamp, no clip)

    Shapes: all (bs, T) → (scalar, metrics). Raises ``ValueError`` when ``dro_beta`` is None (its default) or
    ≤ 0. Aggregated with ``loss_agg_mode``; the only metric is ``actor/ppo_kl`` = masked mean of old − lp.
    """
    assert config is not None, "compute_policy_loss_dro needs an ActorConfig"
    beta = config.policy_loss.dro_beta
    if beta is None or beta <= 0:
        raise ValueError("policy_loss.dro_beta must be a positive value when using DRO")
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_batch_info)
    return pg_loss, {"actor/ppo_kl": _float(masked_mean(-log_ratio, response_mask))}
