"""Train the short ablation runs of the shipped grpo_tiny into data/ablations/grpo_tiny/ (lab 15, "predict the
curve"): every run of ppolab.experiments.ablations.plan — the base, one run per knob of KNOBS and a knob's own base —
on every seed of ablations.seeds, each STEPS steps, then keep only what the labs read (config.json, metrics.jsonl,
summary.json) and print the bytes and seconds.

    python tools/train_ablations.py            # refuses when data/ablations/grpo_tiny/ exists
"""
from __future__ import annotations

import shutil
import sys
import time

from ppolab.experiments import ablations
from ppolab.course import COURSE_ROOT
from ppolab.run.reader import SHIPPED_RUNS, load_run

KEEP = {"config.json", "metrics.jsonl", "summary.json"}


def main() -> int:
    out = ablations.SHIPPED
    if out.exists():
        print(f"{out} exists; remove it first to train the ablations again", file=sys.stderr)
        return 1
    base = load_run(SHIPPED_RUNS["grpo_tiny"])
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for name, overrides in ablations.plan(base).items():
        for seed in ablations.seeds(base):
            start = time.time()
            path = ablations._train(base, name, (*overrides, f"trainer.seed={seed}"), tmp / name / f"seed{seed}")
            for p in path.iterdir():
                if p.name not in KEEP:
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
                else:  # no path of this machine in a shipped file: the checkout's own paths, relative to it
                    p.write_text(p.read_text().replace(str(tmp), str(out.relative_to(COURSE_ROOT)))
                                 .replace(str(COURSE_ROOT) + "/", ""))
            print(f"{name} seed {seed}: {time.time() - start:.1f} s, "
                  f"{sum(p.stat().st_size for p in path.iterdir()):,} bytes")
    tmp.rename(out)
    print(f"{out}: {sum(p.stat().st_size for p in out.rglob('*') if p.is_file()):,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
