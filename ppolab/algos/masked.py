"""Masked reductions over (bs, T) token tensors — verl's ``torch_functional`` helpers (verl `torch_functional.py`).

Every loss in ppolab reduces over ``response_mask``; these four functions are the only place a mask
turns into a denominator. Chapter §9: "the numerator of every key loss obeys masked_loss = loss × mask".
"""
from __future__ import annotations

import torch

#: Added to every masked denominator (verl's ``masked_mean`` / ``masked_whiten``).
MASKED_EPS = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values·mask, ignoring whatever (NaN, inf) sits outside the mask.

    Shapes: ``values`` and ``mask`` broadcastable, typically (bs, T). Returns a scalar, or the tensor
    reduced over ``axis``. Positions where ``mask`` is 0 are replaced by 0 *before* multiplying, so a
    NaN at a padded position cannot poison the sum (verl `torch_functional.py`).
    """
    masked = torch.where(mask.bool(), values, torch.zeros_like(values)) * mask
    return masked.sum() if axis is None else masked.sum(axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """masked_sum / (Σ mask + 1e-8). An all-zero mask gives 0, not NaN (verl `torch_functional.py`)."""
    count = mask.sum() if axis is None else mask.sum(axis)
    return masked_sum(values, mask, axis) / (count + MASKED_EPS)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over masked positions; unbiased multiplies by n/(n−1) with n = Σ mask.

    Raises ``ValueError`` when n is 0 (nothing to measure) or, with ``unbiased``, 1 (n−1 = 0) —
    verl raises in both cases, which is why GAE on a batch with a single valid token fails.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n == 0:
            raise ValueError("masked_var: the mask selects no token (sum of mask is 0)")
        if n == 1:
            raise ValueError("masked_var: the mask selects a single token; the unbiased variance needs at least 2")
        variance = variance * (n / (n - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x − mean)·rsqrt(var + 1e-8) with mean and unbiased var over the mask.

    Applied to every position, masked ones included, and *not* re-multiplied by the mask: callers
    decide (GAE leaves garbage at masked positions; REINFORCE++ multiplies by the mask).
    With ``shift_mean=False`` the mean is added back (only the scale is normalised).
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + MASKED_EPS)
    return whitened if shift_mean else whitened + mean


def row_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(bs, T) → (bs,): each row's mean over its masked tokens, Σ_t x·m / (Σ_t m + 1e-8) — a fully masked row is 0.
    The per-sequence mean of geo_mean's log-ratio and advantage (verl ``compute_policy_loss_geo_mean``)."""
    return (values * mask).sum(dim=-1) / (mask.sum(dim=-1) + MASKED_EPS)
