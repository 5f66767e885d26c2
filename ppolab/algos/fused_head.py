"""Log-probs and entropy from the last hidden states and the LM head, never making the logits (chapter §3, §6).

At a real vocabulary the logits are a step's largest tensor: 18k response tokens × 151,936 tokens is 11 GB in fp32,
and the plain formulas (:func:`ppolab.algos.logprob.logprobs_from_logits`, ``entropy_from_logits``) pass over it
several times. What the loss needs from it is two numbers a token: log π(y) = z_y − logsumexp(z) and
H = logsumexp(z) − Σ_v π_v z_v, with z = h·Wᵀ / t. Both are sums over the vocabulary, so they can be accumulated over
vocabulary chunks of z that stay small, each chunk computed from the hidden states and one slice of the head's
weight, used and thrown away — the idea of Liger Kernel's fused linear cross-entropy and Apple's Cut Cross-Entropy,
written here in plain torch. Forward keeps per token a running max m, s = Σ e^{z−m} and a = Σ e^{z−m}·z (rescaled
by e^{m_old − m_new} when the max grows: an online softmax, exact), and the label's logit when its chunk passes:

    lse = m + log s,    log π(y) = z_y − lse,    H = lse − a / s

Backward recomputes each chunk from (h, W) and the saved lse and Σπz instead of keeping any logits:

    ∂L/∂z_v = π_v·(−g_H·(z_v − Σπz) − g_lp) + g_lp·[v = y],   ∂L/∂h = Σ_chunks ∂L/∂z·W_c / t,
    ∂L/∂W_c = ∂L/∂zᵀ·(h / t)   (only where the head's weight trains: a frozen or tied head skips it)

Where only log π(y) reaches the loss and the head is frozen (LoRA on a frozen base, no entropy term: the default
GRPO/PPO update) ∂L/∂z is linear in g_lp alone, so the forward accumulates E_π[W] = Σ_v π_v·W_v beside s and the
backward is ∂L/∂h = g_lp·(W_y − E_π[W]) / t — no recompute, no second pass over the vocabulary.

Memory: one block of rows × one vocabulary chunk in fp32 (:func:`block_sizes`: 2 MiB on a CPU, 256 MiB on a GPU),
whatever the vocabulary. Compute: the head's matmul once forward and twice (three times with a trainable head)
backward, as the unfused path — plus one recompute — or, in the frozen-head case above, twice forward and never
backward; no pass over full-width rows. verl reaches the same numbers through ``logprobs_from_logits`` on logits it
has made (fused kernels on GPU); the result here equals the plain formulas on ``scale_logits(h·Wᵀ, t)`` to fp32
rounding (tests/test_fused_head.py).
"""
from __future__ import annotations

import torch

from ppolab.algos.logprob import MIN_TEMPERATURE

#: Rows (tokens) per block and vocabulary entries per chunk: one fp32 block of z is ROWS × VOCAB_CHUNK × 4 B = 2 MiB,
#: small enough to stay in a core's cache hierarchy while exp, max and the row sums pass over it (at hidden 64 and
#: 151,936 tokens, 1,028 positions, forward + backward of log π on one thread, measured: 4 MiB blocks 0.84–1.06 s,
#: 2 MiB 0.67–0.75 s, 1 MiB 0.79–0.88 s).
ROWS = 256
VOCAB_CHUNK = 2048
#: The same on an accelerator, where the loop's cost is its kernel launches (about ten a block), not cache misses:
#: 2,048 rows × 32,768 tokens (256 MiB in fp32), so a GPU micro-batch of 24,576 tokens at 151,936 takes 60 blocks,
#: not 96 × 75 (its full logits would be 14 GiB). Measured on an H200, hidden 896, bf16: log π of 24,576 tokens
#: 1,705 → 173 ms without gradients, 2,158 → 304 ms with (peak +631 / +722 MiB).
ACCEL_ROWS = 2048
ACCEL_VOCAB_CHUNK = 32768


def block_sizes(device: torch.device) -> tuple[int, int]:
    """(rows, vocabulary chunk) of a block on ``device``: :data:`ROWS` × :data:`VOCAB_CHUNK` on a CPU, else
    :data:`ACCEL_ROWS` × :data:`ACCEL_VOCAB_CHUNK`."""
    return (ROWS, VOCAB_CHUNK) if device.type == "cpu" else (ACCEL_ROWS, ACCEL_VOCAB_CHUNK)


def _block(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, t: torch.Tensor | None, c0: int,
           c1: int) -> torch.Tensor:
    """z = (h·W[c0:c1]ᵀ + b[c0:c1]) / t for one block of rows, in fp32: (rows, c1 − c0). ``t`` None: ``h`` is
    already divided by the temperature (no bias: (h/t)·Wᵀ is z, and the division costs a pass over H, not over V)."""
    z = h @ weight[c0:c1].to(torch.float32).T
    if bias is not None:
        z += bias[c0:c1].to(torch.float32)
    return z if t is None else z.div_(t[:, None])


def _scaled_rows(hidden: torch.Tensor, temperature: torch.Tensor, bias: torch.Tensor | None, r0: int, r1: int
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(h, t) for :func:`_block`: without a bias the temperature is folded into the rows (h/t, None)."""
    h = hidden[r0:r1].to(torch.float32)
    t = temperature[r0:r1]
    return (h / t[:, None], None) if bias is None else (h, t)


class _FusedHeadLogProbs(torch.autograd.Function):
    """(log π(y), H) of (N, H) hidden states under an LM head (V, H), a block of rows and a vocabulary chunk at a
    time; see the module's docstring for the formulas.

    Where the gradient can only reach the hidden states through log π(y) — no entropy asked for, a frozen head and
    bias (LoRA, a frozen base) — the forward also accumulates E_π[W] = Σ_v π_v·W_v (one more (rows × chunk)·(chunk ×
    H) product, rescaled online like s), because then ∂L/∂h = g_lp·(W_y − E_π[W]) / t is linear in the upstream
    gradient g_lp: the backward is one gather and a few (N, H) operations, with no recompute of the logits and no
    pass over the vocabulary. Otherwise the backward recomputes each chunk (module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, want_entropy, rows, chunk):
        n, vocab = hidden.shape[0], weight.shape[0]
        frozen_head = not weight.requires_grad and (bias is None or not bias.requires_grad)
        expect_w = hidden.requires_grad and frozen_head and not want_entropy  # (grad mode is off inside forward)
        log_probs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse_all = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs) if want_entropy else log_probs.new_empty(0)
        expected_w = torch.empty(n, weight.shape[1], dtype=torch.float32, device=hidden.device) if expect_w else None
        for r0 in range(0, n, rows):
            r1 = min(r0 + rows, n)
            h, t = _scaled_rows(hidden, temperature, bias, r0, r1)
            y = labels[r0:r1]
            picked = torch.zeros(r1 - r0, dtype=torch.float32, device=h.device)
            m = s = a = u = None  # running max, Σe^{z−m}, Σe^{z−m}·(z−m), Σe^{z−m}·W_v (rows, H)
            for c0 in range(0, vocab, chunk):
                c1 = min(c0 + chunk, vocab)
                z = _block(h, weight, bias, t, c0, c1)
                inside = (y >= c0) & (y < c1)
                if inside.any():
                    idx = inside.nonzero().squeeze(-1)
                    picked[idx] = z[idx, y[idx] - c0]
                m_new = z.amax(dim=-1) if m is None else torch.maximum(m, z.amax(dim=-1))
                zc = z.sub_(m_new[:, None])  # z − m, in z's memory
                e = torch.exp(zc) if want_entropy else zc.exp_()
                if m is None:  # the first chunk: nothing to rescale
                    s = e.sum(dim=-1)
                    a = (e * zc).sum(dim=-1) if want_entropy else None
                    u = e @ weight[c0:c1].to(torch.float32) if expect_w else None
                else:  # the max grew by m_new − m: earlier sums shrink by e^{m − m_new} (an online softmax, exact)
                    rescale, shift = torch.exp(m - m_new), m - m_new
                    if want_entropy:  # Σe^{z−m_new}(z − m_new) = e^{m−m_new}·(Σe^{z−m}(z − m) + (m − m_new)·Σe^{z−m})
                        a = rescale * (a + shift * s) + (e * zc).sum(dim=-1)
                    s = s * rescale + e.sum(dim=-1)
                    if expect_w:
                        u = torch.addmm(u * rescale[:, None], e, weight[c0:c1].to(torch.float32))
                m = m_new
            lse_all[r0:r1] = m + torch.log(s)
            log_probs[r0:r1] = picked - lse_all[r0:r1]
            if want_entropy:  # H = logsumexp − E_π[z] = log s − a/s (both relative to m)
                entropy[r0:r1] = torch.log(s) - a / s
            if expect_w:
                expected_w[r0:r1] = u / s[:, None]
        ctx.save_for_backward(hidden, weight, bias if bias is not None else torch.empty(0), labels, temperature,
                              lse_all, entropy, expected_w if expect_w else torch.empty(0))
        ctx.has_bias, ctx.want_entropy, ctx.rows, ctx.chunk = bias is not None, want_entropy, rows, chunk
        ctx.expect_w = expect_w
        return log_probs, entropy

    @staticmethod
    def backward(ctx, g_log_probs, g_entropy):
        hidden, weight, bias, labels, temperature, lse_all, entropy, expected_w = ctx.saved_tensors
        bias = bias if ctx.has_bias else None
        n, vocab = hidden.shape[0], weight.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = ctx.has_bias and ctx.needs_input_grad[2]
        g_lp_all = g_log_probs if g_log_probs is not None else torch.zeros_like(lse_all)
        if ctx.expect_w:  # ∂L/∂h = g_lp·(W_y − E_π[W]) / t: no pass over the vocabulary (class docstring)
            w_y = weight.index_select(0, labels).to(torch.float32)
            grad_h = (w_y - expected_w).mul_((g_lp_all / temperature)[:, None])
            return grad_h.to(hidden.dtype), None, None, None, None, None, None, None
        use_h = ctx.want_entropy and g_entropy is not None and g_entropy.numel() > 0
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(vocab, dtype=torch.float32, device=weight.device) if need_b else None
        for r0 in range(0, n, ctx.rows):
            r1 = min(r0 + ctx.rows, n)
            h, t = _scaled_rows(hidden, temperature, bias, r0, r1)
            inv_t = 1.0 / temperature[r0:r1, None]
            y = labels[r0:r1]
            lse, g_lp = lse_all[r0:r1, None], g_lp_all[r0:r1, None]
            g_h = g_entropy[r0:r1, None] if use_h else None
            block_h = torch.zeros(r1 - r0, hidden.shape[1], dtype=torch.float32, device=h.device) if need_h else None
            for c0 in range(0, vocab, ctx.chunk):
                c1 = min(c0 + ctx.chunk, vocab)
                z = _block(h, weight, bias, t, c0, c1)
                zc = z.sub_(lse)  # z − lse, in z's memory
                # ∂L/∂z = p·(−g_H·(z − Σπz) − g_lp) + g_lp·onehot(y), with p = e^{z − lse} and z − Σπz = (z − lse) + H
                if g_h is not None:
                    p = torch.exp(zc)
                    h_ent = entropy[r0:r1, None]
                    dz = zc.mul_(-g_h).sub_(g_h * h_ent + g_lp).mul_(p)
                else:
                    dz = zc.exp_().mul_(-g_lp)
                inside = (y >= c0) & (y < c1)
                if inside.any():
                    idx = inside.nonzero().squeeze(-1)
                    dz[idx, y[idx] - c0] += g_lp[idx, 0]
                # ∂z/∂h = W/t and ∂z/∂W = h/t: the 1/t is applied to the (rows, H) sides, not to dz
                if need_h:
                    block_h += dz @ weight[c0:c1].to(torch.float32)
                if need_w:
                    grad_w[c0:c1] += dz.T @ (h if t is None else h * inv_t)
                if need_b:
                    grad_b[c0:c1] += (inv_t.T @ dz).squeeze(0)
            if need_h:
                grad_h[r0:r1] = block_h.mul_(inv_t)
        cast = (lambda g, like: None if g is None else g.to(like.dtype))  # noqa: E731
        return cast(grad_h, hidden), cast(grad_w, weight), cast(grad_b, weight), None, None, None, None, None


def fused_head_logprobs_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    want_entropy: bool = True,
    bias: torch.Tensor | None = None,
    rows: int | None = None,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log π(label), entropy) per position from the hidden states that feed the LM head, without the logits.

    Shapes: hidden (..., H) in any float dtype (the model's last hidden states at the positions that score the
    labels: the one-token shift is the caller's), weight (V, H) the head's (``model.get_output_embeddings()
    .weight``; tied to the input embedding or not), bias (V,) or None, labels (...) integer ids, temperature a float
    or one per leading row (shape hidden.shape[0], e.g. (B,) for (B, T, H)). Returns two float32 tensors of shape
    (...) — the entropy None unless asked for. Equal to ``logprobs_from_logits(scale_logits(h·Wᵀ + b, t), y)`` and
    ``entropy_from_logits(...)`` to fp32 rounding, with the same gradients with respect to hidden, weight and bias
    (chapter §3: the ratio's log-probs; §6: the entropy at the sampling temperature). ``rows`` and ``chunk`` set
    the block (default :func:`block_sizes` of the device)."""
    default_rows, default_chunk = block_sizes(hidden.device)
    rows, chunk = rows or default_rows, chunk or default_chunk
    lead = labels.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_y = labels.reshape(-1)
    t = torch.as_tensor(temperature, dtype=torch.float32, device=hidden.device).clamp(min=MIN_TEMPERATURE)
    if t.dim() == 0:
        t = t.expand(flat_h.shape[0])
    else:  # one temperature per leading row, repeated over that row's positions
        t = t.reshape(-1, *([1] * (len(lead) - 1))).expand(lead).reshape(-1)
    log_probs, entropy = _FusedHeadLogProbs.apply(flat_h, weight, bias, flat_y, t.contiguous(), want_entropy,
                                                  rows, chunk)
    return log_probs.view(lead), entropy.view(lead) if want_entropy else None
