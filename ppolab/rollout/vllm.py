"""The vLLM rollout engine, colocated with training, the actor's LoRA pushed as a fresh adapter each step.

After every update the actor adapter is saved with ``save_pretrained`` to a scratch folder and handed to
vLLM as a ``LoRARequest`` with a new integer id (a new adapter version), so vLLM never merges weights and
never serves a stale adapter. With ``free_cache_engine`` the engine sleeps between rollouts (level 1: KV
cache freed, weights offloaded) to give the training step its GPU memory back, and wakes before the next
``generate``; vLLM's CPU build has no sleep mode, so there the flag is a no-op.

``rollout_log_probs`` are vLLM's own log-probs of the sampled tokens (``logprobs=0``: the sampled token
only), taken after temperature scaling and top-k/top-p filtering (``logprobs_mode="processed_logprobs"``),
so they are log π_rollout of the distribution the tokens were really drawn from. The trainer recomputes
the same quantity with its own kernels; the gap between the two is what ``rollout_is`` corrects (chapter
§2–§3, lab 02).

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as verl's colocated rollout does):
no second CUDA context, no ``if __name__ == "__main__"`` requirement in a notebook or a script. Under torchrun on
GPUs it uses vLLM's ``external_launcher`` executor, which puts each rank's engine on ``cuda:LOCAL_RANK`` (the
default in-process executor would put every rank's engine on GPU 0).

One engine per process: vLLM's sleep-mode allocator serves one engine per process, and every engine holds its
weights and KV cache until released. Starting a second engine (a second ``ppolab.train`` in a notebook, a test
module that keeps one alive) first closes the live one — shut down, references dropped, memory returned — so the
new run starts from a clean engine with its own seed and adapter ids (reusing the old engine would carry its
random state and its cache of adapter ids into the new run). The closed engine refuses to generate.

Sampling is exactly what the config says: ``generation_config="vllm"`` (vLLM's neutral defaults, never the model's
``generation_config.json``) and every knob passed explicitly, as verl's ``override_generation_config`` does.
"""
from __future__ import annotations

import gc
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import torch

from ppolab.batch import pad_right
from ppolab.rollout.base import RolloutOutput, SamplingParams, eos_token_ids, left_pad, response_mask_from_ids

#: LoRA ranks vLLM can serve; the engine reserves the next one up from the adapter's rank.
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM supports that holds an adapter of ``rank``."""
    for r in VLLM_LORA_RANKS:
        if rank <= r:
            return r
    raise ValueError(f"actor_rollout_ref.model.lora_rank={rank} is above vLLM's largest LoRA rank "
                     f"{VLLM_LORA_RANKS[-1]}")


#: The vLLM releases this engine is written and tested against (the CPU build 0.32; 0.33 on CUDA). pyproject's
#: ``gpu`` extra pins the same range.
SUPPORTED_VLLM = ">=0.32,<0.34"


def vllm_api() -> SimpleNamespace:
    """Every vLLM name this engine uses, imported in one place. vLLM moves its internals between releases (the
    LoRA request class, the in-process engine core, the platform object); when one moved, say which and what to
    install instead of failing deep inside a rollout."""
    import vllm

    try:
        from vllm import LLM
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest
        from vllm.platforms import current_platform
    except ImportError as e:
        raise ImportError(f"ppolab's vLLM engine needs vllm{SUPPORTED_VLLM}; the installed vllm {vllm.__version__} "
                          f"does not provide {e.name or e}: pip install 'ppolab[gpu]' (pins that range)") from e
    return SimpleNamespace(LLM=LLM, SamplingParams=VSamplingParams, TokensPrompt=TokensPrompt,
                           LoRARequest=LoRARequest, platform=current_platform, version=vllm.__version__)


def shutdown_llm(llm) -> None:
    """Stop an in-process ``vllm.LLM``'s engine core now (its workers, process groups, cached memory). vLLM has no
    public call for it; this is the private path of the supported releases."""
    try:
        core = llm.llm_engine.engine_core
    except AttributeError as e:
        raise RuntimeError(f"cannot shut the vLLM engine down: vllm.LLM has no llm_engine.engine_core here ({e}); "
                           f"ppolab's engine supports vllm{SUPPORTED_VLLM}") from None
    core.shutdown()


def vllm_executor_backend(world_size: int, device_type: str) -> str | None:
    """vLLM's ``distributed_executor_backend`` for an in-process engine on one rank. Under torchrun on GPUs,
    ``external_launcher``: the engine joins the launcher's ranks and takes ``cuda:LOCAL_RANK``. Otherwise None
    (vLLM's default one-process executor; on CPU the gloo ranks share the machine anyway)."""
    return "external_launcher" if world_size > 1 and device_type == "cuda" else None


def vllm_sampling_kwargs(n: int, sampling: SamplingParams, max_tokens: int, stop_token_ids: list[int]) -> dict:
    """verl's sampling knobs in vLLM's spelling, every one explicit. Greedy is temperature 0; vLLM's "off" for
    top-k is -1 too; penalties and min-p off (verl's ``override_generation_config`` sets repetition_penalty 1.0).
    No detokenizing: the trainer reads token ids (and a model's vocabulary may be padded past its tokenizer's)."""
    greedy = not sampling.do_sample
    return dict(n=n, max_tokens=max_tokens, logprobs=0, stop_token_ids=list(stop_token_ids),
                temperature=0.0 if greedy else sampling.temperature, top_p=1.0 if greedy else sampling.top_p,
                top_k=-1 if greedy or sampling.top_k <= 0 else sampling.top_k, min_p=0.0, repetition_penalty=1.0,
                presence_penalty=0.0, frequency_penalty=0.0, detokenize=False)


#: The engine alive in this process (at most one): a new one closes it first.
_live: VLLMRollout | None = None


def release_live_engine() -> None:
    """Close this process's live vLLM engine, if any (what a new engine does before it starts)."""
    global _live
    if _live is not None:
        _live.close()
        _live = None


class VLLMRollout:
    """Generation with ``vllm.LLM`` on the base model plus the actor's current LoRA adapter."""

    def __init__(self, models, rollout_config, seed: int = 0, max_model_len: int | None = None):
        global _live
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        api = vllm_api()
        if not models.lora:
            raise ValueError("actor_rollout_ref.rollout.name=vllm in ppolab pushes the actor as a LoRA adapter; "
                             "set actor_rollout_ref.model.lora_rank > 0 (or use rollout.name=hf for full fine-tuning)")
        release_live_engine()  # one engine per process: the previous one gives its memory back first
        self.api = api
        self.models = models
        self.tokenizer = models.tokenizer
        self.sleep_enabled = bool(rollout_config.free_cache_engine) and api.platform.is_sleep_mode_available()
        self.llm = None
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        backend = vllm_executor_backend(world_size, torch.device(models.device).type)
        self.llm = api.LLM(
            model=str(models.path), tokenizer=str(models.path), dtype=str(models.dtype).replace("torch.", ""),
            seed=seed, enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(int(models.lora_rank)),
            gpu_memory_utilization=rollout_config.gpu_memory_utilization, enforce_eager=rollout_config.enforce_eager,
            enable_sleep_mode=self.sleep_enabled, max_model_len=rollout_config.max_model_len or max_model_len,
            logprobs_mode="processed_logprobs", generation_config="vllm",
            **({"distributed_executor_backend": backend} if backend else {}),
        )
        _live = self
        self.eos_ids = eos_token_ids(models.model, self.tokenizer)
        self._scratch = tempfile.TemporaryDirectory(prefix="ppolab-vllm-lora-")
        self.version = 0  # the adapter version vLLM serves; +1 per sync
        self._asleep = False
        self.sync_weights()

    def sync_weights(self) -> None:
        """Save the actor adapter as a new version; the next ``generate`` uses it."""
        self._check_open()
        self.version += 1
        folder = Path(self._scratch.name) / f"v{self.version}"
        self.models.model.save_pretrained(str(folder), selected_adapters=["actor"])
        path = folder / "actor" if (folder / "actor").is_dir() else folder  # peft nests non-default adapters
        self.lora_request = self.api.LoRARequest(f"actor-v{self.version}", self.version, str(path))
        # v-1 is what vLLM served last; v-2 will never be asked for again, so its files can go
        old = Path(self._scratch.name) / f"v{self.version - 2}"
        shutil.rmtree(old, ignore_errors=True)
        self._sleep()

    @property
    def closed(self) -> bool:
        return self.llm is None

    def _check_open(self) -> None:
        if self.llm is None:
            raise RuntimeError("this vLLM engine was closed (a process holds one engine; a newer one released it, or "
                               "the training that owned it ended): build a new rollout engine")

    def close(self) -> None:
        """Shut the engine down now — its memory, its process groups — instead of at interpreter exit, where
        vLLM's cleanup would run after the trainer has left its process group. The weights and KV cache are freed
        here (references dropped, garbage collected, CUDA cache emptied), so the next engine in this process
        starts on empty memory — what vLLM's sleep-mode allocator requires. Safe to call twice."""
        global _live
        if self.llm is None:
            return
        shutdown_llm(self.llm)
        self.llm = None
        self.lora_request = None
        if _live is self:
            _live = None
        self._scratch.cleanup()
        gc.collect()  # the engine's objects hold reference cycles; collect them now, not at some later point
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _sleep(self) -> None:
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=1)  # free the KV cache, offload weights while the trainer runs
            self._asleep = True

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams,
                 max_response_length: int) -> RolloutOutput:
        self._check_open()
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        params = self.api.SamplingParams(**vllm_sampling_kwargs(n, sampling, max_response_length, self.eos_ids))
        outputs = self.llm.generate([self.api.TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids], params,
                                    lora_request=self.lora_request, use_tqdm=False)
        self._sleep()
        samples = [s for out in outputs for s in out.outputs]  # input order kept; a prompt's n samples adjacent
        return rollout_output_from_samples(prompt_ids, n, samples, self.tokenizer.pad_token_id, self.eos_ids,
                                           max_response_length)


def rollout_output_from_samples(prompt_ids: Sequence[Sequence[int]], n: int, samples: Sequence, pad_id: int,
                                eos_ids: Sequence[int], max_response_length: int) -> RolloutOutput:
    """vLLM ``CompletionOutput``s (``token_ids``, ``logprobs``: one {token_id: Logprob} per step) → the trainer's
    padded tensors. Everything after the first EOS is padding with mask 0 and log-prob 0."""
    rows, lps = [], []
    for s in samples:
        ids = list(s.token_ids)[:max_response_length]
        steps = list(s.logprobs or [])
        if len(steps) < len(ids):
            raise RuntimeError(f"vLLM returned {len(steps)} log-probs for {len(ids)} sampled tokens; the engine must "
                               "run with logprobs=0")
        rows.append(torch.as_tensor(ids, dtype=torch.long))
        lps.append(torch.as_tensor([step[t].logprob for t, step in zip(ids, steps)], dtype=torch.float32))
    width = max(1, max(len(r) for r in rows))
    responses = torch.stack([pad_right(r, width, pad_id) for r in rows]).long()
    log_probs = torch.stack([pad_right(lp, width) for lp in lps])
    lengths = torch.tensor([len(r) for r in rows])
    mask = response_mask_from_ids(responses, eos_ids) * (torch.arange(width) < lengths[:, None]).float()
    responses = torch.where(mask.bool(), responses, torch.full_like(responses, pad_id))
    prompts, prompt_mask = left_pad([list(p) for p in prompt_ids for _ in range(n)], pad_id)
    return RolloutOutput(prompts, prompt_mask, responses, mask, log_probs * mask)
