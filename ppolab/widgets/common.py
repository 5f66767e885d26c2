"""Shared plumbing of the explorers: which run, which step, and the masked tensors of that step."""
from __future__ import annotations

from typing import Any

import ipywidgets as W

from ppolab.i18n import tr
from ppolab.record import SHIPPED_RUNS, Run, StepRecord, resolve_run  # noqa: F401 (re-exported)
from ppolab.numbers.steps import (  # noqa: F401 (re-exported: the explorers' shared helpers)
    _check_index,
    _n_opt_steps,
    _opt_step_label,
    actor_config,
    optimizer_step_batch,
    real_rows,
    step_tensors,
    token_labels,
)


# ----------------------------------------------------------------------------------------------- plumbing


def _opt_step_slider(rec: StepRecord, value: int | None, description: str = "opt step") -> W.IntSlider:
    n = _n_opt_steps(rec)
    value = n - 1 if value is None else value
    return W.IntSlider(
        value=value, min=0, max=n - 1, step=1, description=tr(description), continuous_update=False
    )


def _box(children: list, controls: dict, figures: dict, **extra: Any) -> W.VBox:
    box = W.VBox(children)
    box.controls = controls
    box.figures = figures
    for key, value in extra.items():
        setattr(box, key, value)
    return box


def _vline(x: float, color: str = "grey", dash: str = "dash") -> dict:
    return dict(
        type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1, line=dict(color=color, dash=dash)
    )


def _hline(y: float, color: str = "grey", dash: str = "dot") -> dict:
    return dict(
        type="line", xref="paper", yref="y", x0=0, x1=1, y0=y, y1=y, line=dict(color=color, dash=dash)
    )


def _vrect(x0: float, x1: float, color: str = "orange") -> dict:
    return dict(
        type="rect",
        xref="x",
        yref="paper",
        x0=x0,
        x1=x1,
        y0=0,
        y1=1,
        fillcolor=color,
        opacity=0.08,
        line=dict(width=0),
        layer="below",
    )


def _fmt(x: float) -> str:
    return f"{x:.6g}"


# ------------------------------------------------------------------------------------------------ 1. ratio
