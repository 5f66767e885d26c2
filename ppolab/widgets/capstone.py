"""``capstone_curves``: lab 17's part II — the curves of the short runs a grade trained with the learner's losses,
beside the same runs trained with ppolab's (``ppolab.experiments.capstone_grade``: grade (c), the actor; grade (d),
the critic)."""
from __future__ import annotations

from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ppolab.i18n import tr
from ppolab.widgets.common import _box

#: The learner's curve and the reference's.
YOURS, THEIRS = "rgb(200,30,60)", "rgb(120,120,120)"
#: Which grade trained which curves, and what its reference is called.
PARTS = (("c", "vanilla"), ("d", "verl's value loss"))


def capstone_curves(grade: Any) -> W.VBox:
    """Every curve of ``grade`` (what :func:`ppolab.experiments.capstone_grade.grade` returned): one panel a metric,
    the learner's run against the reference run, step by step. A grade that trained nothing yet gives one line
    saying when the curves appear. Figures: ``curves``."""
    results = getattr(grade, "results", None)
    if not isinstance(results, dict):
        raise TypeError(f"capstone_curves(grade={grade!r}): pass what capstone_grade.grade(...) returned")
    panels = [(part, ref, metric, pair) for part, ref in PARTS for metric, pair in
              results.get(part, {}).get("curves", {}).items()]
    if not panels:
        return _box([W.HTML(tr("No curve yet: grades (c) and (d) train once (a) and (b) are right."))], {}, {})
    fig = make_subplots(rows=1, cols=len(panels), horizontal_spacing=0.06,
                        subplot_titles=[f"({part}) {metric}" for part, _, metric, _ in panels])
    for col, (part, ref, metric, (mine, theirs)) in enumerate(panels, start=1):
        for ys, colour, name, dash in ((theirs, THEIRS, tr(ref, may_stay=True), "solid"),
                                       (mine, YOURS, tr("your run"), "dash")):
            fig.add_scatter(x=list(range(1, len(ys) + 1)), y=ys, mode="lines+markers", marker_size=3, name=name,
                            line={"color": colour, "dash": dash}, legendgroup=f"{part}{name}",
                            showlegend=metric == next(m for p, _, m, _ in panels if p == part), row=1, col=col)
        fig.update_xaxes(title_text=tr("step"), row=1, col=col)
    fig.update_layout(height=320, margin={"t": 60}, legend={"orientation": "h", "y": -0.25},
                      title=tr("your losses training the model, beside ppolab's"))
    fig.update_annotations(font_size=11)
    figs = {"curves": go.FigureWidget(fig)}
    return _box([figs["curves"]], {}, figs)
