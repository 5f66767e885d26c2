"""Small helpers shared by test modules (tests/ is on sys.path under pytest)."""
from __future__ import annotations

import json
from pathlib import Path


def logged(run) -> list[dict]:
    """metrics.jsonl of a run (a Run or its directory) as written: no NaN filling of a DataFrame."""
    path = Path(getattr(run, "path", run)) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def stable(metrics: dict) -> dict:
    """Metrics that must repeat exactly: everything but wall-clock timings and throughput."""
    return {k: v for k, v in metrics.items() if not k.startswith(("timing_s/", "perf/time", "perf/throughput"))}
