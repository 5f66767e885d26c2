"""Generate responses and score them with the rule rewards: greedy and sampled accuracy.

    python -m ppolab.eval --model data/models/tiny-arith --data data/arith/test.parquet
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ppolab import rewards
from ppolab.data import RLDataset, load_rl_dataset
from ppolab.models import SHIPPED_ARITH, SHIPPED_MODEL, load_tokenizer_and_model


def generate(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    do_sample: bool,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    batch_size: int = 256,
    generator_seed: int | None = None,
) -> list[list[int]]:
    """One response per prompt, ending with EOS if it stopped (the hf engine's ``generate_tokens``, cut at the first
    EOS). ``top_k=-1`` means no top-k (as in verl); ``generator_seed`` makes sampling repeatable without touching
    the global RNG state."""
    from ppolab.rollout.base import SamplingParams, eos_token_ids
    from ppolab.rollout.hf import generate_tokens

    device = next(model.parameters()).device
    rng = contextlib.nullcontext()
    if generator_seed is not None:
        rng = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
    with rng:
        if generator_seed is not None:
            torch.manual_seed(generator_seed)
        tokens, _, mask = generate_tokens(model, tokenizer, prompt_ids, max_new_tokens,
                                          SamplingParams(temperature, top_p, top_k, do_sample),
                                          eos_token_ids(model, tokenizer), batch_size)
    return [row[:n].tolist() for row, n in zip(tokens, mask.sum(-1).long().tolist())]


def evaluate(
    model: Any,
    tokenizer: Any,
    dataset: RLDataset | Sequence[dict[str, Any]],
    max_new_tokens: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    n_examples: int = 3,
    reward_fn: Any = None,
    batch_size: int = 256,
    seed: int = 0,
) -> dict[str, Any]:
    """Accuracy (share of rewards equal to 1.0), mean reward, flexible accuracy (the last number in the
    response is right, marker or not), the share of responses with a ``####`` marker, mean response
    length in tokens (EOS included) and ``n_examples`` tuples ``(prompt, response, ground_truth, score)``."""
    reward_fn = reward_fn or rewards.compute_score
    items = list(dataset)
    responses = generate(
        model, tokenizer, [it["input_ids"] for it in items], max_new_tokens, do_sample, temperature,
        batch_size=batch_size, generator_seed=seed if do_sample else None,
    )
    texts = [tokenizer.decode(resp, skip_special_tokens=True) for resp in responses]
    scores, _ = rewards.score_responses(reward_fn, items, texts)
    flexible = [rewards.gsm8k_compute_score(text, str(it["ground_truth"]), "flexible") == 1.0
                for it, text in zip(items, texts)]
    marked = ["####" in text for text in texts]
    examples = [(it["raw_prompt"][-1]["content"], text, it["ground_truth"], s)
                for it, text, s in list(zip(items, texts, scores))[:n_examples]]
    n = max(len(items), 1)
    return {
        "accuracy": sum(s == 1.0 for s in scores) / n,
        "mean_score": sum(scores) / n,
        "flexible_accuracy": sum(flexible) / n,  # the last number is right, whatever the format
        "marker_rate": sum(marked) / n,  # share of answers that use the '####' marker
        "mean_response_length": sum(len(r) for r in responses) / n,
        "n": len(items),
        "examples": examples,
    }


def validation_metrics(items: Sequence[dict[str, Any]], scores: Sequence[float], response_lengths: torch.Tensor,
                       n: int) -> dict[str, float]:
    """verl's validation metrics of ``n`` responses per prompt: ``val/accuracy`` (share of scores equal to 1.0),
    ``val/reward_mean``, ``val/response_length_mean`` and ``val-core/<data_source>/reward/mean@<n>``."""
    by_source: dict[str, list[float]] = {}
    for item, s in zip(items, scores):
        by_source.setdefault(item["data_source"], []).append(s)
    metrics = {"val/accuracy": float(np.mean([s == 1.0 for s in scores])), "val/reward_mean": float(np.mean(scores)),
               "val/response_length_mean": float(response_lengths.float().mean())}
    for source, values in by_source.items():
        metrics[f"val-core/{source}/reward/mean@{n}"] = float(np.mean(values))
    return metrics


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ppolab.eval", description="greedy and sampled accuracy of a model")
    p.add_argument("--model", default=str(SHIPPED_MODEL), help="local model directory")
    p.add_argument("--data", nargs="+", default=[str(SHIPPED_ARITH / "test.parquet")], help="verl-format parquet")
    p.add_argument("--n", type=int, default=500, help="number of prompts (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--max-prompt-length", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="for the sampled run")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--examples", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    args = p.parse_args(argv)

    tok, model = load_tokenizer_and_model(args.model, args.dtype, args.device)
    ds = load_rl_dataset(args.data, tok, args.max_prompt_length)
    ds = ds[: args.n] if args.n > 0 else ds
    print(f"model {args.model}  data {' '.join(args.data)}  prompts {len(ds)}")
    for name, sample in (("greedy", False), (f"sampled (T={args.temperature:g})", True)):
        t0 = time.perf_counter()
        r = evaluate(model, tok, ds, args.max_new_tokens, sample, args.temperature, args.examples,
                     batch_size=args.batch_size, seed=args.seed)
        print(f"{name:>18}: accuracy {r['accuracy']:.3f}  mean reward {r['mean_score']:.3f}  "
              f"flexible {r['flexible_accuracy']:.3f}  '####' used {r['marker_rate']:.3f}  "
              f"mean length {r['mean_response_length']:.2f} tokens  ({time.perf_counter() - t0:.1f} s)")
        for prompt, resp, gt, s in r["examples"]:
            print(f"{'':>20}{prompt!r} -> {resp!r}  (truth {gt}, reward {s:g})")


if __name__ == "__main__":
    main()
