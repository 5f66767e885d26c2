"""The hf engine's own token draw at a large vocabulary (ppolab/rollout/hf.py: draw_from_logits, DRAW_VOCAB): it
samples the categorical distribution exactly, never a filtered-out token, and the log-probs it records are the ones
the trainer recomputes; below DRAW_VOCAB (the shipped tiny models) generate's own sampler is kept."""
from __future__ import annotations

import math

import pytest
import torch

from ppolab.rollout.base import SamplingParams
from ppolab.rollout.hf import DRAW_VOCAB, draw_from_logits, generate_tokens


def test_draws_follow_the_softmax_and_never_a_masked_token():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 0.5, float("-inf"), -1.0, 1.0]])
    p = torch.softmax(logits, -1)[0]
    n = 200_000
    tokens, log_probs = draw_from_logits(logits.repeat(n, 1))
    counts = torch.bincount(tokens, minlength=5).double()
    assert counts[2] == 0
    # each share within 5 standard errors of its probability
    se = torch.sqrt(p * (1 - p) / n).double()
    assert ((counts / n - p.double()).abs() <= 5 * se + 1e-12).all(), (counts / n, p)
    torch.testing.assert_close(log_probs, torch.log_softmax(logits, -1)[0][tokens])


def test_a_row_with_one_finite_logit_draws_it():
    z = torch.full((3, 10), float("-inf"))
    z[0, 0], z[1, 9], z[2, 4] = 3.0, -50.0, 0.0
    tokens, log_probs = draw_from_logits(z)
    assert tokens.tolist() == [0, 9, 4] and torch.equal(log_probs, torch.zeros(3))


class Tok:
    pad_token_id, bos_token_id, eos_token_id = 0, None, 1


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7),
                                      SamplingParams(temperature=1.0, top_k=50, top_p=0.9)])
def test_recorded_log_probs_at_a_large_vocabulary_are_the_trainers(sampling):
    from transformers import AutoModelForCausalLM, Qwen2Config

    from ppolab.algos.logprob import top_k_top_p_filter
    from ppolab.models import shifted_logits

    torch.manual_seed(0)
    vocab = DRAW_VOCAB + 7
    model = AutoModelForCausalLM.from_config(Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)).float()
    contexts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    tokens, log_probs, mask = generate_tokens(model, Tok(), contexts, 6, sampling, [1])
    assert tokens.shape == (3, 6) and mask.sum() > 0
    # the trainer's view: the same forward on prompt ‖ response, the distribution the token was drawn from
    from ppolab.rollout.base import left_pad

    ids, attn = left_pad([c + t.tolist() for c, t in zip(contexts, tokens)], Tok.pad_token_id)
    ids = torch.as_tensor(ids)
    attn = torch.as_tensor(attn)
    z = shifted_logits(model, ids, attn, 6).float() / sampling.temperature
    if sampling.top_k > 0 or sampling.top_p < 1.0:
        z = top_k_top_p_filter(z, sampling.top_k, sampling.top_p)
    want = torch.log_softmax(z, -1).gather(-1, tokens[..., None]).squeeze(-1)
    m = mask.bool()
    assert torch.isfinite(log_probs[m]).all()
    torch.testing.assert_close(log_probs[m], want[m], rtol=1e-4, atol=1e-4)


def test_the_shipped_tiny_models_keep_generates_sampler():
    from ppolab.models import SHIPPED_MODEL, load_tokenizer_and_model

    _, model = load_tokenizer_and_model(str(SHIPPED_MODEL))
    assert model.config.vocab_size < DRAW_VOCAB and math.log2(DRAW_VOCAB) == 15
