"""Peak memory of one micro-batch's log-prob + entropy forward and backward at a real vocabulary (151,936 tokens).

    python bench/logprob_memory.py --chunked on|off|fused [--rows 4] [--response 64]
    python bench/logprob_memory.py --chunked fused --hidden 896 --rows 4 --response 256   # Qwen2.5-0.5B's head

``off``: the plain formulas on the model's logits; ``on``: the chunked formulas on the model's logits
(``forward_response(..., chunked=True, fused=False)``); ``fused``: log-probs and entropy from the hidden states
and the LM head over vocabulary chunks, no logits made (``ppolab/algos/fused_head.py``).

A Qwen2 of hidden 32 and one layer, random weights built from a config (no download), so nearly all memory is
the (rows × positions × vocab) logits and what the log-prob / entropy formulas make of them; ``--hidden 896`` gives
it Qwen2.5-0.5B's LM head (896 × 151,936, tied; one layer instead of 24 — the trunk's activations are not what the
three paths differ in), the shape ``bench/qwen_shape_vllm.py`` serves. Prints one JSON line:
``peak_mib`` is the rise of the process's peak resident set (``VmHWM``) over the baseline taken right before
the forward; ``logits_mib`` is one float32 copy of the model's logits, the unit the bound is stated in. Run each
setting in its own process: the peak never goes down. glibc serves these allocations (≥ 32 MiB) with mmap,
which are returned to the system when freed, so RSS follows the live tensors.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch

QWEN_VOCAB = 151936


def tiny_qwen(vocab: int = QWEN_VOCAB, hidden: int = 32, layers: int = 1, seed: int = 0):
    """A random Qwen2 of Qwen2.5's vocabulary and a toy trunk, in float32."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(cfg).float()


def peak_rss_mib() -> float:
    """This process's peak resident set, MiB: ``VmHWM`` of /proc/self/status where it exists — it belongs to the
    process's own address space. ``ru_maxrss`` (the fallback) is carried across ``execve``, so a child started from
    a large parent (pytest after hundreds of tests) would report the parent's size as its own baseline."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def reset_peak() -> None:
    """Set ``VmHWM`` back to the current resident set (Linux: ``5`` into /proc/self/clear_refs), so the peak read
    after the forward is this forward's, not building the model's (at hidden 896 its transient copies outgrow a
    fused forward). Elsewhere the peak stays what it was: the rise is then a lower bound."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> dict:
    from ppolab.models import forward_response

    ap = argparse.ArgumentParser()
    ap.add_argument("--chunked", choices=["on", "off", "fused"], required=True)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=32, help="the trunk's width (896: Qwen2.5-0.5B's head)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = tiny_qwen(hidden=args.hidden)
    model.requires_grad_(False)
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(True)  # a trainable weight below the logits
    ids = torch.randint(0, QWEN_VOCAB, (args.rows, args.prompt + args.response),
                        generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    path = {"chunked": args.chunked != "off", "fused": args.chunked == "fused"}
    # warm-up on a tiny batch: allocator pools, kernels, autograd graph machinery
    forward_response(model, ids[:1, -4:], mask[:1, -4:], 2, 1.0, True, True, **path)
    reset_peak()
    base = peak_rss_mib()
    start = time.perf_counter()
    out = forward_response(model, ids, mask, args.response, 0.7, True, True, **path)
    (out.log_probs.sum() + 0.01 * out.entropy.sum()).backward()
    result = {"chunked": args.chunked, "hidden": args.hidden, "rows": args.rows, "positions": args.response + 1,
              "logits_mib": args.rows * (args.response + 1) * QWEN_VOCAB * 4 / 2**20,
              "peak_mib": peak_rss_mib() - base, "seconds": time.perf_counter() - start}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
