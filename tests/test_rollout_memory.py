"""Generation keeps the sampled tokens' log-probs step by step, not every step's logits (issue 23).

``generate_tokens`` used to ask ``generate`` for ``output_logits`` — a (rows, length, vocab) float32 history, then
stacked and scaled (three copies; ≈ 29 GiB at Qwen2.5's 151,936 tokens × 64 rows × 256 tokens). These tests pin
the step-by-step version to that old one, token for token and bit for bit, and show its memory no longer grows
with length × vocab.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from ppolab.algos import logprobs_from_logits, scale_logits
from ppolab.algos.logprob import top_k_top_p_filter
from ppolab.batch import pad_right
from ppolab.models import SHIPPED_MODEL, load_tokenizer_and_model
from ppolab.rollout.base import SamplingParams, eos_token_ids, left_pad, response_mask_from_ids
from ppolab.rollout.hf import generate_tokens, neutral_generation_config

QUESTIONS = ["What is 12+7?", "What is 93-48?", "What is 5+5?", "What is 70-9?", "What is 41+58?", "What is 8-3?"]
SAMPLINGS = {
    "greedy": SamplingParams(do_sample=False),
    "T=1.0": SamplingParams(temperature=1.0),
    "T=0.7": SamplingParams(temperature=0.7),
    "T=1.0 top-k": SamplingParams(temperature=1.0, top_k=5),
    "T=0.7 top-p": SamplingParams(temperature=0.7, top_p=0.8),
    "T=0.7 top-k top-p": SamplingParams(temperature=0.7, top_k=4, top_p=0.9),
}


@torch.no_grad()
def old_generate_tokens(model, tokenizer, contexts, max_new_tokens, sampling, stop_ids, chunk_size=512):
    """The pre-issue-23 ``generate_tokens``, verbatim: log-probs from the stacked ``output_logits`` history."""
    pad = tokenizer.pad_token_id
    kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=list(stop_ids),
                  do_sample=sampling.do_sample, output_logits=True, return_dict_in_generate=True)
    if sampling.do_sample:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=sampling.top_k if sampling.top_k > 0 else 0)
    temperature = sampling.temperature if sampling.do_sample else 1.0
    filtered = sampling.do_sample and (sampling.top_k > 0 or sampling.top_p < 1.0)
    device = next(model.parameters()).device
    chunks = []
    was_training = model.training
    model.eval()
    try:
        with neutral_generation_config(model, tokenizer):
            for start in range(0, len(contexts), chunk_size):
                ids, mask = left_pad(contexts[start:start + chunk_size], pad)
                out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
                new = out.sequences[:, ids.shape[1]:]
                logits = scale_logits(torch.stack(out.logits, dim=1).float(), temperature)
                if filtered:
                    logits = top_k_top_p_filter(logits, sampling.top_k, sampling.top_p)
                chunks.append((new.cpu(), logprobs_from_logits(logits, new).cpu()))
    finally:
        model.train(was_training)
    width = max(t.shape[1] for t, _ in chunks)
    tokens = torch.cat([pad_right(t, width, pad) for t, _ in chunks])
    log_probs = torch.cat([pad_right(lp, width) for _, lp in chunks])
    mask = response_mask_from_ids(tokens, stop_ids)
    return torch.where(mask.bool(), tokens, torch.full_like(tokens, pad)), log_probs, mask


@pytest.fixture(scope="module")
def shipped():
    tok, model = load_tokenizer_and_model(SHIPPED_MODEL)
    contexts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
                for q in QUESTIONS]
    contexts = [list(c["input_ids"]) if hasattr(c, "keys") else list(c) for c in contexts]
    return tok, model, [c for c in contexts for _ in range(3)], eos_token_ids(model, tok)


@pytest.mark.parametrize("name", list(SAMPLINGS))
@pytest.mark.parametrize("chunk_size", [512, 7])  # one generate call, and several of unequal length
def test_same_tokens_and_log_probs_as_the_output_logits_version(shipped, name, chunk_size):
    tok, model, contexts, stop = shipped
    results = []
    for fn in (old_generate_tokens, generate_tokens):
        torch.manual_seed(1234)
        results.append(fn(model, tok, contexts, 24, SAMPLINGS[name], stop, chunk_size))
    (old_t, old_lp, old_m), (new_t, new_lp, new_m) = results
    assert torch.equal(new_t, old_t) and torch.equal(new_m, old_m)
    assert new_lp.shape == old_lp.shape and new_lp.dtype == old_lp.dtype == torch.float32
    assert torch.equal(new_lp, old_lp), float((new_lp - old_lp).abs().max())  # bitwise, padding included
    assert bool(old_m[:, -1].eq(0).any()) or name != "greedy"  # some row stopped early: EOS handling is exercised


def test_sampling_and_filters_really_differ(shipped):
    """The comparison above is not vacuous: the settings draw different tokens and filtered log-probs are larger."""
    tok, model, contexts, stop = shipped
    outs = {}
    for name in ("T=0.7", "T=0.7 top-k top-p"):
        torch.manual_seed(1234)
        outs[name] = generate_tokens(model, tok, contexts, 24, SAMPLINGS[name], stop)
    plain, filt = outs["T=0.7"], outs["T=0.7 top-k top-p"]
    assert float(plain[1][:, 0].max()) < 0 and float(filt[1][:, 0].max()) <= 0
    width = min(plain[1].shape[1], filt[1].shape[1])
    both = (plain[2][:, :width] * filt[2][:, :width]).bool() & (plain[0][:, :width] == filt[0][:, :width])
    assert bool((filt[1][:, :width][both] >= plain[1][:, :width][both] - 1e-6).all())


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any op returns while active."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("sampling", [SAMPLINGS["greedy"], SAMPLINGS["T=0.7 top-k top-p"]], ids=["greedy", "top-k-p"])
def test_no_rows_by_length_by_vocab_tensor_is_made(sampling):
    """A 1-layer model with a 20,000-token vocabulary (random weights; the stop id is out of vocabulary, so every row
    runs the full length):
    the largest tensor generation makes is one step's (rows, vocab) logits, not the (rows, length, vocab)
    history. The old version fails here at its ``torch.stack`` of ``output_logits``."""
    vocab, rows, length, hidden = 20_000, 8, 40, 8  # hidden ≤ rows: the (vocab, hidden) embedding is no larger
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = Qwen2ForCausalLM(config)

    class Tok:  # the two ids generate_tokens reads from a tokenizer
        pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    contexts = [[1, 5 + r, 9, 11] for r in range(rows)]
    results = {}
    for fn in (old_generate_tokens, generate_tokens):
        torch.manual_seed(7)
        with LargestTensor() as seen:
            results[fn] = fn(model, Tok, contexts, length, sampling, [vocab + 1])
        results[fn] = (*results[fn], seen.numel)
    new_tokens, new_lp, _, new_largest = results[generate_tokens]
    old_tokens, old_lp, _, old_largest = results[old_generate_tokens]
    assert new_tokens.shape == (rows, length) and torch.equal(new_tokens, old_tokens) and torch.equal(new_lp, old_lp)
    assert old_largest >= rows * length * vocab  # the history the old version built
    assert new_largest <= rows * vocab  # one step's logits, whatever the length
