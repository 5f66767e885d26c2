"""``follow``: any explorer, or the metrics dashboard, kept on the newest committed step of a run that is training.

The run may be trained by another process or by ``ppolab.train_in_background`` in this kernel. A step dropdown
offers "latest" and every committed step (the commit rule of :mod:`ppolab.run.recorder`: a step being written is not
offered); with "latest" chosen, each step that lands rebuilds the explorer on it, carrying over the controls the
learner moved (a control named like one of the explorer's parameters). Nothing here computes: the explorer
shown for a step is the one ``explorer(run, step=k)`` builds after training.
"""
from __future__ import annotations

import atexit
import html
import inspect
import math
import numbers
import threading
import weakref
from typing import Any, Callable

import ipywidgets as W

from ppolab.errors import ArgumentError
from ppolab.i18n import tr
from ppolab.widgets.common import resolve_run

#: Followers whose polling thread may run: stopped when the widget closes or the interpreter exits (a thread still
#: inside torch at shutdown aborts the process).
_FOLLOWING: "weakref.WeakSet[W.VBox]" = weakref.WeakSet()
LATEST = "latest"


def stop_following(box: W.VBox, timeout: float | None = 5.0) -> None:
    """Stop ``box``'s polling and wait for a rebuild in progress (at most ``timeout`` s)."""
    box.stop_event.set()
    thread = box.poller
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout)


@atexit.register
def _stop_all() -> None:
    for box in list(_FOLLOWING):
        stop_following(box)


def _carried(old: Any, params: set[str]) -> dict[str, Any]:
    """The values of the old explorer's controls that the explorer takes as parameters (the learner's settings)."""
    controls = getattr(old, "controls", {}) or {}
    return {name: c.value for name, c in controls.items() if name in params and hasattr(c, "value")}


def follow(explorer: Callable[..., Any], run=None, *, every: float | None = 2.0, **kwargs: Any) -> W.VBox:
    """``explorer(run, step=k, **kwargs)`` on the run's newest committed step, rebuilt as steps land.

    ``explorer``: any ``ppolab.widgets`` explorer taking ``(run, step=…)`` — or one without a step (the metrics
    dashboard), rebuilt when the run logs a step. An explorer that can show only some steps (the micro-batch
    invariance explorer replays step 1 alone) says which in ``explorer.showable_steps(run)``; "latest" is then the
    newest of those, and it stays there while later steps land. ``every``: seconds between looks at the run dir (a
    daemon thread; a finite number > 0; None: only when :meth:`refresh` is called). Controls: ``step`` (Dropdown:
    "latest" or a committed step). Attributes: ``explorer`` (the explorer shown now), ``shown`` (its step),
    ``refresh()`` (look now), ``stop()``.
    """
    # a period of 0 (or less) would re-read the run dir tens of thousands of times a second; inf or NaN never
    # looks again — None says that plainly
    if every is not None and (isinstance(every, bool) or not isinstance(every, numbers.Real)
                              or not math.isfinite(every) or every <= 0):
        raise ArgumentError(f"every must be a finite number of seconds > 0 between looks at the run dir (e.g. "
                            f"2.0), or None to look only when refresh() is called; got {every!r}")
    r = resolve_run(run)
    showable = getattr(explorer, "showable_steps", None)  # an explorer that can show only some steps names them
    params = set(inspect.signature(explorer).parameters)
    takes_step = "step" in params
    choice = W.Dropdown(options=[(tr("latest"), LATEST)], value=LATEST, description=tr("step"))
    status = W.HTML()
    holder = W.VBox()
    box = W.VBox([W.HBox([choice, status]) if takes_step else status, holder])
    box.controls, box.figures, box.explorer, box.shown, box.run = {"step": choice}, {}, None, None, r
    box.stop_event, box.poller = threading.Event(), None
    lock = threading.RLock()  # re-entered when setting the dropdown's options fires its observer

    def refresh(*_: Any) -> None:
        with lock:
            steps, pending = r.steps, r.being_written()
            if showable is not None:
                steps = [k for k in steps if k in set(showable(r))]
            seen = (tuple(steps), len(r.metrics)) if not takes_step else tuple(steps)
            options = [(tr("latest"), LATEST)] + [(str(s), s) for s in steps]
            if list(choice.options) != options:
                value = choice.value
                choice.options = options
                choice.value = value if value in (LATEST, *steps) else LATEST
            writing = (" · " + tr("step {k} is being written").format(k=pending[-1])) if pending else ""
            if takes_step and not steps:
                status.value = tr("waiting for the run's first recorded step") + writing
                return
            target = (steps[-1] if choice.value == LATEST else choice.value) if takes_step else seen
            if target == box.shown:
                status.value = (tr("showing step {k}").format(k=target) if takes_step else "") + writing
                return
            args = {**kwargs, **({"step": target} if takes_step else {})}
            carried = _carried(box.explorer, params - {"run", "step"}) if box.explorer is not None else {}
            try:
                try:
                    built = explorer(r, **{**args, **carried})
                except Exception:
                    if not carried:
                        raise
                    built = explorer(r, **args)  # a setting the new step cannot take: the explorer's defaults
            except Exception as e:
                status.value = tr("stopped following: {error}").format(error=html.escape(f"{type(e).__name__}: {e}"))
                box.stop_event.set()
                raise
            old, box.explorer, box.shown = box.explorer, built, target
            box.figures = getattr(built, "figures", {})
            holder.children = [built]
            status.value = (tr("showing step {k}").format(k=target) if takes_step else "") + writing
            if old is not None:
                old.close()

    def poll() -> None:
        while not box.stop_event.wait(every):
            try:
                refresh()
            except Exception:  # named on the widget by refresh; stop polling
                return

    choice.observe(refresh, names="value")
    box.refresh, box.stop = refresh, (lambda: stop_following(box))
    refresh()
    if every is not None:
        box.poller = threading.Thread(target=poll, name="ppolab.widgets.follow", daemon=True)
        _FOLLOWING.add(box)
        box.poller.start()
        close = box.close

        def closing() -> None:
            box.stop_event.set()
            close()
        box.close = closing
    return box
