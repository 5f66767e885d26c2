"""The vLLM rollout engine (GPU only), colocated with training, LoRA weights pushed as adapters.

Each step the actor's current LoRA adapter is saved with ``save_pretrained`` to a scratch folder and handed
to vLLM as a ``LoRARequest`` with a fresh integer id (a new adapter version), so vLLM never merges weights
and never serves a stale adapter. Between rollouts the engine sleeps (``enable_sleep_mode``) to give the
training step its GPU memory back, and wakes before the next ``generate``.

``rollout_log_probs`` are vLLM's own log-probs of the sampled tokens (``logprobs=0``: the sampled token
only), taken after temperature scaling (``logprobs_mode="processed_logprobs"``), so with top_p = 1 and
top_k = -1 they estimate the same temperature-scaled policy the trainer recomputes; the gap between the
two is what ``rollout_is`` corrects (chapter §2–§3).

Not exercised by the CPU test suite: no GPU is available there. Importing this module needs vllm.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

import torch

from ppolab.rollout.base import RolloutOutput, SamplingParams, eos_token_ids, left_pad, response_mask_from_ids


class VLLMRollout:
    """Generation with ``vllm.LLM`` on the base model plus the actor's LoRA adapter."""

    def __init__(self, models, rollout_config, seed: int = 0, max_model_len: int | None = None):
        from vllm import LLM

        if not models.lora:
            raise ValueError("actor_rollout_ref.rollout.name=vllm in ppolab pushes the actor as a LoRA adapter; "
                             "set actor_rollout_ref.model.lora_rank > 0 (or use rollout.name=hf for full fine-tuning)")
        self.models = models
        self.tokenizer = models.tokenizer
        cfg = models.model.peft_config["actor"]
        self.llm = LLM(
            model=str(models.path), dtype=str(models.dtype).replace("torch.", ""), seed=seed,
            enable_lora=True, max_lora_rank=max(int(cfg.r), 8), max_loras=1,
            gpu_memory_utilization=rollout_config.gpu_memory_utilization, enforce_eager=rollout_config.enforce_eager,
            enable_sleep_mode=True, max_model_len=max_model_len, logprobs_mode="processed_logprobs",
        )
        self._scratch = tempfile.TemporaryDirectory(prefix="ppolab-vllm-lora-")
        self._version = 0
        self._asleep = False
        self.sync_weights()
        self.eos_ids = eos_token_ids(models.model, self.tokenizer)

    def sync_weights(self) -> None:
        """Save the actor adapter as a new version; the next ``generate`` uses it."""
        from vllm.lora.request import LoRARequest

        self._version += 1
        folder = Path(self._scratch.name) / f"v{self._version}"
        self.models.model.save_pretrained(str(folder), selected_adapters=["actor"])
        path = folder / "actor" if (folder / "actor").is_dir() else folder  # peft nests non-default adapters
        self.lora_request = LoRARequest(f"actor-v{self._version}", self._version, str(path))
        if not self._asleep:
            self.llm.sleep(level=1)  # free KV cache and offload weights while the trainer runs
            self._asleep = True

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams,
                 max_response_length: int) -> RolloutOutput:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        params = VSamplingParams(
            n=n, max_tokens=max_response_length, logprobs=0, stop_token_ids=self.eos_ids,
            temperature=sampling.temperature if sampling.do_sample else 0.0,
            top_p=sampling.top_p if sampling.do_sample else 1.0,
            top_k=sampling.top_k if (sampling.do_sample and sampling.top_k > 0) else -1,
        )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids], params,
                                    lora_request=self.lora_request, use_tqdm=False)
        pad = self.tokenizer.pad_token_id
        responses, log_probs = [], []
        for out in outputs:  # vLLM keeps the input order; the n samples of a prompt are adjacent
            for sample in out.outputs:
                ids = list(sample.token_ids)[:max_response_length]
                lps = [step[token].logprob for token, step in zip(ids, sample.logprobs or [])]
                responses.append(ids)
                log_probs.append(lps + [0.0] * (len(ids) - len(lps)))
        width = max(1, max(len(r) for r in responses))
        resp = torch.full((len(responses), width), pad, dtype=torch.long)
        lp = torch.zeros(len(responses), width)
        for i, (ids, lps) in enumerate(zip(responses, log_probs)):
            resp[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            lp[i, : len(lps)] = torch.as_tensor(lps)
        prompts, prompt_mask = left_pad([list(p) for p in prompt_ids for _ in range(n)], pad)
        response_mask = response_mask_from_ids(resp, self.eos_ids)
        lengths = torch.tensor([len(r) for r in responses])
        response_mask = response_mask * (torch.arange(width) < lengths[:, None]).float()
        resp = torch.where(response_mask.bool(), resp, torch.full_like(resp, pad))
        self.llm.sleep(level=1)
        self._asleep = True
        return RolloutOutput(prompts, prompt_mask, resp, response_mask, lp * response_mask)
