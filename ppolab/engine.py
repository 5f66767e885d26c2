"""The worker side of an update: a batch of padded tensors, its micro-batches, and the
zero-grad → forward/backward per micro-batch → clip → step loop (chapter §11–§13; verl
`TrainingWorker.train_mini_batch`, `rearrange_micro_batches`).

No formula lives here: losses come from ``ppolab.algos``; this module only decides which rows go
through the model together and with which global counts.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from ppolab.algos import SUM_METRICS
from ppolab.batching import fixed_micro_batches, mini_batch_indices, plan_dynamic_micro_batches


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

    def seq_lens(self) -> list[int]:
        """Effective prompt + response lengths (no padding), the workload unit of balancing (verl
        `padding_utils.py`)."""
        return (self["prompt_mask"].sum(-1) + self.response_attention().sum(-1)).long().tolist()


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


def micro_batches(batch: Batch, micro_batch_size: int | None, max_token_len: int | None) -> list[list[int]]:
    """Row indices of each micro-batch: fixed chunks, or token-budget partitions when size is None (§11.5)."""
    if micro_batch_size is not None:
        return fixed_micro_batches(len(batch), micro_batch_size)
    return plan_dynamic_micro_batches(batch.seq_lens(), max_token_len)


def to_device(batch: Batch, device: torch.device) -> Batch:
    return Batch({k: v.to(device) for k, v in batch.tensors.items()}, batch.lists)


def reduce_metrics(per_step: Iterable[dict[str, float]]) -> dict[str, float]:
    """Average over optimizer steps (np.max / np.min for keys naming max / min), as verl's reduce_metrics."""
    collected: dict[str, list[float]] = defaultdict(list)
    for metrics in per_step:
        for k, v in metrics.items():
            collected[k].append(v)
    out = {}
    for k, values in collected.items():
        reducer = np.max if "max" in k else np.min if "min" in k else np.mean
        out[k] = float(reducer(values))
    return out


def accumulate_micro_metrics(micro: list[dict[str, float]]) -> dict[str, float]:
    """Within one mini-batch: loss metrics SUM over micro-batches (each is a share of the global value),
    ratios (clipfrac, ppo_kl, …) a plain MEAN — not token-weighted (chapter §15)."""
    collected: dict[str, list[float]] = defaultdict(list)
    for metrics in micro:
        for k, v in metrics.items():
            collected[k].append(v)
    return {k: float(np.sum(v) if k in SUM_METRICS else np.mean(v)) for k, v in collected.items()}


def train_mini_batches(
    batch: Batch,
    mini_batch_rows: int,
    epochs: int,
    shuffle: bool,
    seed: int,
    micro_batch_size: int | None,
    max_token_len: int | None,
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    clip_grad: float,
    micro_loss: Callable[[Batch, dict[str, Any]], tuple[torch.Tensor, dict[str, float]]],
    dp_size: int = 1,
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    prefix: str = "actor",
    on_optimizer_step: Callable[[int, list[int]], None] | None = None,
    grad_sync: Callable[[list[torch.nn.Parameter]], None] | None = None,
) -> list[dict[str, float]]:
    """verl's ``train_mini_batch``: for every epoch and mini-batch one optimizer step.

    Per mini-batch: zero grad; ``batch_num_tokens`` = Σ loss_mask over the *global* mini-batch (summed
    over ranks) and ``global_batch_size`` = mini × n are computed **before** the micro-batch loop; each
    micro-batch's loss is normalised by them and back-propagated (gradients accumulate); then clip the
    global grad norm and step — or skip the step if the norm is not finite. Returns one metrics dict
    per optimizer step.
    """
    local_rows = mini_batch_rows // dp_size
    step_metrics = []
    for epoch, minis in enumerate(mini_batch_indices(len(batch), local_rows, epochs, shuffle, seed)):
        for rows in minis:
            mini = batch.select(rows)
            optimizer.zero_grad(set_to_none=True)
            num_tokens = mini["loss_mask"].sum()
            if all_reduce_sum is not None:
                num_tokens = all_reduce_sum(num_tokens)
            global_info = {"dp_size": dp_size, "batch_num_tokens": float(num_tokens),
                           "global_batch_size": mini_batch_rows}
            micro_metrics = []
            total_loss = 0.0
            for micro_rows in micro_batches(mini, micro_batch_size, max_token_len):
                loss, metrics = micro_loss(mini.select(micro_rows), global_info)
                loss.backward()
                total_loss += float(loss.detach())
                micro_metrics.append(metrics)
            if grad_sync is not None:  # data parallel: average gradients over ranks (what DDP/FSDP do)
                grad_sync(params)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_grad)
            if math.isfinite(float(grad_norm)):
                optimizer.step()
            else:  # verl: a non-finite norm skips the update (and the gradients are dropped)
                optimizer.zero_grad(set_to_none=True)
            metrics = accumulate_micro_metrics(micro_metrics)
            metrics.update({f"{prefix}/grad_norm": float(grad_norm), f"{prefix}/loss": total_loss,
                            f"{prefix}/lr": optimizer.param_groups[0]["lr"]})
            step_metrics.append(metrics)
            if on_optimizer_step is not None:
                on_optimizer_step(len(step_metrics) - 1, [int(r) for r in rows])
    return step_metrics
