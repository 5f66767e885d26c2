"""Covariance-based entropy control: ``clip_cov`` and ``kl_cov`` (chapter §5.2, §6; verl `core_algos.py`).

Entropy collapses fastest through tokens whose advantage and log-probability co-vary strongly: raising an
already likely token that also has a high advantage. Both losses compute, per valid token,

    cov = (A − mean_m A) · (lp − mean_m sg(lp))

and treat a small share of high-covariance tokens specially — ``clip_cov`` drops their gradient, ``kl_cov``
adds a |log-ratio| penalty. Neither clamps the log-ratio at ±20 nor applies a dual clip. Same registry
signature as every policy loss; shapes (bs, T).
"""
from __future__ import annotations

import torch

from ppolab.algos.masked import masked_mean
from ppolab.algos.aggregation import GlobalBatchInfo
from ppolab.algos.policy_loss import _aggregate, _float, clip_bounds, register_policy_loss

#: Fallbacks that apply only when the config value is None (the config defaults are the same numbers,
#: except kl_cov's ppo_kl_coef whose config default is 0.1).
CLIP_COV_RATIO_FALLBACK, CLIP_COV_LB_FALLBACK, CLIP_COV_UB_FALLBACK = 0.0002, 1.0, 5.0
KL_COV_RATIO_FALLBACK, PPO_KL_COEF_FALLBACK = 0.0002, 1.0


def _or(value, fallback):
    return value if value is not None else fallback


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: GlobalBatchInfo | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov: the plain PPO clip, plus the gradient of a few random high-covariance tokens switched off
    (chapter §5.2; verl `core_algos.py::compute_policy_loss_clip_cov`).

    Shapes: all (bs, T) → (scalar, metrics). r = exp(lp − old) (no ±20 clamp):

        L1 = −A·r,  L2 = −A·clip(r, 1−ε_low, 1+ε_high)
        candidates = valid tokens with L2 ≤ L1 (not already clipped) and lb < cov < ub (strict)
        k = max(int(clip_cov_ratio · N_valid), 1);  k of the candidates, drawn at random, get corr = 0
        L = max(L1, L2) · corr                                 (no dual clip)

    The draw is ``torch.randperm(#candidates, generator=generator)`` over the candidates in row-major order, so a
    seeded ``torch.Generator`` makes it reproducible; with ``generator=None`` the draw uses torch's global RNG, as
    verl does (the trainer seeds it from ``trainer.seed``, so a run is reproducible either way). No candidate → no
    draw (the RNG is not advanced).
    Metrics: ``actor/pg_clipfrac`` = share of valid tokens zeroed, ``actor/ppo_kl`` = masked mean of old − lp.
    """
    assert config is not None, "compute_policy_loss_clip_cov needs an ActorConfig"
    pl = config.policy_loss
    clip_cov_ratio = _or(pl.clip_cov_ratio, CLIP_COV_RATIO_FALLBACK)
    clip_cov_lb, clip_cov_ub = _or(pl.clip_cov_lb, CLIP_COV_LB_FALLBACK), _or(pl.clip_cov_ub, CLIP_COV_UB_FALLBACK)
    assert clip_cov_ratio > 0, "clip_ratio should be larger than 0."
    eps_low, eps_high = clip_bounds(config)

    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)

    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, response_mask)) * (
            log_prob - masked_mean(log_prob.detach(), response_mask))
        cov[response_mask == 0] = -torch.inf
        cov[clip_by_origin] = -torch.inf
        clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
        candidates = torch.nonzero((cov < clip_cov_ub) & (cov > clip_cov_lb) & (response_mask > 0))
        if len(candidates) > 0:
            perm = torch.randperm(len(candidates), generator=generator)
            chosen = candidates[perm[: min(clip_num, len(candidates))]]
        else:
            chosen = torch.empty((0, 2), device=cov.device, dtype=torch.long)
        corr = torch.ones_like(advantages)
        corr[chosen[:, 0], chosen[:, 1]] = 0

    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_batch_info)
    return pg_loss, {
        "actor/pg_clipfrac": _float(masked_mean((corr == 0).float(), response_mask)),
        "actor/ppo_kl": _float(masked_mean(-negative_approx_kl, response_mask)),
    }


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
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
    """KL-Cov: the unclipped surrogate, plus a |log-ratio| penalty on the top-k tokens by covariance (chapter
    §5.2; verl `core_algos.py::compute_policy_loss_kl_cov`).

    Shapes: all (bs, T) → (scalar, metrics). r = exp(lp − old) (no clamp, no clip):

        cov over the valid tokens with plain means: (A − Ā)·(lp − l̄p)     (detached)
        k = max(1, int(N_valid · kl_cov_ratio)) tokens with the largest cov (torch.topk)
        L = −A·r + ppo_kl_coef·|lp − old|  on those k tokens,  −A·r  elsewhere

    ``ppo_kl_coef`` is the config's (default 0.1); the function's own fallback 1.0 applies only when it is None.
    A batch without valid tokens selects nothing. The only metric, ``actor/ppo_kl``, is the masked mean of
    |lp − old| (not of old − lp as elsewhere).
    """
    assert config is not None, "compute_policy_loss_kl_cov needs an ActorConfig"
    pl = config.policy_loss
    kl_cov_ratio = _or(pl.kl_cov_ratio, KL_COV_RATIO_FALLBACK)
    ppo_kl_coef = _or(pl.ppo_kl_coef, PPO_KL_COEF_FALLBACK)
    assert kl_cov_ratio > 0, "kl_cov_ratio should be larger than 0."

    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    pg_losses = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl

    valid = response_mask > 0
    valid_idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    valid_adv = advantages[valid].detach().reshape(-1).cpu()
    valid_lp = log_prob[valid].detach().reshape(-1).cpu()
    if len(valid_adv) > 0:
        cov = (valid_adv - valid_adv.mean()) * (valid_lp - valid_lp.mean())
        k = max(1, int(len(cov) * kl_cov_ratio))
        top = valid_idx[torch.topk(cov, k, largest=True).indices.to(valid_idx.device)]
        rows, cols = top // advantages.shape[1], top % advantages.shape[1]
        pg_losses = pg_losses.clone()
        pg_losses[rows, cols] = pg_losses_kl[rows, cols]

    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_batch_info)
    return pg_loss, {"actor/ppo_kl": _float(masked_mean(abs_kl, response_mask))}
