"""The critic's clipped value loss (chapter §8; verl `core_algos.compute_value_loss`)."""
from __future__ import annotations

import torch

from ppolab.algos.aggregation import agg_loss
from ppolab.algos.masked import masked_mean, masked_var


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """max(min(x, hi), lo) with tensor bounds (verl's ``clip_by_value``)."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def value_clip_terms(
    vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor, cliprange_value: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token pieces of the clipped value loss, before aggregation and the ½ (chapter §8.1).

    Shapes: all (bs, T). Returns (V_clip, (V_new − G)², (V_clip − G)², max of the two) with
    V_clip = clip(V_new, V_old − ε_v, V_old + ε_v); the loss aggregates the max. Chapter example:
    V_old 0.4, V_new 0.9, G 1.0, ε_v 0.2 → (0.6, 0.01, 0.16, 0.16).
    """
    vpredclipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1, vf_losses2 = (vpreds - returns) ** 2, (vpredclipped - returns) ** 2
    return vpredclipped, vf_losses1, vf_losses2, torch.max(vf_losses1, vf_losses2)


def explained_variance(returns: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``critic/vf_explained_var`` = 1 − Var(G − V) / (Var(G) + 1e-5) over the valid tokens (chapter §15).

    Shapes: returns, values, response_mask (bs, T). 1 is a perfect critic, 0 no better than a constant,
    below 0 worse than a constant. Variances are the masked unbiased ones (``masked_var``).
    """
    return 1.0 - masked_var(returns - values, response_mask) / (masked_var(returns, response_mask) + 1e-5)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: ½·agg(max((V_new − G)², (V_clip − G)²)), V_clip = clip(V_new, V_old ± ε_v).

    Shapes: vpreds (new predictions), returns (G, the GAE targets), values (V_old, before the update),
    response_mask — all (bs, T). Returns (vf_loss, vf_clipfrac) as tensors; vf_clipfrac is the share of
    tokens where the clipped error is strictly the larger one. Chapter §8.1: V_old 0.4, V_new 0.9,
    G 1.0, ε_v 0.2 → V_clip 0.6 → ½·max(0.01, 0.16) = 0.08.
    """
    _, vf_losses1, vf_losses2, clipped_vf_losses = value_clip_terms(vpreds, returns, values, cliprange_value)
    vf_loss = 0.5 * agg_loss(
        clipped_vf_losses,
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac
