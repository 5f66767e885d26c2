"""Small helpers shared by test modules (tests/ is on sys.path under pytest)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def logged(run) -> list[dict]:
    """metrics.jsonl of a run (a Run or its directory) as written: no NaN filling of a DataFrame."""
    path = Path(getattr(run, "path", run)) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def stable(metrics: dict) -> dict:
    """Metrics that must repeat exactly: everything but wall-clock timings and throughput."""
    return {k: v for k, v in metrics.items() if not k.startswith(("timing_s/", "perf/time", "perf/throughput"))}


def sweep_values(ctl, n: int = 5) -> list:
    """What a sweep sets a control to: every option of a choice; both states of a checkbox; for a slider its min,
    max and ``n`` values in between (a FloatLogSlider's min/max are exponents), cast to the slider's type."""
    if hasattr(ctl, "options"):
        return list(ctl.options)
    if not hasattr(ctl, "min"):
        return [not ctl.value, ctl.value]
    values = [ctl.min, ctl.max, *np.linspace(ctl.min, ctl.max, n)]
    if hasattr(ctl, "base"):
        values = [ctl.base**v for v in values]
    return [type(ctl.value)(v) for v in values]


def sweep_all(w, n: int = 5, skip=()) -> None:
    """Move every control of explorer ``w`` (its ``.controls``) through :func:`sweep_values`, then back to where
    it started; each move redraws the figures, so a control that breaks them raises here."""
    for name, ctl in w.controls.items():
        if name in skip or not hasattr(ctl, "value"):
            continue
        start = ctl.value
        for v in sweep_values(ctl, n):
            ctl.value = (v,) if isinstance(start, tuple) else v  # a SelectMultiple takes tuples
        ctl.value = start
