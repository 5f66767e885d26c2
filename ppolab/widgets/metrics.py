"""``metrics_dashboard`` and ``warning_signs``: every logged metric of a run, what it means, and the chapter §15
warning signs checked automatically."""
from __future__ import annotations

from typing import TYPE_CHECKING

import ipywidgets as W
import plotly.graph_objects as go

from ppolab.i18n import tr
from ppolab.widgets.common import resolve_run, on_move
from ppolab.numbers.metrics import METRIC_MEANINGS, THRESHOLDS, meaning, sign_text, warning_signs  # noqa: F401

if TYPE_CHECKING:
    import torch


def metrics_dashboard(run=None, metric: str | None = None, *, metrics=None) -> W.VBox:
    """A dropdown over every logged metric of ``run`` with its meaning, its curve, and :func:`warning_signs`.

    ``metrics``: a frame of metrics indexed by step to show instead of a ppolab run's — a verl job's own log
    (``ppolab.verl_logs.read_verl_metrics``: its file logger JSONL or TensorBoard folder).
    Controls: ``metric`` (Dropdown). Figures: ``metric`` (the metric against the step). Attribute ``warnings``.
    """
    r = resolve_run(run) if metrics is None else None
    m = r.metrics if metrics is None else metrics
    names = sorted(m.columns)
    if not names:
        raise ValueError(f"{r.path if r is not None else 'the metrics given'} has no logged metrics")
    metric = metric or ("critic/score/mean" if "critic/score/mean" in names else names[0])
    if metric not in names:
        raise ValueError(f"metric must be one of the logged metrics {names}, got {metric!r}")
    controls = {"metric": W.Dropdown(options=names, value=metric, description=tr("metric"))}
    figs = {"metric": go.FigureWidget(layout={"height": 320, "xaxis_title": tr("step")})}
    figs["metric"].add_scatter(mode="lines+markers", marker={"size": 4})
    text = W.HTML()
    warnings = warning_signs(m)
    warn_html = W.HTML(tr("<b>warning signs (chapter §15):</b> ") + (
        tr("none found") if not warnings else "<ul>" + "".join(f"<li>{sign_text(w)}</li>" for w in warnings) + "</ul>"))

    @on_move
    def refresh(*_):
        name = controls["metric"].value
        s = m[name].dropna()
        with figs["metric"].batch_update():
            figs["metric"].data[0].update(x=s.index.tolist(), y=s.tolist(), name=name)
            figs["metric"].layout.title = name
            figs["metric"].layout.yaxis.title = name
        text.value = tr("<code>{name}</code>: {meaning}").format(name=name, meaning=tr(meaning(name)))

    controls["metric"].observe(refresh, names="value")
    box = W.VBox([controls["metric"], text, figs["metric"], warn_html])
    box.controls, box.figures, box.warnings, box.run = controls, figs, warnings, r
    refresh()
    return box


# ------------------------------------------------------------------------------------------ distributions
#: The per-step distributions of chapter §15 ("reward distribution, advantage distribution, response length")
#: and the logged metric whose mean each one has (verl's compute_data_metrics, ppolab.metrics.data_metrics).
DISTRIBUTIONS = {"score": "critic/score/mean", "advantage": "critic/advantages/mean",
                 "response_length": "response_length/mean"}


def step_distributions(run=None, steps=None) -> dict[int, dict[str, torch.Tensor]]:
    """The values behind the logged means, per recorded step, from the recorded tensors (real rows only):

    * ``score`` — one value per trajectory, Σ_t token_level_scores (``critic/score/*``);
    * ``advantage`` — one value per valid response token, as ``critic/advantages/*`` is computed (for GRPO every
      token of a trajectory carries the trajectory's scalar advantage);
    * ``response_length`` — loss_mask sums per trajectory, the mask as generated (``response_length/*``, as
      :func:`ppolab.metrics.data_metrics` counts it: rejection does not shorten a response; tool observations
      excluded);
    * ``advantage_per_trajectory`` — the masked token mean of the advantage per trajectory (NaN without tokens).

    ``steps``: recorded steps (default: all). Returns ``{step: {name: 1-D tensor}}``.
    """
    import torch

    from ppolab.numbers.steps import loss_mask_of_real_rows
    from ppolab.widgets.common import real_rows

    r = resolve_run(run)
    chosen = r.steps if steps is None else list(steps)
    missing = [s for s in chosen if s not in r.steps]
    if missing:
        raise ValueError(f"steps {missing} were not recorded; recorded steps: {r.steps}")
    out = {}
    for s in chosen:
        rec = r.step(s)
        t, real = rec.tensors, real_rows(rec)
        mask = t["response_mask"][real].float()
        adv = t["advantages"][real].float()
        n_tok = mask.sum(-1)
        out[s] = {"score": t["token_level_scores"][real].float().sum(-1),
                  "advantage": adv[mask.bool()],
                  "response_length": loss_mask_of_real_rows(rec)[real].sum(-1),
                  "advantage_per_trajectory": torch.where(n_tok > 0, (adv * mask).sum(-1) / n_tok.clamp(min=1),
                                                          torch.full_like(n_tok, float("nan")))}
    return out


def distribution_figure(run=None, steps=None) -> go.FigureWidget:
    """Three panels against the training step: the score (stacked shares of each value when the reward takes at most
    five values, else one box per step), the token advantages and the response lengths (one box per recorded step,
    the dashed line is the box's mean), each with the logged mean metric as a line, so the curve of means is seen as
    the centre of a distribution."""
    from plotly.subplots import make_subplots

    r = resolve_run(run)
    dist = step_distributions(r, steps)
    xs = list(dist)
    m = r.metrics
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[tr("score per trajectory (reward distribution)"),
                                        tr("advantage per valid response token"),
                                        tr("response length per trajectory")])
    values = sorted({round(float(v), 6) for s in xs for v in dist[s]["score"].tolist()})
    if len(values) <= 5:
        for v in values:
            shares = [float((dist[s]["score"].sub(v).abs() < 1e-6).float().mean()) for s in xs]
            fig.add_bar(x=xs, y=shares, name=tr("score = {v:g}").format(v=v), legendgroup="score", row=1, col=1)
        fig.update_layout(barmode="stack")
        fig.update_yaxes(title_text=tr("share of trajectories"), row=1, col=1)
    else:
        for s in xs:
            fig.add_box(x=[s] * len(dist[s]["score"]), y=dist[s]["score"].tolist(), name=tr("score {s}").format(s=s),
                        boxmean=True, showlegend=False, marker_color="#1f77b4", row=1, col=1)
    for row, key, color in ((2, "advantage", "#d62728"), (3, "response_length", "#2ca02c")):
        for s in xs:
            fig.add_box(x=[s] * len(dist[s][key]), y=dist[s][key].tolist(), name=tr("{key} {s}").format(key=key, s=s),
                        boxmean=True, showlegend=False, marker_color=color, row=row, col=1)
    for row, key in ((1, "score"), (2, "advantage"), (3, "response_length")):
        name = DISTRIBUTIONS[key]
        if name in m.columns and row > 1:  # the stacked shares of row 1 are on another scale
            curve = m[name].dropna()
            fig.add_scatter(x=curve.index.tolist(), y=curve.tolist(), mode="lines",
                            name=tr("logged {name}").format(name=name),
                            line={"color": "black", "width": 1}, row=row, col=1)
    fig.update_xaxes(title_text=tr("training step"), row=3, col=1)
    fig.update_layout(height=760,
                      title=tr("{run}: distributions per recorded step (chapter §15)").format(run=r.path.name),
                      legend={"orientation": "h", "y": -0.08})
    return go.FigureWidget(fig)
