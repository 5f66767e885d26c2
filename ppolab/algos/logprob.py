"""Per-token log-probabilities and entropy from logits (verl `torch_functional.py`, `prepare_model_outputs`; chapter §3,
§6).

The trainer divides logits by the rollout temperature (clamped at 1e-8) *before* calling either
function, so the ratio, the reference KL and the entropy all see the temperature-scaled policy.
"""
from __future__ import annotations

import torch

#: Lower clamp on the temperature before it divides the logits (verl's FSDP engine).
MIN_TEMPERATURE = 1e-8


def scale_logits(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """logits / max(temperature, 1e-8) — not in place, so the caller's logits stay intact (chapter §6).

    ``temperature`` is a float or a (bs,) tensor (one temperature per sample), broadcast over (bs, T, V).
    """
    t = torch.as_tensor(temperature, dtype=logits.dtype, device=logits.device).clamp(min=MIN_TEMPERATURE)
    if t.dim() == 1:
        t = t.view(-1, *([1] * (logits.dim() - 1)))
    return logits / t


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log π(label | context) for every position: gather(logits, label) − logsumexp(logits).

    Shapes: logits (..., V), labels (...) integer ids → (...). For fp32/fp64 this is the row-by-row
    gather − logsumexp of verl's ``logprobs_from_logits_v2``; for half precision a log_softmax + gather
    (the numerically safer path verl takes for bf16).
    """
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    return torch.gather(torch.log_softmax(logits, dim=-1), -1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) − Σ softmax(z)·z over the vocabulary (chapter §6: H = −Σ_a π log π).

    Shapes: (..., V) → (...). No dtype cast, as verl.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def calculate_sum_pi_squared_from_logits(logits: torch.Tensor,
                                         temperature: float | torch.Tensor | None = None) -> torch.Tensor:
    """Σ_v π(v)² per position, the "collision probability" the optimal-token-baseline estimators need (chapter
    §6; verl `torch_functional.py::calculate_sum_pi_squared_from_logits`).

        Σ_v π(v)² = exp(logsumexp(2z) − 2·logsumexp(z))

    exact and overflow-free. Shapes: (..., V) → (...). verl computes it on the temperature-scaled logits of the
    old-log-prob forward (and the trainer then stores it as float32); pass ``temperature`` to scale here, or
    scaled logits with ``temperature=None``. No dtype cast.
    """
    if temperature is not None:
        logits = scale_logits(logits, temperature)
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))


# ---------------------------------------------------------------------------------------------------------------
# Chunked log-probs and entropy for real vocabularies (verl `entropy_from_logits_with_chunking`, and the fused
# kernels verl's `logprobs_from_logits` prefers, which never hold a float32 copy of the whole logits).
# ---------------------------------------------------------------------------------------------------------------

#: Above this many logits (rows × positions × vocab) the trainer's forward switches to the chunked path. 2^26
#: fp32 logits are 256 MiB; the shipped tiny model (29 tokens) never gets near it, so its runs take the plain path.
CHUNK_LOGITS_THRESHOLD = 1 << 26
#: Logits per chunk (positions × vocab): 2^24 fp32 = 64 MiB, i.e. 110 positions of Qwen2.5's 151,936 tokens.
CHUNK_LOGITS = 1 << 24
#: From this many vocabulary entries the chunked path is taken at any batch size: one row of 257 positions at
#: 151,936 tokens is 39M logits (under the threshold), and without them a forward and backward of that row is
#: ~5× faster on a CPU (the micro-batches of one row that lab 13 replays). The shipped tiny models have 29 tokens.
CHUNK_VOCAB = 1 << 15


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ_v a·b per row of two (T, V) tensors, as a (T,) — a batched matmul, so no (T, V) product is made."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


class _ChunkedLogProbs(torch.autograd.Function):
    """log π(label), H and Σπ² on (B, T, V) logits, one slice of positions at a time, in float32.

    Forward keeps only the input logits (the model already holds them) and per-token statistics; backward
    recomputes softmax per chunk and writes the gradient straight into one tensor of the logits' shape and dtype.
    So at most one float32 chunk lives beside the logits and their gradient, never a full-size float32 copy.
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature, positions, chunk, want_entropy, want_sum_pi_squared):
        # logits (B, T', V) with T' ≥ positions; only the first ``positions`` are read. labels (B, positions).
        # temperature (B,) float32, already clamped.
        bs = logits.shape[0]
        log_probs = logits.new_empty((bs, positions), dtype=torch.float32)
        entropy = log_probs.new_empty((bs, positions)) if want_entropy else log_probs.new_empty(0)
        spi2 = log_probs.new_empty((bs, positions)) if want_sum_pi_squared else log_probs.new_empty(0)
        for b in range(bs):
            for s in range(0, positions, chunk):
                e = min(s + chunk, positions)
                z = logits[b, s:e].float() / temperature[b]
                lse = torch.logsumexp(z, dim=-1)
                log_probs[b, s:e] = torch.gather(z, -1, labels[b, s:e, None]).squeeze(-1) - lse
                if want_entropy:
                    entropy[b, s:e] = lse - _rowdot(torch.softmax(z, dim=-1), z)
                if want_sum_pi_squared:
                    spi2[b, s:e] = torch.exp(torch.logsumexp(z.mul_(2.0), dim=-1) - 2.0 * lse)  # z is done with
        ctx.save_for_backward(logits, labels, temperature)
        ctx.positions, ctx.chunk = positions, chunk
        ctx.mark_non_differentiable(spi2)
        return log_probs, entropy, spi2

    @staticmethod
    def backward(ctx, g_log_probs, g_entropy, _g_spi2):
        logits, labels, temperature = ctx.saved_tensors
        grad = torch.zeros_like(logits)  # positions past ``positions`` (the last logit) get no gradient
        for b in range(logits.shape[0]):
            for s in range(0, ctx.positions, ctx.chunk):
                e = min(s + ctx.chunk, ctx.positions)
                t = temperature[b]
                z = logits[b, s:e].float() / t
                p = torch.softmax(z, dim=-1)
                # dL/dz = g_lp·(onehot(y) − p) + g_H·(−p·(z − Σ p z)) = p·(−g_H·(z − Σ p z) − g_lp) + g_lp·onehot(y),
                # built in z's own memory: one float32 chunk besides p.
                if g_entropy is not None and g_entropy.numel():
                    z.sub_(_rowdot(p, z)[:, None]).mul_(-g_entropy[b, s:e, None])
                else:
                    z.zero_()
                if g_log_probs is not None:
                    z.sub_(g_log_probs[b, s:e, None])
                z.mul_(p)
                if g_log_probs is not None:
                    z.scatter_add_(-1, labels[b, s:e, None], g_log_probs[b, s:e, None])
                grad[b, s:e] = z.div_(t)  # z = logits / t; the copy casts to the logits' dtype
        return grad, None, None, None, None, None, None


def chunked_logprobs_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    want_entropy: bool = True,
    want_sum_pi_squared: bool = False,
    chunk_logits: int = CHUNK_LOGITS,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(log π(label), entropy, Σπ²) per position, computed a chunk of positions at a time (chapter §3, §6).

    The same numbers as ``logprobs_from_logits(scale_logits(logits.float(), t), labels)``,
    ``entropy_from_logits(...)`` and ``calculate_sum_pi_squared_from_logits(...)`` (to float32 rounding) and the
    same gradients for log-probs and entropy, without a float32 copy of all the logits: at a 151,936-token
    vocabulary one such copy of a 4,096-token micro-batch is 2.5 GB, and the unchunked formulas keep several for
    backward. Σπ² carries no gradient (verl computes it in the no-grad old-log-prob pass).

    Shapes: logits (B, T', V) in any float dtype with T' ≥ T — only the first T positions are read, so the
    model's ``logits`` can be passed without slicing (a slice would cost a copy in backward); labels (B, T)
    integer ids; temperature a float or (B,). Returns three (B, T) float32 tensors, None for the ones not asked for.
    """
    bs, positions = labels.shape
    t = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device).clamp(min=MIN_TEMPERATURE)
    t = t.expand(bs).contiguous() if t.dim() == 0 else t
    chunk = max(1, chunk_logits // logits.shape[-1])
    log_probs, entropy, spi2 = _ChunkedLogProbs.apply(logits, labels, t, positions, chunk, want_entropy,
                                                      want_sum_pi_squared)
    return log_probs, entropy if want_entropy else None, spi2 if want_sum_pi_squared else None


#: The most logits (rows × positions × vocab) one forward pass without gradients makes: 2^27 fp32 are 512 MiB, i.e. 3
#: rows of 257 positions at Qwen2.5's 151,936 tokens; a step's 64 rows would be 10 GB at once.
LOGITS_PER_PASS = 1 << 27


def logit_rows_per_pass(positions: int, vocab: int, budget: int = LOGITS_PER_PASS) -> int:
    """How many rows of ``positions`` × ``vocab`` logits one forward pass without gradients may hold (≥ 1): the
    reading is done that many rows at a time, so its memory stays within ``budget`` logits whatever the batch."""
    return max(1, budget // max(1, positions * vocab))


def use_chunked_logits(rows: int, positions: int, vocab: int, threshold: int = CHUNK_LOGITS_THRESHOLD) -> bool:
    """Whether a forward over rows × positions × vocab logits takes the chunked path: above ``threshold`` logits,
    or at any size from :data:`CHUNK_VOCAB` vocabulary entries."""
    return rows * positions * vocab > threshold or vocab >= CHUNK_VOCAB


def top_k_top_p_filter(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """The sampling filters of a rollout engine: logits outside the top-k, then outside the nucleus, set to −inf
    (Hugging Face's ``TopKLogitsWarper`` then ``TopPLogitsWarper``; vLLM's ``apply_top_k_top_p``; chapter §2).

    top-k keeps every logit ≥ the k-th largest (ties kept); top-p sorts ascending and drops the tokens whose
    cumulative probability is ≤ 1 − top_p, always keeping the most likely one. ``top_k ≤ 0`` and ``top_p ≥ 1`` are
    off. Shapes: (..., V) → (..., V), a new tensor; apply it to temperature-scaled logits, as the engines do. The
    log-softmax of the result is what ``rollout_log_probs`` hold with a filter on (vLLM's
    ``processed_logprobs``); the trainer recomputes on the unfiltered distribution, as verl does, so the two
    differ by log(kept probability mass) on every token.
    """
    out = logits
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - top_p)
        drop_sorted[..., -1:] = False
        out = out.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return out if out is not logits else logits.clone()
