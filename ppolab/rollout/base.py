"""What every rollout engine returns, and the padding conventions the trainer relies on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch


@dataclass
class SamplingParams:
    """verl's rollout sampling knobs; ``do_sample=False`` is greedy (validation)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True


@dataclass
class RolloutOutput:
    """N = prompts × n trajectories; prompts left-padded to P, responses right-padded to R.

    ``response_mask`` is 1 on every generated token up to and including the first EOS, 0 on padding.
    ``rollout_log_probs`` are the engine's own log π_rollout of each sampled token (0 where masked).
    """

    prompts: torch.Tensor  # (N, P) long
    prompt_mask: torch.Tensor  # (N, P) long
    responses: torch.Tensor  # (N, R) long
    response_mask: torch.Tensor  # (N, R) float
    rollout_log_probs: torch.Tensor  # (N, R) float
    #: 1 on every token the model attends to — policy tokens and spliced tool observations — when it differs
    #: from response_mask (multi-turn); None for single-turn rollouts, where the two are the same.
    response_attention_mask: torch.Tensor | None = None  # (N, R) float


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams,
                 max_response_length: int) -> RolloutOutput:
        """Sample ``n`` responses per prompt; trajectories of one prompt are adjacent (repeat-interleave)."""

    def sync_weights(self) -> None:
        """Make the engine generate with the actor's current weights (a no-op when it shares the model)."""


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id generation stops at: the model's ``generation_config.eos_token_id`` (an int or a list) and the
    tokenizer's EOS, sorted, without None."""
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(gen_eos if isinstance(gen_eos, list) else [gen_eos]) | {tokenizer.eos_token_id}
    return sorted(i for i in ids if i is not None)


def left_pad(prompt_ids: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask), both (B, max_len), prompts aligned to the right edge."""
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):
        if len(p):
            ids[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


def response_mask_from_ids(responses: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after it (float, (N, R))."""
    is_eos = torch.isin(responses, torch.as_tensor(list(eos_ids), dtype=responses.dtype))
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # strictly after the first EOS
    return (~after_eos).float()
