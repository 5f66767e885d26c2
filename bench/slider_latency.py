"""Move every control of every explorer and print the latency of each move (recompute + redraw).

    python bench/slider_latency.py            # all explorers on their lab's run
    python bench/slider_latency.py clip_explorer kl_explorer
    python bench/slider_latency.py --run DIR  # every explorer on one run (yours, a realistic-shape one, …)

A move is timed from setting ``control.value`` until the observers return: ppolab's explorers recompute with
``ppolab.algos`` and update their ``FigureWidget``s synchronously inside that call, so this is the whole
server-side cost of one slider step (the browser's own redraw comes on top and is not measured here). Each move
is timed twice: wall clock, and process time (``time.process_time``, the CPU this process used, every thread) —
on a machine whose cores are busy with other work, wall time counts the waiting too.
The goal (issue 13): every formula slider's move has p95 ≤ 50 ms on a 2-core laptop CPU (≤ 100 ms on another run,
``--run``, e.g. the realistic-shape run of ``bench/realistic_shape.py``; issue 23). The replay-backed
explorer (lab 13) is reported separately: a move that needs a new replay runs a real optimizer step.
"""
from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL_MS = 50.0
RUN_GOAL_MS = 100.0  # on a run given with --run: a real model's vocabulary and lengths
#: explorer → (arguments, controls not to sweep). Replay-backed explorers are timed but not held to the goal.
EXPLORERS: dict[str, tuple[tuple, tuple]] = {
    "ratio_explorer": (("grpo_tiny",), ()),
    "clip_explorer": (("grpo_tiny",), ()),
    "dual_clip_explorer": (("grpo_tiny",), ()),
    "loss_assembly": (("grpo_tiny",), ()),
    "kl_explorer": (("ppo_gae_tiny",), ()),
    "exact_kl_explorer": (("ppo_gae_tiny",), ()),  # §7.3 on full distributions: the vocabulary-wide one
    "value_clip_explorer": (("ppo_gae_tiny",), ()),
    "mask_viewer": (("grpo_tiny",), ()),
    "aggregation_explorer": (("grpo_tiny",), ()),
    "batch_calculator": ((), ()),
    "metrics_dashboard": (("grpo_tiny",), ()),
    "mistakes_explorer": (("grpo_tiny",), ()),
    "gradient_gallery": (("ppo_fire_tiny",), ()),
    "invariance_explorer": (("grpo_tiny",), ()),
}
#: Each new setting of these is a real optimizer step (a replay of the reference and the chosen micro-batching),
#: cached after; held to REPLAY_GOAL_MS instead.
NOT_FORMULA = {"invariance_explorer"}
#: What an explorer needs from a run (``ppolab.numbers.needs.NEEDS``): on a run that lacks it, the one lacks line.
NEEDS_OF = {"value_clip_explorer": ("critic",)}
REPLAY_GOAL_MS = 1000.0


def values(ctl, n: int = 6) -> list:
    """The values a sweep sets: every option of a choice, both states of a checkbox, n points of a slider."""
    if hasattr(ctl, "options"):  # (label, value) pairs or plain values
        return [o[1] if isinstance(o, tuple) and len(o) == 2 else o for o in ctl.options]
    if not hasattr(ctl, "min"):
        return [not ctl.value, ctl.value]
    pts = np.linspace(ctl.min, ctl.max, n)
    if hasattr(ctl, "base"):
        pts = [ctl.base**v for v in pts]
    return [type(ctl.value)(v) for v in pts]


def time_explorer(name: str, args: tuple, skip: tuple, rounds: int = 2
                  ) -> dict[str, tuple[list[float], list[float]]]:
    """Every control's move times in ms, as (wall, process) lists, plus ``"(open)"``: building the explorer.

    Process time (``time.process_time``: CPU seconds of this process, every thread) is what a move costs when the
    machine's cores are shared with other work; wall time is what a learner waits on an idle machine."""
    import ppolab.widgets as widgets

    t0, c0 = time.perf_counter(), time.process_time()
    w = getattr(widgets, name)(*args)
    out = {"(open)": ([1000 * (time.perf_counter() - t0)], [1000 * (time.process_time() - c0)])}
    if getattr(w, "prefetch", None) is not None:  # the explorer replays its other settings in the background
        t0, c0 = time.perf_counter(), time.process_time()
        w.prefetch.join()
        out["(prefetch)"] = ([1000 * (time.perf_counter() - t0)], [1000 * (time.process_time() - c0)])
    for cname, ctl in w.controls.items():
        if cname in skip or not hasattr(ctl, "value"):
            continue
        start, walls, cpus = ctl.value, [], []
        for _ in range(rounds):
            for v in values(ctl):
                v = (v,) if isinstance(start, tuple) else v
                if v == ctl.value:
                    continue
                t0, c0 = time.perf_counter(), time.process_time()
                ctl.value = v
                walls.append(1000 * (time.perf_counter() - t0))
                cpus.append(1000 * (time.process_time() - c0))
        ctl.value = start
        if walls:
            out[cname] = (walls, cpus)
    return out


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"explorers (default all: {', '.join(EXPLORERS)})")
    parser.add_argument("--run", help="open every explorer on this run (a shipped run's name or a run dir)")
    args = parser.parse_args(argv)
    names, goal = args.names, (RUN_GOAL_MS if args.run else GOAL_MS)
    warnings.filterwarnings("ignore")
    import torch

    if args.run:
        import ppolab
        from ppolab.run.reader import resolve_run

        run = resolve_run(args.run)
        sizes = [f.stat().st_size for f in (run.path / "steps").glob("*.safetensors")]
        print(f"run {run.path}: {len(sizes)} recorded steps, {np.mean(sizes) / 1e6:.2f} MB of tensors per step"
              if sizes else f"run {run.path}: no recorded steps")
        for name, (explorer_args, skip) in EXPLORERS.items():
            EXPLORERS[name] = ((ppolab.load_run(run.path),) if explorer_args else (), skip)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; goal: formula sliders p95 ≤ {goal} ms")
    print(f"replay-backed explorers ({', '.join(sorted(NOT_FORMULA))}): every move, the first of each setting "
          f"included, ≤ {REPLAY_GOAL_MS:.0f} ms")
    print(f"{'explorer':22s} {'control':18s} {'moves':>5s} {'median ms':>10s} {'p95 ms':>8s} {'max ms':>8s} "
          f"{'cpu p95 ms':>10s}")
    worst, worst_replay, worst_cpu = 0.0, 0.0, 0.0
    for name in names or list(EXPLORERS):
        args, skip = EXPLORERS[name]
        if args and NEEDS_OF.get(name):
            from ppolab.numbers.needs import RunLacks, require

            try:
                require(args[0], *NEEDS_OF[name])
            except RunLacks as exc:
                print(f"{name:22s} not timed: {exc}")
                continue
        try:
            timings = time_explorer(name, args, skip)
        except Exception as exc:  # noqa: BLE001 — report and go on with the other explorers
            print(f"{name:22s} failed: {type(exc).__name__}: {exc}")
            continue
        for cname, (t, cpu) in timings.items():
            p95, cpu95 = float(np.percentile(t, 95)), float(np.percentile(cpu, 95))
            if cname in ("(open)", "(prefetch)"):
                print(f"{name:22s} {cname:18s} {1:5d} {t[0]:10.1f} {'':8s} {'':8s} {cpu[0]:10.1f}")
                continue
            if name in NOT_FORMULA:
                worst_replay = max(worst_replay, max(t))
                flag = "" if max(t) <= REPLAY_GOAL_MS else "  > goal"
            else:
                worst, worst_cpu = max(worst, p95), max(worst_cpu, cpu95)
                flag = "" if p95 <= goal else "  > goal"
            print(f"{name:22s} {cname:18s} {len(t):5d} {statistics.median(t):10.1f} {p95:8.1f} {max(t):8.1f} "
                  f"{cpu95:10.1f}{flag}")
    verdict = "within" if worst <= goal else "OVER"
    print(f"worst formula-slider p95: {worst:.1f} ms wall ({verdict} the {goal} ms goal), {worst_cpu:.1f} ms process "
          f"time")
    if worst_replay:
        verdict = "within" if worst_replay <= REPLAY_GOAL_MS else "OVER"
        print(f"slowest replay-backed move: {worst_replay:.0f} ms ({verdict} the {REPLAY_GOAL_MS:.0f} ms goal)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
