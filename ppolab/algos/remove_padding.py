"""Packed sequences: a micro-batch's real tokens laid end to end in one row (verl ``use_remove_padding``).

A padded micro-batch (bs, P + R) computes every slot — left padding of short prompts, right padding of short
responses — and throws the padded ones away. verl's FSDP workers (`dp_actor.py` ``_forward_micro_batch``,
``use_remove_padding=True``) instead unpad the batch to (1, nnz) real tokens with position ids that restart at 0 for
each sequence, so the attention stays within a sequence and no layer spends work on padding (chapter §9: the
masks; §11.5: token budgets count real tokens). Only the positions that score a real response token matter for
the loss: :func:`scoring_positions` finds them in the packed row, and :func:`pad_responses` puts the per-token
outputs back on the (bs, R) grid every formula of ``ppolab.algos`` reads, zeros in the padded slots (verl
``pad_input`` fills them with 0).

Pure tensor functions; the forward that uses them is ``ppolab.models.forward_response(..., remove_padding=True)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PACKED_ROW_TOKENS", "Packed", "pack_bins", "pack_rows", "pad_responses", "padded_slots"]

#: The most tokens a packed row holds unless one sequence is longer (:func:`pack_rows`): below it a micro-batch is one
#: row, verl's layout; above it, rows of this many, so an attention that computes every pair of a row (sdpa on a CPU,
#: eager) and its mask stay bounded — 4,096² pairs a row — where flash-attention's variable-length kernel would not
#: care. Measured on ``bench/remove_padding.py``'s grpo_qwen_gpu shape (24,576-token micro-batches on a CPU).
PACKED_ROW_TOKENS = 4096


@dataclass
class Packed:
    """One micro-batch packed (shapes: k packed rows of C slots, n real response tokens, bs rows, R response width).

    ``input_ids``, ``position_ids``: (k, C) — the real tokens sequence after sequence, positions restarting at 0
    with each sequence (what tells the attention where a sequence ends: transformers builds the block-diagonal
    causal mask from them); a packed row shorter than C ends in filler slots (token 0, position 0), which no real
    token attends to (they come after it). ``scoring``: (n,) the flat positions (row · C + slot) whose output scores
    a real response token (the one-token shift: position i predicts token i + 1). ``labels``: (n,) those tokens.
    ``real``: (bs, R) bool, where the n outputs go back on the padded grid (row-major, the order of ``scoring``)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    scoring: torch.Tensor
    labels: torch.Tensor
    real: torch.Tensor


def pack_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows (by index) grouped into packed rows of at most ``capacity`` tokens each: first-fit decreasing — the
    longest sequence first, each into the first packed row with room. A sequence longer than ``capacity`` gets a
    row of its own."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b, left in enumerate(room):
            if lengths[i] <= left:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def row_capacity(lengths: torch.Tensor) -> int:
    """The tokens a packed row holds at most: :data:`PACKED_ROW_TOKENS`, or the longest sequence if longer."""
    return max(PACKED_ROW_TOKENS, int(lengths.max()))


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
              capacity: int | None = None) -> Packed:
    """Pack prompt ‖ response rows (bs, P + R; prompts left-padded, responses right-padded, as every stage builds
    them) into rows of real tokens (verl ``unpad_input``).

    Packed rows hold at most ``capacity`` tokens (:func:`pack_bins`); None: :data:`PACKED_ROW_TOKENS` or the longest
    sequence, whichever is more — so a micro-batch of up to 4,096 tokens is one row of exactly its real tokens, as
    verl lays it out (``capacity`` ≥ nnz always), and a larger one is cut into rows whose every-pair attention stays
    bounded.

    The response token at slot (b, P + t) is scored by the output at (b, P + t − 1): the last prompt token for
    t = 0, else the response token before it — both real whenever the token scored is real, so every scoring
    position is packed. A sequence's last real token would score the next one's first token: never read."""
    keep = attention_mask.bool()
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # restarts at 0 in each row
    lengths = keep.sum(-1)
    bins = pack_bins(lengths.tolist(), row_capacity(lengths) if capacity is None else int(capacity))
    width = max(int(lengths[b].sum()) for b in bins)
    start = torch.zeros_like(lengths)  # where each sequence starts in the flat (k · width) layout
    for k, rows in enumerate(bins):
        offsets = torch.cumsum(lengths[rows], 0) - lengths[rows]
        start[rows] = k * width + offsets
    flat_index = start[:, None] + position_ids  # slot (b, t) → its place, for the real slots
    packed_ids = input_ids.new_zeros(len(bins) * width)
    # filler: after every real token of its row, position 0 (a model with learned positions has no index past its
    # longest sequence, and a packed row can be longer)
    packed_pos = torch.zeros(len(bins) * width, dtype=torch.long, device=input_ids.device)
    packed_ids[flat_index[keep]] = input_ids[keep]
    packed_pos[flat_index[keep]] = position_ids[keep]
    real = keep[:, -response_length:]
    return Packed(input_ids=packed_ids.view(len(bins), width), position_ids=packed_pos.view(len(bins), width),
                  scoring=flat_index[:, -response_length - 1:-1][real], labels=input_ids[:, -response_length:][real],
                  real=real)


def pad_responses(values: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(n,) per-token outputs of the real response tokens → (bs, R), 0 in the padded slots (verl ``pad_input``).
    Differentiable: the gradient of each real slot flows back to its packed output."""
    out = values.new_zeros(real.shape)
    return out.masked_scatter(real, values)


def padded_slots(attention_mask: torch.Tensor, packed: bool = False) -> tuple[int, int]:
    """(token slots the forward of one micro-batch (bs, T) computes, real tokens): bs · T padded; packed, the slots
    of :func:`pack_rows`' rows (real tokens and the filler that ends a packed row). §11.5: verl's
    ``max_token_len`` budgets count the real ones."""
    real = int(attention_mask.sum())
    if not packed:
        return int(attention_mask.numel()), real
    lengths = attention_mask.bool().sum(-1)
    bins = pack_bins(lengths.tolist(), row_capacity(lengths))
    return len(bins) * max(int(lengths[b].sum()) for b in bins), real
