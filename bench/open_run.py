"""How long opening a long run takes, and what it costs in memory: a run dir of N recorded steps (copies of one
shipped step, metrics of N steps) is opened with ``load_run``, its step list and metrics read, and one step's
tensors touched. Prints seconds and the resident-memory rise of each. Goal (issue 23): 1,000 steps open in < 1 s
and memory stays flat (tensors are read lazily, metrics parsed once).

    python bench/open_run.py [--steps 1000] [--run ppo_fire_tiny]
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import ppolab
from ppolab.run.files import STEP_FILE
from ppolab.run.reader import SHIPPED_RUNS


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_long_run(source: Path, out: Path, steps: int) -> Path:
    """``out``: ``source``'s config and tokenizer, its first recorded step copied ``steps`` times, ``steps`` rows of
    metrics (the source's rows repeated)."""
    out.mkdir(parents=True)
    shutil.copy(source / "config.json", out / "config.json")
    if (source / "tokenizer").is_dir():
        shutil.copytree(source / "tokenizer", out / "tokenizer")
    rows = [json.loads(line) for line in (source / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("step", 0) > 0]
    with open(out / "metrics.jsonl", "w") as f:
        for k in range(1, steps + 1):
            f.write(json.dumps({**rows[(k - 1) % len(rows)], "step": k}) + "\n")
    first = ppolab.load_run(source).steps[0]
    (out / "steps").mkdir()
    for k in range(1, steps + 1):
        for suffix in (".safetensors", ".json"):
            src = source / "steps" / (STEP_FILE.format(first) + suffix)
            shutil.copy(src, out / "steps" / (STEP_FILE.format(k) + suffix))
    return out


def timed(label: str, fn):
    before, start = rss_mib(), time.perf_counter()
    value = fn()
    print(f"{label:<34} {1e3 * (time.perf_counter() - start):8.1f} ms   RSS {rss_mib() - before:+7.1f} MiB")
    return value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--run", default="ppo_fire_tiny", choices=sorted(SHIPPED_RUNS))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_long_run(SHIPPED_RUNS[args.run], Path(tmp) / "long", args.steps)
        size = sum(f.stat().st_size for f in (path / "steps").glob("*.safetensors"))
        print(f"{args.steps} recorded steps of {args.run}: {size / 2**20:.0f} MiB of tensors, "
              f"{(path / 'metrics.jsonl').stat().st_size / 2**20:.1f} MiB of metrics")
        run = timed("load_run", lambda: ppolab.load_run(path))
        timed("run.steps", lambda: run.steps)
        timed("run.metrics (first: parse)", lambda: run.metrics)
        timed("run.metrics (again: cached)", lambda: run.metrics)
        rec = timed(f"run.step({args.steps // 2}) (header only)", lambda: run.step(args.steps // 2))
        timed("one tensor of it", lambda: rec["advantages"])
        timed("every step opened (headers)", lambda: [run.step(k) for k in run.steps])


if __name__ == "__main__":
    main()
