"""What the fused LM head saves on a GPU: ``grpo_qwen_gpu`` at the preset's own batch, with and without it.

    python bench/gpu_head_memory.py [--model DIR] [--steps 2] [--paths fused,plain] [key=value ...]

On one CUDA GPU, the same training run twice in this process: ``fused`` is ppolab as it is (log-probs and entropy
from the hidden states over vocabulary blocks, ``ppolab/algos/fused_head.py``, the path every vocabulary from
``CHUNK_VOCAB`` tokens takes); ``plain`` forces the plain formulas on the model's logits, as the tiny models run
(``ppolab.models.use_chunked_logits`` replaced by ``False`` for that run: the comparison needs a switch no config
should have). Each prints per-stage seconds of every step, the policy-gradient loss, gradient norm and
entropy, and the peak GPU memory the torch allocator held. The two paths' metrics differ by the logits' rounding:
the plain path takes the bf16 logits the model's head returns (at this model's logits of ~30, steps of 0.125), the
fused one computes them in float32 (gradient norm within a few %). A path that runs out of memory prints that
and the allocation it failed on: at the preset's batch that is the finding.

The model is ``tools/gpu_smoke.py``'s (Qwen2.5-0.5B's architecture, random weights, the 151,936-token vocabulary,
bf16) unless ``--model`` names a local one; engine hf (vLLM's pool would not be counted by the torch allocator).
Data, reward and the rest of the overrides are the smoke run's, with the batch set back to the preset's: 64
prompts × 8, responses up to 1,024 tokens, mini-batches of 16 prompts, micro-batches packed by a 24,576-token
budget. Measured on an H200 (2026-12-04): fused 50.5 GiB peak, a step 14.8–17.9 s; plain out of memory on the
139.8 GiB card (a 21.4 GiB float32 logits tensor for one 128-row micro-batch, 120 GiB already held). With
``data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=4`` (micro-batches of 32 rows) both fit:
fused 12.6 GiB, plain 21.2 GiB allocated (36.9 GiB reserved).
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from gpu_smoke import REWARD, build_model, overrides_for  # noqa: E402

PRESET_BATCH = ["data.max_response_length=1024", "data.train_batch_size=64", "actor_rollout_ref.rollout.n=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=16"]


def run_path(path: str, model: Path, work: Path, steps: int, extra: list[str]) -> None:
    """Train ``steps`` steps on ``path`` (fused or plain) and print its stages and peak memory."""
    import pandas as pd
    import torch

    import ppolab
    import ppolab.models as models

    own = models.use_chunked_logits
    folder = work / path
    folder.mkdir(parents=True)
    (folder / "reward.py").write_text(REWARD)
    overrides = overrides_for(model, folder, "hf", steps, "cuda") + PRESET_BATCH + [
        f"trainer.run_dir={folder / 'run'}"] + extra
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    if path == "plain":
        models.use_chunked_logits = lambda *args, **kwargs: False
    try:
        run = ppolab.train("grpo_qwen_gpu", overrides, progress=False)
    except torch.OutOfMemoryError as exc:
        print(f"{path}: out of memory after {time.perf_counter() - start:.0f} s — {str(exc).splitlines()[0][:240]}")
        return
    finally:
        models.use_chunked_logits = own
    wall = time.perf_counter() - start
    print(f"{path}: {steps} steps in {wall:.0f} s (model load included), peak "
          f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB allocated, "
          f"{torch.cuda.max_memory_reserved() / 2**30:.2f} GiB reserved")
    frame = run.metrics  # one row per step, indexed by step (ppolab.run.reader.Run.metrics)
    timing = sorted(k for k in frame.columns if k.startswith("timing_s/"))
    for step, r in frame[frame.get("perf/time_per_step", pd.Series(dtype=float)).notna()].iterrows():
        stages = "  ".join(f"{k.split('/', 1)[1]} {r[k]:.2f}" for k in timing if r[k] >= 0.05)
        read = {k: r.get(k, float("nan")) for k in ("response_length/mean", "actor/pg_loss", "actor/grad_norm",
                                                      "actor/entropy")}
        print(f"  step {step}: {stages}; response length "
              f"{read['response_length/mean']:.0f}, pg_loss {read['actor/pg_loss']:.4g}, "
              f"grad_norm {read['actor/grad_norm']:.4g}, entropy {read['actor/entropy']:.4g}")
    del run
    gc.collect()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a local model directory; default: tools/gpu_smoke.py's random Qwen2.5-0.5B shape")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--paths", default="fused,plain", help="which of fused, plain to run, in order")
    ap.add_argument("overrides", nargs="*", help="more key=value overrides for both runs")
    args = ap.parse_intermixed_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch: this bench measures GPU memory")
    work = Path(tempfile.mkdtemp(prefix="gpu-head-memory-"))
    model = Path(args.model) if args.model else work / "model"
    if not args.model:
        print(f"model: {build_model(model)}", flush=True)
    for path in args.paths.split(","):
        if path not in ("fused", "plain"):
            raise SystemExit(f"--paths: {path!r} is neither fused nor plain")
        run_path(path, model, work, args.steps, args.overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
