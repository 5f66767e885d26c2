"""A batch of padded tensors and how it is cut: :class:`Batch` (verl's DataProto, trimmed), its micro-batches,
padding samples and concatenation, (chapter §9, §11–§13; verl
`rearrange_micro_batches`, `padding_utils.py`).

No formula lives here, and no model: the update loop that uses these is :meth:`ppolab.worker.Worker.update`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ppolab.batching import balance_metrics, balance_partitions


@dataclass
class Batch:
    """N rows: tensors with a leading N dimension and per-row Python lists (verl's DataProto, trimmed)."""

    tensors: dict[str, torch.Tensor]
    lists: dict[str, list] = field(default_factory=dict)

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self.tensors[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def select(self, rows: Sequence[int]) -> "Batch":
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        return Batch({k: v[idx] for k, v in self.tensors.items()},
                     {k: [v[i] for i in rows] for k, v in self.lists.items()})

    @staticmethod
    def concat(batches: Sequence["Batch"]) -> "Batch":
        keys = batches[0].tensors.keys()
        return Batch({k: torch.cat([b.tensors[k] for b in batches]) for k in keys},
                     {k: sum((b.lists[k] for b in batches), []) for k in batches[0].lists})

    def response_attention(self) -> torch.Tensor:
        """Which response positions the model attends to: ``response_attention_mask`` when the rollout spliced
        in tool observations (attended, but ``response_mask`` = 0), else the response mask itself."""
        return self.tensors.get("response_attention_mask", self["response_mask"])

    def attention_mask(self) -> torch.Tensor:
        """verl's ``attention_mask`` (N, P + R) over prompt ‖ response: ``prompt_mask`` (left-padded prompts) then
        :meth:`response_attention` (right-padded responses), as int64."""
        return torch.cat([self["prompt_mask"].long(), self.response_attention().long()], dim=1)

    def lengths(self) -> tuple[list[int], list[int]]:
        """(prompt lengths, response lengths) without padding: the tokens the model attends to — the one definition
        of a trajectory's length for balancing, dynamic micro-batches and the widgets."""
        return (self["prompt_mask"].sum(-1).long().tolist(), self.response_attention().sum(-1).long().tolist())

    def seq_lens(self) -> list[int]:
        """Effective prompt + response lengths, the workload unit of balancing (verl `padding_utils.py`)."""
        return [p + r for p, r in zip(*self.lengths())]


def trimmed_inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(input_ids, attention_mask, R) of these rows with padding cut to their own longest prompt/response.

    verl packs micro-batches without padding and re-pads each to its own longest response, so the
    padded width T of a micro-batch depends on which rows it holds (why seq-mean-token-sum-norm with
    loss_scale_factor=None is not micro-batch invariant, chapter §13).
    """
    p_len = max(int(batch["prompt_mask"].sum(-1).max()), 1)
    attention = batch.response_attention()
    r_len = max(int(attention.sum(-1).max()), 1)
    prompts, responses = batch["prompts"][:, -p_len:], batch["responses"][:, :r_len]
    mask = torch.cat([batch["prompt_mask"][:, -p_len:], attention[:, :r_len].long()], dim=1)
    return torch.cat([prompts, responses], dim=1), mask, r_len


def pad_right(x: torch.Tensor, width: int, value: float = 0.0) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]), value=value)


def to_device(batch: Batch, device: torch.device) -> Batch:
    return Batch({k: v.to(device) for k, v in batch.tensors.items()}, batch.lists)


def concat_padded(batches: list[Batch], pad_id: int) -> Batch:
    """Concatenate batches whose prompt (left-padded) and response (right-padded) widths differ."""
    p_width = max(b["prompts"].shape[1] for b in batches)
    r_width = max(b["responses"].shape[1] for b in batches)
    out = []
    for b in batches:
        t = dict(b.tensors)
        for key in ("prompts", "prompt_mask"):
            fill = pad_id if key == "prompts" else 0
            t[key] = torch.nn.functional.pad(t[key], (p_width - t[key].shape[1], 0), value=fill)
        for key in ("responses", "response_mask", "rollout_log_probs", "response_attention_mask"):
            if key not in t:
                continue
            fill = pad_id if key == "responses" else 0
            t[key] = pad_right(t[key], r_width, fill)
        out.append(Batch(t, b.lists))
    return Batch.concat(out)


def add_padding_samples(batch: Batch, count: int, tokenizer) -> Batch:
    """Synthetic rows so the batch divides (verl `padding_utils.py`): a 1-token prompt, a 1-token EOS response with
    response_mask = 0, score 0, rollout log-prob 0, all in one fresh group of their own."""
    if count == 0:
        return batch
    first = batch.select([0])
    pad = Batch({k: v.repeat(count, *([1] * (v.dim() - 1))) for k, v in first.tensors.items()},
                {k: v * count for k, v in first.lists.items()})
    for key in ("prompt_mask", "response_mask", "loss_mask", "rollout_log_probs", "token_level_scores",
                "response_attention_mask"):
        if key in pad:
            pad[key] = torch.zeros_like(pad[key])
    pad["prompt_mask"][:, -1] = 1
    pad["responses"] = torch.full_like(pad["responses"], tokenizer.pad_token_id)
    pad["responses"][:, 0] = tokenizer.eos_token_id
    pad["uid"] = torch.full_like(pad["uid"], int(batch["uid"].max()) + 1)
    pad["is_pad"] = torch.ones_like(pad["is_pad"])
    return Batch.concat([batch, pad])


def pad_and_balance(batch: Batch, multiple: int, dp_size: int, tokenizer) -> tuple[Batch, dict[str, float]]:
    """Stage 3 on a whole step batch: pad with synthetic samples to a multiple of ``multiple`` (lcm(dp, mini×n)),
    order rows so that rank k's equal-size chunk k is a Karmarkar–Karp partition balanced on the attention workload
    (verl V1 `trainer_base.py` stage 3, `padding_utils.py`), and number the rows (``row_id``). Returns the batch and
    verl's ``global_seqlen/*`` metrics."""
    batch = add_padding_samples(batch, (-len(batch)) % multiple, tokenizer)
    seq_lens = batch.seq_lens()
    partitions = balance_partitions(seq_lens, dp_size)
    metrics = balance_metrics(seq_lens, partitions)
    batch = batch.select([i for part in partitions for i in part])
    batch["row_id"] = torch.arange(len(batch))
    return batch, metrics
