"""Vectorised group estimators: ``grpo_vectorized`` and ``rloo_vectorized`` (chapter §5.1; verl `core_algos.py`,
`utils/groupwise.py`).

The same group baselines as ``grpo`` / ``rloo`` computed with scatter-adds over group ids instead of a Python
loop over groups. They are *not* bit-identical to the loop versions: GRPO's statistics are taken in float32,
and a singleton RLOO group gets 0 instead of its own score. Shapes: token_level_rewards, response_mask (bs, T);
``index`` bs group ids (verl's ``uid``).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ppolab.algos.advantages import GRPO_EPS, _groups, register_adv_est


def group_ids(index: Sequence[Any], device: torch.device | str | None = None) -> torch.Tensor:
    """Contiguous group ids 0..G−1 (first appearance order) for arbitrary labels; (bs,) long."""
    ids = torch.empty(len(index), dtype=torch.long)
    for gid, rows in enumerate(_groups(index).values()):
        ids[rows] = gid
    return ids.to(device) if device is not None else ids


def group_mean_std(scores: torch.Tensor, gidx: torch.Tensor,
                   eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group (mean, unbiased std, count), all float32 (verl `groupwise.py::group_mean_std`).

    mean_g = Σ s / n_g;  std_g = sqrt(max(Σ (s − mean_g)² / max(n_g − 1, 1), eps)); singletons: mean 0, std 1.
    Shapes: scores (N,), gidx (N,) long → three (G,) tensors.
    """
    scores = scores.reshape(-1).to(torch.float32)
    gidx = gidx.reshape(-1).to(device=scores.device, dtype=torch.long)
    n_groups = int(gidx.max().item()) + 1 if gidx.numel() else 0
    zeros = torch.zeros(n_groups, device=scores.device, dtype=torch.float32)
    count = zeros.clone().index_add_(0, gidx, torch.ones_like(scores))
    mean = zeros.clone().index_add_(0, gidx, scores) / count.clamp_min(1.0)
    centered = scores - mean[gidx]
    var = zeros.clone().index_add_(0, gidx, centered * centered) / (count - 1.0).clamp_min(1.0)
    std = torch.sqrt(torch.clamp(var, min=eps))
    single = count <= 1.0
    mean, std = mean.masked_fill(single, 0.0), std.masked_fill(single, 1.0)
    return mean, std, count


@register_adv_est("grpo_vectorized")
@torch.no_grad()
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = GRPO_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO with scatter-add group statistics (chapter §5.1; verl
    `core_algos.py::compute_grpo_vectorized_outcome_advantage`).

        a_i = (s_i − μ_g) / (σ_g + ε)   or   s_i − μ_g without the std

    μ_g, σ_g from :func:`group_mean_std` in float32 with variance floor 0 (unbiased; singleton: μ 0, σ 1), so on
    float64 input it differs from ``grpo`` in the 7th digit. Through the dispatcher ``norm_adv_by_std_in_grpo``
    stays True (verl passes it only to ``grpo``). Broadcast × mask; returns = advantages.
    """
    scores = token_level_rewards.sum(dim=-1)
    g = group_ids(index, scores.device)
    mean, std, _ = group_mean_std(scores, g, eps=0.0)
    scalars = (scores - mean[g]) / (std[g] + epsilon) if norm_adv_by_std_in_grpo else scores - mean[g]
    advantages = scalars.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("rloo_vectorized")
@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = GRPO_EPS,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO with bincounts (chapter §5.1; verl `core_algos.py::compute_rloo_vectorized_outcome_advantage`).

        a_i = (n_g·s_i − Σ_g s) / max(n_g − 1, 1) · [n_g > 1]      (= s_i − mean of the others)

    A **singleton group gets 0** here, while ``rloo`` keeps a_i = s_i. Broadcast × mask; returns = advantages.
    """
    scores = token_level_rewards.sum(dim=-1)
    inv = group_ids(index, scores.device)
    c = torch.bincount(inv)[inv].to(scores.dtype)
    adv = ((c * scores - torch.bincount(inv, weights=scores)[inv]) / (c - 1).clamp_min(1)) * (c > 1)
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages
