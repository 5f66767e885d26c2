"""Throughput and peak memory of the trainer on a preset (default: grpo_tiny on CPU).

    python bench/train_throughput.py [--preset grpo_tiny] [--steps 10] [key=value ...]

Prints per-stage seconds, tokens/s (prompt + response tokens of the step / step time, verl's
perf/throughput) and the peak resident memory of the process (and peak CUDA memory on a GPU).
Numbers, not asserts: speed goals live here, never in timed tests.
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time

import torch


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="grpo_tiny")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args(argv)

    import ppolab

    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        run = ppolab.train(args.preset, [f"trainer.total_training_steps={args.steps}", "trainer.test_freq=-1",
                                         "trainer.val_before_train=false", "trainer.record_freq=-1",
                                         f"trainer.run_dir={run_dir}", *args.overrides], progress=False)
        wall = time.perf_counter() - start
        m = run.metrics.iloc[1:] if len(run.metrics) > 1 else run.metrics  # step 1 includes warm-up
    stages = sorted(c for c in m.columns if c.startswith("timing_s/"))
    print(f"preset {args.preset}, {args.steps} steps, torch threads {torch.get_num_threads()}, "
          f"wall {wall:.1f} s (model load included)")
    for c in stages:
        print(f"  {c:<28} {m[c].mean():8.3f} s/step")
    print(f"  tokens/step                  {m['perf/total_num_tokens'].mean():8.0f}")
    print(f"  throughput                   {m['perf/throughput'].mean():8.0f} tokens/s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 1024**2)
    print(f"  peak resident memory         {rss:8.0f} MiB")
    if torch.cuda.is_available():
        print(f"  peak CUDA memory             {torch.cuda.max_memory_allocated() / 2**20:8.0f} MiB")


if __name__ == "__main__":
    main()
