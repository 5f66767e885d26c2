"""Shared plumbing of the explorers: which run, which step, and the masked tensors of that step."""
from __future__ import annotations

import contextlib
import functools
import gc
from typing import Any, Callable, Iterator

import ipywidgets as W
import torch

from ppolab.i18n import tr
from ppolab.run.reader import SHIPPED_RUNS, Run, resolve_run  # noqa: F401 (re-exported)
from ppolab.run.step import StepRecord
from ppolab.numbers.steps import (  # noqa: F401 (re-exported: the explorers' shared helpers)
    check_index,
    n_opt_steps,
    opt_step_label,
    actor_config,
    optimizer_step_batch,
    real_rows,
    step_tensors,
)


# ----------------------------------------------------------------------------------------------- plumbing


#: The most points one scatter draws: the numbers are computed over every token, the figure shows a fixed sample of
#: them beyond this (plotly's per-point cost is what makes a move slow on a real run's thousands of tokens).
MAX_DRAWN_POINTS = 1500


def drawn(select: torch.Tensor, limit: int = MAX_DRAWN_POINTS) -> torch.Tensor:
    """``select`` (a bool mask of any shape) thinned to at most ``limit`` True entries, evenly spaced in row-major
    order — the same ones at every move, so a slider changes the points, not which points. Unchanged when it
    already fits (every shipped run)."""
    flat = select.reshape(-1)
    idx = torch.nonzero(flat).flatten()
    if len(idx) <= limit:
        return select
    keep = torch.zeros_like(flat)
    keep[idx[torch.linspace(0, len(idx) - 1, limit).round().long()]] = True
    return keep.reshape(select.shape)


def drawn_note(select: torch.Tensor, shown: torch.Tensor) -> str:
    """`` (showing n of m)`` when :func:`drawn` thinned ``select``, else ``""``."""
    total, kept = int(select.sum()), int(shown.sum())
    return tr(" (showing {kept} of {total}, evenly spaced)").format(kept=kept, total=total) if kept < total else ""


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside the block (the previous count restored after). A move's tensors are small (a
    mini-batch's thousands of tokens): a second thread saves nothing there, and on a machine whose cores are busy
    with other work every parallel region waits for a core — a move went from ~30 ms to ~300 ms that way."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def on_move(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (an explorer's observer) run under :func:`one_thread`, with Python's cyclic garbage collector paused.

    A kernel that has opened several explorers holds millions of objects; a full collection that happens to fall
    inside a move took ~230 ms of a 5 ms move. Paused, the collector runs at the kernel's next allocations after the
    move instead (nothing is lost: reference counting still frees everything acyclic at once)."""
    @functools.wraps(fn)
    def move(*args: Any, **kwargs: Any) -> Any:
        was_on = gc.isenabled()
        gc.disable()
        try:
            with one_thread():
                return fn(*args, **kwargs)
        finally:
            if was_on:
                gc.enable()
    return move


def step_batches(rec: StepRecord) -> Callable[[int], dict[str, torch.Tensor]]:
    """:func:`optimizer_step_batch` of ``rec``, computed once per optimizer step (an explorer's moves that keep the
    optimizer step reuse its rows). The returned dicts are shared: read them, never write into them."""
    return functools.lru_cache(maxsize=None)(functools.partial(optimizer_step_batch, rec))


def as_array(x: torch.Tensor) -> Any:
    """A tensor as the numpy array a plotly trace takes: validated and sent as one binary buffer, where a list of
    thousands of Python floats is checked one by one."""
    return x.detach().cpu().numpy()


def _opt_step_slider(rec: StepRecord, value: int | None, description: str = "opt step") -> W.IntSlider:
    n = n_opt_steps(rec)
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
