"""``agg_loss``: how a (bs, T) matrix of token losses becomes one scalar (chapter §10, §13; verl `core_algos.agg_loss`).

The five modes weight trajectories differently (chapter §10.6: with token-mean a 2-token and a
6-token trajectory weigh 2/8 and 6/8; with seq-mean-token-mean they weigh 1:1).

Global normalisation (chapter §13): inside the trainer every micro-batch divides its *local* sum by
the token or sequence count of the *whole global mini-batch* (``batch_num_tokens`` /
``global_batch_size``) and multiplies by ``dp_size``. Gradient accumulation then sums the micro-batches
and DDP averages the ranks, so the optimizer sees exactly the global mini-batch mean, whatever the split.
With those arguments left at None the normalisation falls back to the local batch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from ppolab.algos.masked import MASKED_EPS, masked_sum
from ppolab.vocab import check_loss_agg_mode


@dataclass(frozen=True)
class GlobalBatchInfo:
    """The counts of one *global* mini-batch that every micro-batch's loss is normalised by (chapter §13).

    The engine computes it once per mini-batch, before the micro-batch loop (``batch_num_tokens`` summed over the
    data-parallel ranks), and passes it to the losses as an argument — the GRPO-Zero way, in plain sight. verl's
    ``TrainingWorker`` writes the same four numbers into ``config.global_batch_info``.
    """

    dp_size: int = 1
    """Data-parallel ranks; ``agg_loss`` multiplies by it because DDP/FSDP average the ranks' gradients."""
    batch_num_tokens: float | None = None
    """Σ loss_mask over the global mini-batch (all ranks): the token-mean denominator. None: count locally."""
    global_batch_size: int | None = None
    """Rows of the global mini-batch (ppo_mini_batch_size × rollout.n): the seq-mean denominator. None: locally."""
    loss_scale_factor: float | None = None
    """seq-mean-token-sum-norm's divisor (the role config's ``loss_scale_factor``); None: the padded width."""

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`agg_loss`."""
        return asdict(self)


#: The loss_agg_modes that read ``loss_scale_factor`` (verl `core_algos.agg_loss`): every other mode ignores it.
SCALED_MODES = ("seq-mean-token-sum-norm",)


def batch_info_kwargs(config: Any, global_batch_info: GlobalBatchInfo | None) -> dict[str, Any]:
    """``agg_loss`` keywords of a loss call: the explicit ``global_batch_info`` when given (what ppolab's engine
    passes), else a ``config.global_batch_info`` dict (verl's channel; set by hand in tests), else none (local)."""
    if global_batch_info is not None:
        return global_batch_info.as_kwargs()
    return dict(getattr(config, "global_batch_info", None) or {})


def _seq_mean(seq_losses: torch.Tensor, seq_mask: torch.Tensor, dp_size: int, global_batch_size: int | None):
    """Σ_i seq_i·q_i / B_agg · dp_size, with the local count of non-empty sequences as fallback B_agg."""
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError("agg_loss: global_batch_size is required for seq-mean modes when dp_size > 1")
        global_batch_size = seq_mask.sum()
    return (seq_losses * seq_mask).sum() / global_batch_size * dp_size


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate token losses ℓ_{i,t} under mask m_{i,t} into a scalar.

    Shapes: loss_mat, loss_mask (bs, T) → scalar. S = masked_sum, T_i = Σ_t m_{i,t}, q_i = [T_i > 0].

    =========================  ===============================================================
    token-mean                 S(ℓ, m) / batch_num_tokens · dp_size   (fallback: Σ m locally)
    token-sum                  S(ℓ, m) · dp_size
    seq-mean-token-sum         Σ_i q_i Σ_t ℓ·m / B_agg · dp_size      (fallback: #non-empty rows)
    seq-mean-token-mean        Σ_i q_i (Σ_t ℓ·m / (T_i + 1e-8)) / B_agg · dp_size
    seq-mean-token-sum-norm    seq-mean-token-sum / loss_scale_factor (fallback: T = padded width)
    =========================  ===============================================================

    The seq-mean modes multiply by the mask (not masked_sum), so a NaN at a masked position propagates
    there, as in verl (verl `core_algos.agg_loss`). Unknown mode → ``ValueError`` naming the five valid modes.
    """
    check_loss_agg_mode(loss_agg_mode)
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss: batch_num_tokens is required for token-mean when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size

    seq_mask = (loss_mask.sum(dim=-1) > 0).to(loss_mat.dtype)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = (loss_mat * loss_mask).sum(dim=-1) / (loss_mask.sum(dim=-1) + MASKED_EPS)
        return _seq_mean(seq_losses, seq_mask, dp_size, global_batch_size)
    seq_losses = (loss_mat * loss_mask).sum(dim=-1)
    loss = _seq_mean(seq_losses, seq_mask, dp_size, global_batch_size)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        # Chapter §10.5 / §13: the None fallback is the padded width of *this* micro-batch, which is
        # what breaks micro-batch invariance unless a fixed factor (Dr. GRPO: max_response_length) is set.
        loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1])
    return loss
