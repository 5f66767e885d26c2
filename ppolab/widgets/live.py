"""``live_training``: run ``ppolab.train`` in a notebook cell with a live reward / accuracy / clip-fraction plot."""
from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ppolab.i18n import tr

#: The metrics plotted live (one panel each).
LIVE_METRICS = ("critic/score/mean", "val/accuracy", "actor/pg_clipfrac")


def live_training(config=None, overrides=None, metrics: tuple[str, ...] = LIVE_METRICS, on_step=None,
                  progress: bool = False) -> W.VBox:
    """A widget that trains when ``start()`` is called (or its button is clicked) and plots as steps finish.

    ``config`` / ``overrides`` go to :func:`ppolab.train` unchanged (preset name, YAML or PPOConfig; verl-style
    overrides); the config is resolved up front, so a bad override raises here. ``metrics``: logged names to
    plot, one panel each — from step 0, the validation before training, when the config runs it.
    ``on_step(step, metrics, record)`` is called after the plot updates. ``start()`` runs training synchronously
    in the calling cell and returns the :class:`ppolab.run.reader.Run`, also kept as ``.run``; ``.history`` holds every
    step's metrics. One widget trains one run: after it, the button stays disabled ("trained") and a further
    ``start()`` or click only says so. Controls: ``start`` (Button). Figures: ``live``.
    """
    from ppolab.train import resolve_config

    metrics = tuple(metrics)
    if not metrics or not all(isinstance(m, str) for m in metrics):
        raise ValueError(f"metrics must be a non-empty tuple of metric names, e.g. {LIVE_METRICS}, got {metrics!r}")
    cfg = resolve_config(config, overrides)
    fig = go.FigureWidget(make_subplots(rows=1, cols=len(metrics), subplot_titles=metrics))
    for i, name in enumerate(metrics):
        fig.add_scatter(x=[], y=[], mode="lines+markers", name=name, row=1, col=i + 1)
    fig.update_layout(height=300, showlegend=False, title=tr("{name}: waiting for start()").format(
        name=cfg.trainer.experiment_name))
    status = W.HTML(tr("not started"))
    button = W.Button(description=tr("start training"), button_style="primary", icon="play")
    history: list[dict] = []

    limit = cfg.trainer.total_training_steps or tr("{n} epochs").format(n=cfg.trainer.total_epochs)

    def step_cb(step, m, record):
        if step > 0:
            history.append({"step": step, **m})
        with fig.batch_update():
            for trace, name in zip(fig.data, metrics):
                if name in m and m[name] is not None:
                    trace.x = (*trace.x, step)
                    trace.y = (*trace.y, float(m[name]))
            fig.layout.title = tr("{name}: step {step}/{limit}").format(name=cfg.trainer.experiment_name, step=step,
                                                                        limit=limit)
        status.value = f"step {step}/{limit}"  # the chapter writes "step" in Chinese too
        if on_step is not None:
            on_step(step, m, record)

    def start(*_):
        import importlib

        # the module, not ppolab.train the function: `import ppolab.train as m` binds the package's attribute,
        # which is the function once anyone has called ppolab.train(...) in this kernel
        train_module = importlib.import_module("ppolab.train")

        if box.run is not None or box.training:  # one widget, one run: a second click (queued while the first
            # trained) must not start another run behind the learner's back
            status.value = tr("this widget trains one run ({path}); run its cell again to train another").format(
                path=box.run.path if box.run is not None else tr("training now"))
            return box.run
        button.disabled, box.training = True, True
        status.value = tr("training…")
        try:
            box.run = train_module.train(cfg, on_step=step_cb, progress=progress)
        except BaseException as e:  # the reason on the widget, not only in the log console
            status.value = tr("stopped: {error}").format(error=html.escape(f"{type(e).__name__}: {e}"[:300]))
            button.disabled = False
            raise
        finally:
            box.training = False
        button.description, button.icon = tr("trained"), "check"
        status.value = tr("done: {n} steps → <code>{path}</code>").format(n=len(history), path=box.run.path)
        return box.run

    button.on_click(start)
    box = W.VBox([W.HBox([button, status]), fig])
    box.controls, box.figures, box.config, box.history, box.run = {"start": button}, {"live": fig}, cfg, history, None
    box.training = False
    box.start = start
    return box
