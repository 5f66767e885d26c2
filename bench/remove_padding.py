"""Padded against packed forwards (verl ``use_remove_padding``) at two shapes: slots computed, seconds, peak memory.

    python bench/remove_padding.py [--shape qwen_gpu|realistic|both] [--rows N] [--budget TOKENS] [--seed S]

Each (shape, layout) runs in a fresh process, so its peak resident set (``VmHWM``) is its own. In each, a Qwen2 of
the realistic bench's width (hidden 64, 2 layers, tied embeddings, Qwen2.5's 151,936-token vocabulary — the LM head
is the largest matrix, as on the real model; random weights, no download) runs the two passes a step spends its
model time in, on the micro-batches the worker plans (``ppolab.update_plan.micro_batches``, the same planner):

* stage 4, π_old: a forward without gradients over every row (``rollout.log_prob_max_token_len_per_gpu``);
* stage 8, the actor's update: forward and backward of every micro-batch (``actor.ppo_max_token_len_per_gpu``).

Shapes (rows, lengths drawn with ``--seed``):

* ``qwen_gpu`` — ``grpo_qwen_gpu``'s: prompts of gsm8k-like length (60–220 tokens, max_prompt_length 512),
  responses long-tailed up to max_response_length 1,024 (median ≈ 260), dynamic micro-batches of ``--budget``
  tokens (the preset's 24,576); ``--rows`` 64 is one-eighth of its 512-row step, for a CPU;
* ``realistic`` — ``bench/realistic_shape.py``'s: 64 rows, arithmetic prompts (16–24 tokens), responses that run
  to the full 256 tokens (no EOS), fixed micro-batches of 8.

Printed per shape and layout: token slots computed ÷ real tokens (whole pass, and the worst micro-batch; packed,
the slots of the packed rows — each as long as the micro-batch's longest sequence — real tokens and the filler
that ends a row), seconds of each stage, the process's peak resident set. Numbers, not asserts. The same forward
is what the trainer runs with ``actor_rollout_ref.model.use_remove_padding=true`` (``ppolab.models.forward_response``).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

SHAPES = {
    "qwen_gpu": dict(rows=64, prompt=(60, 220), max_prompt=512, response_median=260, max_response=1024,
                     budget=24576, micro=None),
    "realistic": dict(rows=64, prompt=(16, 24), max_prompt=32, response_median=None, max_response=256,
                      budget=None, micro=8),
}


def build_batch(shape: dict, rows: int, seed: int):
    """Left-padded prompts ‖ right-padded responses of the shape's lengths (random token ids)."""
    import torch

    from ppolab.batch import Batch

    g = torch.Generator().manual_seed(seed)
    lo, hi = shape["prompt"]
    p_len = torch.randint(lo, hi + 1, (rows,), generator=g)
    if shape["response_median"] is None:
        r_len = torch.full((rows,), shape["max_response"])
    else:  # log-normal around the median, clipped at the maximum: a few responses run to the end
        r_len = (shape["response_median"] * torch.exp(0.8 * torch.randn(rows, generator=g))).long()
        r_len = r_len.clamp(8, shape["max_response"])
    P, R = int(p_len.max()), int(r_len.max())
    prompt_mask = (torch.arange(P) >= P - p_len[:, None]).long()
    response_mask = (torch.arange(R) < r_len[:, None]).long()
    return Batch({"prompts": torch.randint(3, 151_000, (rows, P), generator=g) * prompt_mask,
                  "prompt_mask": prompt_mask,
                  "responses": torch.randint(3, 151_000, (rows, R), generator=g) * response_mask,
                  "response_mask": response_mask})


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(name: str, packed: bool, rows: int, budget: int | None, seed: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from ppolab.algos.remove_padding import padded_slots
    from ppolab.batch import trimmed_inputs
    from ppolab.models import forward_response
    from ppolab.update_plan import micro_batches

    shape = dict(SHAPES[name])
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=151_936, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=shape["max_prompt"] + shape["max_response"])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    batch = build_batch(shape, rows, seed)
    budget = budget or shape["budget"]
    parts = micro_batches(batch, shape["micro"], budget)
    out = {"shape": name, "layout": "packed" if packed else "padded", "rows": rows, "micro_batches": len(parts),
           "budget": budget if shape["micro"] is None else None}
    slots, real, worst = 0, 0, 0.0
    for rows_ in parts:
        ids, mask, _ = trimmed_inputs(batch.select(rows_))
        s, n = padded_slots(mask, packed)
        slots, real, worst = slots + s, real + n, max(worst, s / n)
    out.update(slots_per_real=slots / real, worst_micro_batch=worst, real_tokens=real)
    t0 = time.perf_counter()
    with torch.no_grad():
        for rows_ in parts:
            ids, mask, r = trimmed_inputs(batch.select(rows_))
            forward_response(model, ids, mask, r, 1.0, remove_padding=packed)
    out["stage4_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for rows_ in parts:
        mb = batch.select(rows_)
        ids, mask, r = trimmed_inputs(mb)
        lp = forward_response(model, ids, mask, r, 1.0, remove_padding=packed).log_probs
        (-(lp * mb["response_mask"][:, :r]).sum() / real).backward()
    out["stage8_s"] = time.perf_counter() - t0
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--budget", type=int, default=None, help="token budget of a dynamic micro-batch (qwen_gpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", nargs=2, metavar=("SHAPE", "LAYOUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1] == "packed", args.rows, args.budget, args.seed)))
        return
    names = list(SHAPES) if args.shape == "both" else [args.shape]
    print(f"{'shape':<10} {'layout':<7} {'micro':>5} {'slots/real':>10} {'worst mb':>8} {'stage 4 s':>9} "
          f"{'stage 8 s':>9} {'peak MB':>8}")
    for name in names:
        for layout in ("padded", "packed"):
            cmd = [sys.executable, __file__, "--child", name, layout, "--rows", str(args.rows), "--seed",
                   str(args.seed)] + (["--budget", str(args.budget)] if args.budget else [])
            r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            print(f"{name:<10} {layout:<7} {r['micro_batches']:>5} {r['slots_per_real']:>10.2f} "
                  f"{r['worst_micro_batch']:>8.2f} {r['stage4_s']:>9.2f} {r['stage8_s']:>9.2f} "
                  f"{r['peak_rss_mb']:>8.0f}")


if __name__ == "__main__":
    main()
