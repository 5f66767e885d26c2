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

    ∂L/∂z_v = π_v·(−g_H·(z_v − Σπz) − g_lp) + g_lp·[v = y],   ∂L/∂h = Σ_chunks (∂L/∂z / t)·W_c,
    ∂L/∂W_c = (∂L/∂z / t)ᵀ·h   (only where the head's weight trains: a frozen or tied head skips it)

Memory: one block of rows × one vocabulary chunk in fp32 (:data:`ROWS`, :data:`VOCAB_CHUNK`: 4 MiB), whatever the
vocabulary. Compute: the head's matmul once forward and twice (three times with a trainable head) backward, as the
unfused path — plus one recompute — and no pass over full-width rows. verl reaches the same numbers through
``logprobs_from_logits`` on logits it has made (fused kernels on GPU); the result here equals the plain formulas on
``scale_logits(h·Wᵀ, t)`` to fp32 rounding (tests/test_fused_head.py).
"""
from __future__ import annotations

import torch

from ppolab.algos.logprob import MIN_TEMPERATURE

#: Rows (tokens) per block and vocabulary entries per chunk: one fp32 block of z is ROWS × VOCAB_CHUNK × 4 B = 4 MiB,
#: small enough to stay in a core's cache hierarchy while exp, max and the row sums pass over it.
ROWS = 256
VOCAB_CHUNK = 4096


def _block(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, t: torch.Tensor, c0: int, c1: int
           ) -> torch.Tensor:
    """z = (h·W[c0:c1]ᵀ + b[c0:c1]) / t for one block of rows, in fp32: (rows, c1 − c0)."""
    z = h @ weight[c0:c1].to(torch.float32).T
    if bias is not None:
        z += bias[c0:c1].to(torch.float32)
    return z.div_(t[:, None])


class _FusedHeadLogProbs(torch.autograd.Function):
    """(log π(y), H) of (N, H) hidden states under an LM head (V, H), a block of rows and a vocabulary chunk at a
    time; see the module's docstring for the formulas."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, want_entropy, rows, chunk):
        n, vocab = hidden.shape[0], weight.shape[0]
        log_probs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse_all = torch.empty_like(log_probs)
        mean_z = torch.empty_like(log_probs) if want_entropy else log_probs.new_empty(0)
        for r0 in range(0, n, rows):
            r1 = min(r0 + rows, n)
            h = hidden[r0:r1].to(torch.float32)
            t = temperature[r0:r1]
            y = labels[r0:r1]
            m = torch.full((r1 - r0,), float("-inf"), device=h.device)
            s = torch.zeros_like(m)
            a = torch.zeros_like(m)
            picked = torch.zeros_like(m)
            for c0 in range(0, vocab, chunk):
                c1 = min(c0 + chunk, vocab)
                z = _block(h, weight, bias, t, c0, c1)
                m_new = torch.maximum(m, z.max(dim=-1).values)
                rescale = torch.exp(m - m_new)  # e^{−inf} = 0 on the first chunk
                inside = (y >= c0) & (y < c1)
                if inside.any():
                    idx = inside.nonzero().squeeze(-1)
                    picked[idx] = z[idx, y[idx] - c0]
                e = torch.exp(z - m_new[:, None])
                s = s * rescale + e.sum(dim=-1)
                if want_entropy:
                    a = a * rescale + (e * z).sum(dim=-1)
                m = m_new
            lse = m + torch.log(s)
            lse_all[r0:r1] = lse
            log_probs[r0:r1] = picked - lse
            if want_entropy:
                mean_z[r0:r1] = a / s
        entropy = lse_all - mean_z if want_entropy else log_probs.new_empty(0)
        ctx.save_for_backward(hidden, weight, bias if bias is not None else torch.empty(0), labels, temperature,
                              lse_all, mean_z)
        ctx.has_bias, ctx.want_entropy, ctx.rows, ctx.chunk = bias is not None, want_entropy, rows, chunk
        return log_probs, entropy

    @staticmethod
    def backward(ctx, g_log_probs, g_entropy):
        hidden, weight, bias, labels, temperature, lse_all, mean_z = ctx.saved_tensors
        bias = bias if ctx.has_bias else None
        n, vocab = hidden.shape[0], weight.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = ctx.has_bias and ctx.needs_input_grad[2]
        use_h = ctx.want_entropy and g_entropy is not None and g_entropy.numel() > 0
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(vocab, dtype=torch.float32, device=weight.device) if need_b else None
        g_lp_all = g_log_probs if g_log_probs is not None else torch.zeros_like(lse_all)
        for r0 in range(0, n, ctx.rows):
            r1 = min(r0 + ctx.rows, n)
            h = hidden[r0:r1].to(torch.float32)
            t = temperature[r0:r1]
            y = labels[r0:r1]
            lse, g_lp = lse_all[r0:r1, None], g_lp_all[r0:r1, None]
            g_h = g_entropy[r0:r1, None] if use_h else None
            for c0 in range(0, vocab, ctx.chunk):
                c1 = min(c0 + ctx.chunk, vocab)
                z = _block(h, weight, bias, t, c0, c1)
                p = torch.exp(z - lse)
                # ∂L/∂z = p·(−g_H·(z − Σπz) − g_lp) + g_lp·onehot(y), built in z's own memory
                if g_h is not None:
                    dz = z.sub_(mean_z[r0:r1, None]).mul_(-g_h).sub_(g_lp).mul_(p)
                else:
                    dz = p.mul_(-g_lp)
                inside = (y >= c0) & (y < c1)
                if inside.any():
                    idx = inside.nonzero().squeeze(-1)
                    dz[idx, y[idx] - c0] += g_lp[idx, 0]
                dz.div_(t[:, None])
                if need_h:
                    grad_h[r0:r1] += dz @ weight[c0:c1].to(torch.float32)
                if need_w:
                    grad_w[c0:c1] += dz.T @ h
                if need_b:
                    grad_b[c0:c1] += dz.sum(dim=0)
        cast = (lambda g, like: None if g is None else g.to(like.dtype))  # noqa: E731
        return cast(grad_h, hidden), cast(grad_w, weight), cast(grad_b, weight), None, None, None, None, None


def fused_head_logprobs_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    want_entropy: bool = True,
    bias: torch.Tensor | None = None,
    rows: int = ROWS,
    chunk: int = VOCAB_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log π(label), entropy) per position from the hidden states that feed the LM head, without the logits.

    Shapes: hidden (..., H) in any float dtype (the model's last hidden states at the positions that score the
    labels: the one-token shift is the caller's), weight (V, H) the head's (``model.get_output_embeddings()
    .weight``; tied to the input embedding or not), bias (V,) or None, labels (...) integer ids, temperature a float
    or one per leading row (shape hidden.shape[0], e.g. (B,) for (B, T, H)). Returns two float32 tensors of shape
    (...) — the entropy None unless asked for. Equal to ``logprobs_from_logits(scale_logits(h·Wᵀ + b, t), y)`` and
    ``entropy_from_logits(...)`` to fp32 rounding, with the same gradients with respect to hidden, weight and bias
    (chapter §3: the ratio's log-probs; §6: the entropy at the sampling temperature)."""
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
