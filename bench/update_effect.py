"""What lab 18's replay costs: seconds per replayed optimizer step, at the shipped shape and at a real model's shape,
and what the update plan adds to a recorded step.

    python bench/update_effect.py [RUN ...] [--realistic DIR]

For each RUN (a shipped run's name or a run dir; default: grpo_tiny and ppo_fire_tiny) it replays every actor
optimizer step of recorded step 1 with ``ppolab.numbers.update_effect.step_effect`` (the worker's own update; per
optimizer step: one backward pass per loss term, the real step, one forward over the step's rows) and prints the
seconds per optimizer step, then the explorer's build and move times. ``--realistic DIR``: the same on a run of
``bench/realistic_shape.py`` (a 151,936-token vocabulary; its newest ``DIR/run-*``, built there first at 16 rows ×
256 tokens, 2 ranks, when DIR holds none). It also prints, per recorded step, the bytes of
``info["update_plans"]`` in the step's JSON and of the actor's state before the step (``trainer.record_update_state``:
the ``update_state.*`` tensors; also what it would cost where the run did not keep it: 12 bytes per trainable actor
weight, Adam's two moments beside the weight) against the step's recorded bytes. Numbers, not asserts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ppolab.numbers.update_effect import _CACHE, n_optimizer_steps, step_effect  # noqa: E402
from ppolab.run.checkpoints import UPDATE_STATE  # noqa: E402
from ppolab.run.reader import resolve_run  # noqa: E402
from ppolab.update_plan import PLANS_KEY  # noqa: E402


def replay_times(run) -> dict:
    r = resolve_run(run)
    n = n_optimizer_steps(r, 1)
    _CACHE.clear()
    step_effect(r, 1, 0)  # the model load, once per run (not a replay's cost)
    _CACHE.clear()
    start = time.perf_counter()
    step_effect(r, 1, n - 1)  # one replay measures every optimizer step on its way
    total = time.perf_counter() - start
    return {"run": r.path.name, "optimizer_steps": n, "rows": int(r.step(1).tensors["responses"].shape[0]),
            "width": int(r.step(1).tensors["responses"].shape[1]), "s_per_opt_step": total / n}


def explorer_times(run) -> dict:
    from ppolab.widgets import update_effect_explorer

    start = time.perf_counter()
    w = update_effect_explorer(run)
    build = time.perf_counter() - start
    moves = []
    for control in w.controls.values():
        for value in [o[1] if isinstance(o, tuple) else o for o in control.options] * 3:
            t = time.perf_counter()
            control.value = value
            moves.append(time.perf_counter() - t)
    moves.sort()
    return {"build_s": build, "moves": len(moves), "p95_ms": 1e3 * moves[int(0.95 * (len(moves) - 1))],
            "median_ms": 1e3 * statistics.median(moves)}


def plan_bytes(run) -> list[dict]:
    r = resolve_run(run)
    out = []
    for s in r.steps:
        info = r.path / "steps" / f"step_{s:06d}.json"
        tensors = info.with_suffix(".safetensors")
        plans = json.loads(info.read_text()).get(PLANS_KEY)
        size = info.stat().st_size + tensors.stat().st_size
        kept = sum(v.numel() * v.element_size() for k, v in r.step(s).tensors.items()
                   if k.startswith(UPDATE_STATE))
        out.append({"step": s, "step_bytes": size, "state_bytes": kept,
                    "plan_bytes": len(json.dumps(plans)) if plans else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*", default=["grpo_tiny", "ppo_fire_tiny"])
    ap.add_argument("--realistic", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    runs = list(args.runs)
    if args.realistic is not None:
        def found() -> list[Path]:  # bench/realistic_shape.py writes DIR/run-<time>/
            return sorted(p.parent for p in args.realistic.glob("run-*/config.json"))
        if not found():
            subprocess.run([sys.executable, "bench/realistic_shape.py", "--out", str(args.realistic), "--rows", "16",
                            "--response-length", "256", "--ranks", "2", "--steps", "2"], cwd=ROOT, check=True)
        runs.append(str(found()[-1]))
    print(f"{'run':28s} {'opt steps':>9s} {'rows×R':>9s} {'s / opt step':>12s} {'explorer build':>14s} "
          f"{'move p95':>9s}")
    for run in runs:
        t = replay_times(run)
        e = explorer_times(run)
        print(f"{t['run']:28s} {t['optimizer_steps']:9d} {t['rows']:>4d}×{t['width']:<4d} {t['s_per_opt_step']:12.2f} "
              f"{e['build_s']:13.1f}s {e['p95_ms']:7.1f}ms")
    print("\nupdate plan and update state in the step record (bytes): step, plan, state before the update, whole step "
          "(json + safetensors)")
    for run in runs:
        weights = sum(torch.Size(p["shape"]).numel() for p in step_effect(run, 1, 0)["params"])
        for row in plan_bytes(run)[:3]:
            plan = "not recorded (a run recorded before plans were kept)" if row["plan_bytes"] is None else \
                f"{row['plan_bytes']} ({100 * row['plan_bytes'] / row['step_bytes']:.1f} %)"
            base = row["step_bytes"] - row["state_bytes"]
            state = (f"kept {row['state_bytes']} (+{100 * row['state_bytes'] / base:.0f} %)" if row["state_bytes"]
                     else f"not kept (would be {12 * weights} = +{100 * 12 * weights / base:.0f} %)")
            print(f"  {resolve_run(run).path.name:26s} step {row['step']:3d}: plan {plan}; state {state}; "
                  f"step {row['step_bytes']}")


if __name__ == "__main__":
    main()
