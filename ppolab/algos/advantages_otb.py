"""Optimal token baselines: ``optimal_token_baseline`` and ``tir_optimal_token_baseline`` (chapter §5.1; verl
`core_algos.py`).

Instead of one baseline per trajectory (the group mean of GRPO/RLOO), OTB uses one baseline per *time step*
in each prompt group, weighting each trajectory's return-to-go by how much gradient variance its path has
accumulated so far:

    w_t = 1 − 2·π_t + Σ_v π(v)²          (‖∇ log π‖² proxy; π_t = exp(old_log_prob_t))
    W_t = Σ_{j≤t} w_j·m_j                (× ρ̄_t² first, with rollout IS weights ρ̄)
    B_t = Σ_group G_t·W_t·m / (Σ_group W_t·m + 1e-8),   A_t = (G_t − B_t)·m

G_t is the reverse cumulative sum of r·m. Both need ``sum_pi_squared`` from the actor's old-log-prob forward
(``actor.calculate_sum_pi_squared=True``; :func:`ppolab.algos.logprob.calculate_sum_pi_squared_from_logits`).
Shapes: every tensor (bs, T); ``index`` bs group ids. Both return (advantages, returns = G).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ppolab.algos.advantages import _groups, register_adv_est

#: Added to the per-step denominator Σ W·m.
OTB_EPS = 1e-8


def _returns_and_path_weights(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights):
    """(G = reverse cumsum of r·m, W = cumsum of w·m) — steps 1–3 shared by both estimators."""
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights ** 2
    return returns, (w * response_mask).cumsum(dim=-1)


def _zero_tail(baselines, lengths, traj_rows: list[int]) -> None:
    """If one trajectory is strictly the longest of its group, zero its baseline past the second-longest length
    (nobody else is there to estimate it from)."""
    sorted_lengths, _ = torch.sort(lengths)
    longest, second = int(sorted_lengths[-1].item()), int(sorted_lengths[-2].item())
    at_max = (lengths == longest).nonzero(as_tuple=True)[0]
    if at_max.numel() == 1 and longest > second:
        baselines[traj_rows[int(at_max[0])], second:] = 0.0


@register_adv_est("optimal_token_baseline")
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = OTB_EPS,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB over padded positions t (chapter §5.1; verl `core_algos.py::compute_optimal_token_baseline_advantage`).

    B_t is computed column by column of the padded (bs, T) layout, so in multi-turn data tokens of different
    turns can share a column. A singleton group has B = 0 (A = G). With ``handle_zero_tail`` (default) the
    single longest trajectory of a group gets B = 0 past the second-longest length (lengths = Σ_t m).
    A = (G − B)·m; returns = G.
    """
    returns, w_cum = _returns_and_path_weights(token_level_rewards, response_mask, old_log_probs, sum_pi_squared,
                                               rollout_is_weights)
    baselines = torch.zeros_like(returns)
    for rows in _groups(index).values():
        if len(rows) == 1:
            continue
        idx = torch.tensor(rows, device=returns.device)
        g_ret, g_w, g_m = returns[idx], w_cum[idx], response_mask[idx]
        baseline = (g_ret * g_w * g_m).sum(dim=0) / ((g_w * g_m).sum(dim=0) + epsilon)
        baselines[idx] = baseline.unsqueeze(0).expand(len(rows), -1)
        if handle_zero_tail:
            _zero_tail(baselines, g_m.sum(dim=-1), rows)
    return (returns - baselines) * response_mask, returns


@register_adv_est("tir_optimal_token_baseline")
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = OTB_EPS,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tool-integrated OTB: the same baseline over the k-th *valid* token instead of the t-th column (chapter
    §5.1; verl `core_algos.py::compute_multi_turn_optimal_token_baseline_advantage`).

    Each row's valid tokens (m = 1, tool observations skipped) are packed left into (bs, L_max); G and W are
    read at those tokens, B_k = Σ_group G_k·W_k / (Σ_group W_k + 1e-8) over the packed layout (packed padding is
    0), and A is scattered back to the valid positions. Rows with no valid token get A = 0 and join no group;
    a singleton group has B = 0. ``handle_zero_tail`` as in ``optimal_token_baseline`` (default True).
    A is × m; returns = G in the original layout.
    """
    token_returns, w_cum = _returns_and_path_weights(token_level_rewards, response_mask, old_log_probs,
                                                     sum_pi_squared, rollout_is_weights)
    lengths = response_mask.sum(dim=-1).to(dtype=torch.long)
    width = int(lengths.max().item()) if lengths.numel() > 0 else 0
    packed_w = w_cum.new_zeros((len(lengths), width))
    packed_g = torch.zeros_like(packed_w)
    valid = response_mask.bool()
    for i in range(len(lengths)):
        n = int(lengths[i].item())
        if n:
            packed_w[i, :n] = w_cum[i, valid[i]]
            packed_g[i, :n] = token_returns[i, valid[i]]
    live = [i for i in range(len(lengths)) if lengths[i] != 0]
    baselines = torch.zeros_like(packed_g)
    for rows in _groups([index[i] for i in live]).values():
        rows = [live[r] for r in rows]
        if len(rows) == 1:
            continue
        idx = torch.tensor(rows, device=packed_g.device)
        b_star = (packed_g[idx] * packed_w[idx]).sum(dim=0) / (packed_w[idx].sum(dim=0) + epsilon)
        baselines[idx] = b_star.to(baselines.dtype)
        if handle_zero_tail:
            _zero_tail(baselines, lengths[idx], rows)
    packed_adv = packed_g - baselines
    advantages = torch.zeros_like(token_returns)
    for i in live:
        advantages[i, valid[i]] = packed_adv[i, : lengths[i]]
    return advantages * response_mask, token_returns
