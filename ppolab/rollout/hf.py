"""The Hugging Face ``generate`` rollout engine (CPU or GPU), sharing the actor's weights."""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from ppolab.algos import logprobs_from_logits, scale_logits
from ppolab.engine import pad_right
from ppolab.rollout.base import RolloutOutput, SamplingParams, eos_token_ids, left_pad, response_mask_from_ids


class HFRollout:
    """Samples with ``model.generate`` on the actor (LoRA adapter active).

    ``rollout_log_probs`` come from the *raw* logits the engine returned (``output_logits=True``) divided
    by the temperature — ``output_scores`` would give scores after top-p/top-k processing (see the
    environment notes) — so they measure the same temperature-scaled policy the trainer recomputes.

    ``dtype`` (``actor_rollout_ref.rollout.dtype``): None generates in the weights' own dtype, so on fp32 weights
    rollout and old log-probs agree to ~1e-6; ``"bfloat16"`` / ``"float16"`` generate under ``torch.autocast``
    — matmuls, and so the logits the log-probs come from, in half precision while the trainer recomputes in
    fp32. That is verl's default pairing (a bf16 vLLM rollout, an fp32 FSDP trainer) and a real off-policy gap
    for rollout correction to measure (chapter §2).
    """

    def __init__(self, models, chunk_size: int = 512, dtype: str | None = None):
        self.models = models
        self.autocast_dtype = _autocast_dtype(models, dtype)
        self.tokenizer = models.tokenizer
        self.chunk_size = chunk_size
        self.eos_ids = eos_token_ids(models.model, self.tokenizer)

    def sync_weights(self) -> None:
        """Nothing to do: generation runs on the very model the optimizer updates."""

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams,
                 max_response_length: int) -> RolloutOutput:
        pad = self.tokenizer.pad_token_id
        repeated = [list(p) for p in prompt_ids for _ in range(n)]
        prompts, prompt_mask = left_pad(repeated, pad)
        kwargs = dict(max_new_tokens=max_response_length, pad_token_id=pad, eos_token_id=self.eos_ids,
                      do_sample=sampling.do_sample, output_logits=True, return_dict_in_generate=True)
        if sampling.do_sample:
            # transformers fills an unset top_k with 50; 0 switches it off (verl's -1).
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k if sampling.top_k > 0 else 0)
        temperature = sampling.temperature if sampling.do_sample else 1.0
        device = self.models.device
        chunks = []
        autocast = (torch.autocast(device_type=self.models.device.type, dtype=self.autocast_dtype)
                    if self.autocast_dtype is not None else contextlib.nullcontext())
        with self.models.actor() as model, autocast:
            was_training = model.training
            model.eval()
            for start in range(0, len(repeated), self.chunk_size):
                ids = prompts[start:start + self.chunk_size].to(device)
                mask = prompt_mask[start:start + self.chunk_size].to(device)
                out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
                responses = out.sequences[:, ids.shape[1]:]
                logits = torch.stack(out.logits, dim=1).float()
                log_probs = logprobs_from_logits(scale_logits(logits, temperature), responses)
                chunks.append((responses.cpu(), log_probs.cpu()))
            model.train(was_training)
        width = max(r.shape[1] for r, _ in chunks)
        responses = torch.cat([pad_right(r, width, pad) for r, _ in chunks])
        log_probs = torch.cat([pad_right(lp, width) for _, lp in chunks])
        response_mask = response_mask_from_ids(responses, self.eos_ids)
        responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad))
        return RolloutOutput(prompts, prompt_mask, responses, response_mask, log_probs * response_mask)


def _autocast_dtype(models, dtype: str | None) -> torch.dtype | None:
    """The autocast dtype of generation: None when ``dtype`` is None or the weights' own dtype."""
    if dtype is None:
        return None
    wanted = getattr(torch, dtype)
    own = next(models.model.parameters()).dtype
    if wanted == own:
        return None
    if own != torch.float32:
        raise ValueError(f"actor_rollout_ref.rollout.dtype={dtype!r} on {own} weights: the hf engine can only lower "
                         "the precision of float32 weights (autocast)")
    return wanted
