"""Chapter §10-§11's numbers: how much each trajectory weighs under a loss_agg_mode, and the sequence lengths
dynamic batching counts."""
from __future__ import annotations

import torch

from ppolab.algos import agg_loss


def trajectory_weights(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str,
                       loss_scale_factor: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(total, weights): ``agg_loss`` of the matrix, and each row's Σ_t ∂agg_loss/∂ℓ_{i,t} (its weight)."""
    x = loss_mat.detach().double().clone().requires_grad_(True)
    total = agg_loss(x, mask.double(), mode, loss_scale_factor=loss_scale_factor)
    total.backward()
    return total.detach(), (x.grad * mask.double()).sum(-1)


def recorded_seq_lens(record) -> list[int]:
    """Effective prompt + response token counts of every row of a recorded step, as the engine's dynamic batching
    counts them (``Batch.seq_lens``): prompt_mask sums plus the *attended* response tokens —
    ``response_attention_mask`` when the rollout spliced in tool observations (attended, response_mask 0),
    else response_mask. An optimizer step's own rows, in its loader's order: ``record.opt_step(k).seq_lens(rank)``."""
    from ppolab.batch import Batch

    return Batch(dict(record.tensors)).seq_lens()
