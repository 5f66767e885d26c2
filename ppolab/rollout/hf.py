"""The Hugging Face ``generate`` rollout engine (CPU or GPU), sharing the actor's weights."""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from ppolab.algos import scale_logits
from ppolab.algos.logprob import top_k_top_p_filter
from ppolab.batch import pad_right
from ppolab.rollout.base import RolloutOutput, SamplingParams, eos_token_ids, left_pad, response_mask_from_ids


class HFRollout:
    """Samples with ``model.generate`` on the actor (LoRA adapter active).

    ``rollout_log_probs`` come from the *raw* logits of each step divided by the temperature (recorded step by
    step in :func:`generate_tokens`, never as a (rows, length, vocab) history) — ``output_scores`` would give
    scores after top-p/top-k processing (see the environment notes) — so they measure the same
    temperature-scaled policy the trainer recomputes.

    ``dtype`` (``actor_rollout_ref.rollout.dtype``): None generates in the weights' own dtype, so on fp32 weights
    rollout and old log-probs agree to ~1e-6; ``"bfloat16"`` / ``"float16"`` generate under ``torch.autocast``
    — matmuls, and so the logits the log-probs come from, in half precision while the trainer recomputes in
    fp32. That is verl's default pairing (a bf16 vLLM rollout, an fp32 FSDP trainer) and a real off-policy gap
    for rollout correction to measure (chapter §2).

    Sampling is what the config says and nothing else: during ``generate`` the model's own ``generation_config``
    (a checkpoint's repetition penalty, top-k, min-new-tokens, …, which ``generate`` would otherwise merge into
    every call) is swapped for a neutral one holding only the special token ids, and temperature / top-p / top-k
    are passed explicitly. With top-p < 1 or top-k > 0 the log-probs are those of the filtered distribution the
    tokens were drawn from (:func:`~ppolab.algos.logprob.top_k_top_p_filter`, like vLLM's ``processed_logprobs``);
    the trainer's recomputation is unfiltered, as verl's is.
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
        repeated = [list(p) for p in prompt_ids for _ in range(n)]
        prompts, prompt_mask = left_pad(repeated, self.tokenizer.pad_token_id)
        autocast = (torch.autocast(device_type=self.models.device.type, dtype=self.autocast_dtype)
                    if self.autocast_dtype is not None else contextlib.nullcontext())
        with self.models.actor() as model, autocast:
            responses, log_probs, response_mask = generate_tokens(model, self.tokenizer, repeated,
                                                                  max_response_length, sampling, self.eos_ids,
                                                                  self.chunk_size)
        return RolloutOutput(prompts, prompt_mask, responses, response_mask, log_probs * response_mask)


@torch.no_grad()
def generate_tokens(model, tokenizer, contexts: Sequence[Sequence[int]], max_new_tokens: int,
                    sampling: SamplingParams, stop_ids: Sequence[int], chunk_size: int = 512
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The one batched ``model.generate`` of ppolab (the hf engine, the tool agent's turns, ``ppolab.eval``).

    ``contexts`` are left-padded and generated ``chunk_size`` rows at a time, in eval mode, under the neutral
    generation config, with every sampling knob passed explicitly. Returns ``(tokens, log_probs, mask)``, each
    (N, L) on the CPU, right-padded with the pad id: the new tokens; their temperature-scaled log-probs from the
    raw logits (after top-k / top-p filtering when those are on — the distribution the token was drawn from); and
    1 up to and including the first stop id (EOS, or the agent's ``<|/tool_call|>``), 0 after.

    The log-probs are taken step by step (:class:`SampledLogProbs`), so generation holds one (rows, V) float32 row
    of logits beside the model, never the (rows, L, V) history ``output_logits`` would keep.
    """
    pad = tokenizer.pad_token_id
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    draw = sampling.do_sample and vocab >= DRAW_VOCAB  # ppolab draws the tokens itself (SampledLogProbs)
    kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=list(stop_ids),
                  do_sample=sampling.do_sample and not draw)
    if sampling.do_sample and not draw:
        # transformers fills an unset top_k with 50; 0 switches it off (verl's -1).
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=sampling.top_k if sampling.top_k > 0 else 0)
    device = next(model.parameters()).device
    chunks = []
    was_training = model.training
    model.eval()
    try:
        with neutral_generation_config(model, tokenizer):
            for start in range(0, len(contexts), chunk_size):
                ids, mask = left_pad(contexts[start:start + chunk_size], pad)
                recorder = SampledLogProbs(sampling, draw=draw)
                sequences = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                           logits_processor=LogitsProcessorList([recorder]), **kwargs)
                new = sequences[:, ids.shape[1]:]
                chunks.append((new.cpu(), recorder.log_probs(new).cpu()))
    finally:
        model.train(was_training)
    width = max(t.shape[1] for t, _ in chunks)
    tokens = torch.cat([pad_right(t, width, pad) for t, _ in chunks])
    log_probs = torch.cat([pad_right(lp, width) for _, lp in chunks])
    mask = response_mask_from_ids(tokens, stop_ids)
    return torch.where(mask.bool(), tokens, torch.full_like(tokens, pad)), log_probs, mask


class SampledLogProbs(LogitsProcessor):
    """Records log π(token) of each sampled token during ``generate``, one step at a time (chapter §2).

    ``generate`` calls a logits processor with the step's raw float32 logits (rows, V) — under the neutral
    generation config no other processor runs before it; transformers appends temperature / top-k / top-p after
    the user's processors — and *before* it samples. So each call keeps that step's scaled (and, with a filter
    on, filtered) logits ``z`` and their logsumexp until the next call, whose ``input_ids`` end with the token
    that was drawn: log π = z[token] − logsumexp(z), exactly :func:`~ppolab.algos.logprobs_from_logits` on the
    one row. The last step's token is read from the finished sequences in :meth:`log_probs`. Memory: one
    (rows, V) row plus (rows,) per step. Returns ``scores`` unchanged, so sampling is untouched.
    """

    def __init__(self, sampling: SamplingParams, draw: bool = False):
        self.temperature = sampling.temperature if sampling.do_sample else 1.0
        self.top_k, self.top_p = sampling.top_k, sampling.top_p
        self.filtered = sampling.do_sample and (sampling.top_k > 0 or sampling.top_p < 1.0)
        self.draw = draw
        self.steps: list[torch.Tensor] = []  # (rows,) log-probs of the tokens drawn so far
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None  # (z (rows, V), logsumexp (rows,))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self.steps.append(self._pick(input_ids[:, -1]))
        # when drawing at temperature 1, z is the scores themselves (read before they are overwritten below)
        z = scores.float() if self.draw and self.temperature == 1.0 else scale_logits(scores.float(), self.temperature)
        if self.filtered:  # the distribution the token is drawn from: temperature, then top-k, then top-p
            z = top_k_top_p_filter(z, self.top_k, self.top_p)
        if not self.draw:
            self.pending = (z, torch.logsumexp(z, dim=-1))
            return scores
        tokens, log_probs = draw_from_logits(z)
        self.steps.append(log_probs)
        # generate runs greedy here: a row whose only finite score is the drawn token picks exactly that token
        return scores.fill_(float("-inf")).scatter_(-1, tokens[:, None], 0.0)

    def _pick(self, tokens: torch.Tensor) -> torch.Tensor:
        """log π of ``tokens`` (rows,) under the pending step's distribution, as a (rows,) tensor."""
        z, lse = self.pending
        return torch.gather(z, -1, tokens[:, None]).squeeze(-1) - lse

    def log_probs(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(rows, L) log-probs of ``new_tokens`` (rows, L), the tokens ``generate`` added."""
        length = new_tokens.shape[1]
        if len(self.steps) < length:  # the last drawn token no call saw
            self.steps.append(self._pick(new_tokens[:, len(self.steps)]))
        self.pending = None
        if length == 0:
            return new_tokens.new_zeros(new_tokens.shape, dtype=torch.float32)
        # a stop check that ran a step past the end (transformers defers it on some devices) is cut off here
        return torch.stack(self.steps[:length], dim=1)


#: From this vocabulary size on, the hf engine draws each token itself (:func:`draw_from_logits`) instead of
#: ``generate``'s ``torch.multinomial``, which on CPU draws one exponential variate per vocabulary entry and row
#: (62 % of a decode step at 151,936 tokens). The shipped tiny models (29 tokens) stay below it, so their runs
#: keep the random stream they were recorded with.
DRAW_VOCAB = 1 << 15


def draw_from_logits(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from softmax(z), and its log-probability, by the inverse CDF: u ~ U[0, 1) per row, the
    first token whose cumulative probability exceeds u·total — exactly the categorical distribution (a −inf logit
    has zero width and is never drawn), with one uniform per row from torch's global generator, as ``generate``'s
    sampling uses it. Shapes: z (rows, V) float32, temperature-scaled and filtered — overwritten (z − max) → tokens
    (rows,) int64, log π(token) (rows,) = (z − max)[token] − log Σ e^{z − max}, computed from the same pass. Four
    passes over the row (max, shift, exp, cumsum) and a binary search, where ``torch.multinomial`` makes V random
    numbers a row and the log-prob record a logsumexp of its own."""
    shifted = z.sub_(z.amax(dim=-1, keepdim=True))
    cdf = torch.exp(shifted).cumsum_(dim=-1)
    total = cdf[:, -1:]
    u = torch.rand(z.shape[0], 1, device=z.device, dtype=cdf.dtype) * total
    tokens = torch.searchsorted(cdf, u, right=True).clamp_(max=z.shape[-1] - 1)
    return tokens.squeeze(-1), (shifted.gather(-1, tokens) - total.log()).squeeze(-1)


@contextlib.contextmanager
def neutral_generation_config(model, tokenizer) -> Iterator[None]:
    """Swap the HF model's ``generation_config`` (under any peft wrapper) for one with only the special ids, so
    ``generate`` fills unset knobs from transformers' global defaults, never from the checkpoint's file."""
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    own = hf_model.generation_config
    hf_model.generation_config = GenerationConfig(
        bos_token_id=own.bos_token_id if own.bos_token_id is not None else tokenizer.bos_token_id,
        eos_token_id=own.eos_token_id if own.eos_token_id is not None else tokenizer.eos_token_id,
        pad_token_id=own.pad_token_id if own.pad_token_id is not None else tokenizer.pad_token_id,
    )
    try:
        yield
    finally:
        hf_model.generation_config = own


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
