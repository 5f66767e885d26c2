"""The fused LM-head log-probs and entropy (ppolab/algos/fused_head.py) against the plain formulas on the logits:
values and gradients (hidden, weight, bias), several vocabulary sizes (chunk edges included), temperatures (one, and
one per row), masks reaching the gradient through a loss, and a label in every chunk."""
from __future__ import annotations

import pytest
import torch

from ppolab.algos.fused_head import fused_head_logprobs_entropy
from ppolab.algos.logprob import entropy_from_logits, logprobs_from_logits, scale_logits


def plain(hidden, weight, bias, labels, temperature):
    """The plain formulas on the logits, in float64 when given float64 (the reference the tolerances are read
    against), else in float32."""
    wide = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    logits = hidden.to(wide) @ weight.to(wide).T
    if bias is not None:
        logits = logits + bias.to(wide)
    z = scale_logits(logits, temperature)
    return logprobs_from_logits(z, labels), entropy_from_logits(z)


def case(vocab, hidden_size=24, rows=3, positions=7, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, positions, hidden_size, generator=g)
    w = torch.randn(vocab, hidden_size, generator=g) * 0.5
    b = torch.randn(vocab, generator=g) if bias else None
    y = torch.randint(0, vocab, (rows, positions), generator=g)
    y[0, 0], y[-1, -1] = 0, vocab - 1  # the first and the last vocabulary entry, at chunk edges
    return h, w, b, y


@pytest.mark.parametrize("vocab,chunk,rows", [(5, 4, 2), (37, 8, 5), (64, 16, 4), (300, 97, 7), (1000, 4096, 256)])
@pytest.mark.parametrize("temperature", [1.0, 0.6, "per row"])
def test_values_and_gradients_equal_the_plain_formulas(vocab, chunk, rows, temperature):
    h, w, b, y = case(vocab, bias=vocab == 37)
    t = torch.tensor([0.7, 1.0, 1.6]) if temperature == "per row" else temperature
    mask = (torch.rand(y.shape, generator=torch.Generator().manual_seed(1)) > 0.3).float()
    up = torch.Generator().manual_seed(3)  # the upstream gradients: fixed, so a failure repeats
    g_lp, g_h = torch.randn(y.shape, generator=up), torch.randn(y.shape, generator=up)

    def run(fn):
        hh, ww = h.clone().double().requires_grad_(True), w.clone().double().requires_grad_(True)
        bb = None if b is None else b.clone().double().requires_grad_(True)
        if fn is plain:
            lp, ent = plain(hh, ww, bb, y, t if isinstance(t, float) else t.double())
            lp, ent = lp.float(), ent.float()
        else:
            lp, ent = fused_head_logprobs_entropy(hh.float(), ww.float(), y, t, True, bb if bb is None else bb.float(),
                                                  rows=rows, chunk=chunk)
        loss = (lp * g_lp * mask).sum() + (ent * g_h * mask).sum()  # a masked loss, as the trainer's
        loss.backward()
        return lp.detach(), ent.detach(), hh.grad, ww.grad, None if bb is None else bb.grad

    want, got = run(plain), run(fused_head_logprobs_entropy)
    for name, a, e in zip(("log_probs", "entropy", "grad hidden", "grad weight", "grad bias"), got, want):
        if e is None:
            continue
        torch.testing.assert_close(a.double(), e.double(), rtol=1e-4, atol=1e-5, msg=name)


def test_a_frozen_head_gets_no_gradient_and_log_probs_alone_need_no_entropy():
    h, w, _, y = case(50)
    hh = h.clone().requires_grad_(True)
    lp, ent = fused_head_logprobs_entropy(hh, w, y, 0.9, want_entropy=False, chunk=16)
    assert ent is None and not w.requires_grad
    lp.sum().backward()
    ref = h.clone().requires_grad_(True)
    plain(ref, w, None, y, 0.9)[0].sum().backward()
    torch.testing.assert_close(hh.grad, ref.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("vocab,chunk,rows", [(37, 8, 5), (300, 97, 7), (1000, 4096, 256)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("want_entropy", [False, True])
def test_a_frozen_head_backward_equals_the_plain_formulas_and_needs_no_recompute_without_entropy(
        vocab, chunk, rows, bias, want_entropy, monkeypatch):
    """A frozen head (LoRA on a frozen base): without the entropy the forward keeps E_π[W] and the backward makes no
    logits at all (∂L/∂h = g_lp·(W_y − E_π[W]) / t); with it, the backward recomputes the chunks. Both equal the
    plain formulas' gradient, per-row temperatures and a frozen bias included, through a masked loss."""
    from ppolab.algos import fused_head

    h, w, b, y = case(vocab, bias=bias)
    t = torch.tensor([0.7, 1.0, 1.6])
    mask = (torch.rand(y.shape, generator=torch.Generator().manual_seed(2)) > 0.3).float()
    up = torch.Generator().manual_seed(3)  # the upstream gradients: fixed, so a failure repeats
    g_lp, g_h = torch.randn(y.shape, generator=up), torch.randn(y.shape, generator=up)
    ref = h.clone().double().requires_grad_(True)
    want_lp, want_ent = plain(ref, w.double(), None if b is None else b.double(), y, t.double())
    ((want_lp * g_lp * mask).sum() + (want_ent * g_h * mask).sum() * want_entropy).backward()

    blocks = []
    real_block = fused_head._block
    monkeypatch.setattr(fused_head, "_block", lambda *a: blocks.append(1) or real_block(*a))
    hh = h.clone().requires_grad_(True)
    lp, ent = fused_head_logprobs_entropy(hh, w, y, t, want_entropy, b, rows=rows, chunk=chunk)
    made = len(blocks)
    ((lp * g_lp * mask).sum() + ((ent * g_h * mask).sum() if want_entropy else 0)).backward()
    assert (len(blocks) == made) is not want_entropy  # no logits made in the backward without the entropy
    torch.testing.assert_close(lp.double(), want_lp.detach().double(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(hh.grad.double(), ref.grad.double(), rtol=1e-4, atol=1e-5)


def test_half_precision_inputs_give_float32_outputs_and_grads_in_their_own_dtype():
    h, w, _, y = case(70)
    hh = h.bfloat16().requires_grad_(True)
    ww = w.bfloat16().requires_grad_(True)
    lp, ent = fused_head_logprobs_entropy(hh, ww, y, 1.0, chunk=32)
    assert lp.dtype == ent.dtype == torch.float32
    (lp.sum() + ent.sum()).backward()
    assert hh.grad.dtype == ww.grad.dtype == torch.bfloat16
    want_lp, want_ent = plain(hh.detach().float(), ww.detach().float(), None, y, 1.0)
    torch.testing.assert_close(lp, want_lp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ent, want_ent, rtol=1e-4, atol=1e-4)


def test_extreme_logits_stay_finite():
    """A chunk whose logits are all far below another chunk's (the online max rescales, nothing overflows)."""
    h, w, _, y = case(40)
    w = w.clone()
    w[:20] *= 200.0
    lp, ent = fused_head_logprobs_entropy(h, w, y, 0.5, chunk=20)
    want_lp, want_ent = plain(h, w, None, y, 0.5)
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    torch.testing.assert_close(lp, want_lp, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(ent, want_ent, rtol=1e-4, atol=1e-3)


def small_qwen(vocab=3000, tie=True):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      tie_word_embeddings=tie)
    return AutoModelForCausalLM.from_config(cfg).float()


@pytest.mark.parametrize("lora", [False, True])
def test_forward_response_through_the_fused_head_equals_the_logits_path(lora):
    """forward_response(chunked=True) on a Qwen2 whose head can be fused: the decoder's hidden states and the head's
    weight give the plain path's log-probs, entropy and values, and the same gradients in the trunk, in the (tied,
    trainable) embedding and in LoRA adapters — with a left-padded prompt and a temperature per row."""
    from torch import nn

    from ppolab.models import _fusable_head, forward_response

    model = small_qwen(tie=not lora)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    assert isinstance(_fusable_head(model), nn.Linear)
    value_head = nn.Linear(32, 1)
    ids = torch.randint(0, 3000, (3, 30), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    temperature = torch.tensor([1.0, 0.6, 1.3])
    w = torch.randn(3, 12, generator=torch.Generator().manual_seed(1))
    trainable = [p for p in model.parameters() if p.requires_grad]
    results = {}
    for fused in (False, True):
        model.zero_grad()
        value_head.zero_grad()
        out = forward_response(model, ids, mask, 12, temperature, True, True, value_head, chunked=fused, fused=fused)
        ((out.log_probs * w).sum() + (out.entropy * w.flip(0)).sum() + (out.values * w).sum()).backward()
        grads = [p.grad.clone() for p in trainable if p.grad is not None]
        results[fused] = [out.log_probs.detach(), out.entropy.detach(), out.values.detach(), *grads]
    assert len(results[True]) == len(results[False]) > 4
    for i, (a, e) in enumerate(zip(results[True], results[False])):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5, msg=f"output {i}")


def test_a_head_that_cannot_be_fused_takes_the_logits_path():
    from peft import LoraConfig, get_peft_model

    from ppolab.models import _fusable_head

    model = get_peft_model(small_qwen(tie=False), LoraConfig(r=4, target_modules=["lm_head"]))
    assert _fusable_head(model) is None  # a LoRA-wrapped head: its logits are base + adapter
    softcapped = small_qwen()
    softcapped.config.final_logit_softcapping = 30.0
    assert _fusable_head(softcapped) is None


def test_a_real_vocabulary_takes_the_fused_head_at_one_row(monkeypatch):
    """From CHUNK_VOCAB tokens forward_response fuses the head whatever the batch: one row of 257 positions at
    151,936 tokens is under the logits threshold, and the plain formulas there cost ~5× the time (lab 13 replays
    micro-batches of one row); under it — the shipped models' 29 tokens — the plain path stays."""
    import ppolab.models as models
    from ppolab.algos.logprob import CHUNK_LOGITS_THRESHOLD, CHUNK_VOCAB, use_chunked_logits

    assert 257 * 151_936 < CHUNK_LOGITS_THRESHOLD and use_chunked_logits(1, 257, 151_936)
    assert not use_chunked_logits(64, 257, 29) and not use_chunked_logits(1, 10, CHUNK_VOCAB - 1)
    calls = []
    real = models.fused_head_logprobs_entropy
    monkeypatch.setattr(models, "fused_head_logprobs_entropy", lambda *a, **k: calls.append(1) or real(*a, **k))
    for vocab, fused in ((CHUNK_VOCAB, True), (CHUNK_VOCAB - 1, False)):
        calls.clear()
        model = small_qwen(vocab=vocab)
        ids = torch.randint(0, 3000, (1, 8), generator=torch.Generator().manual_seed(0))
        out = models.forward_response(model, ids, torch.ones_like(ids), 4, 1.0)
        assert out.log_probs.shape == (1, 4) and bool(calls) == fused, vocab
