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
    parts = [(part, ref, results[part]["curves"]) for part, ref in PARTS if results.get(part, {}).get("curves")]
    if not parts:
        return _box([W.HTML(tr("No curve yet: grades (c) and (d) train once (a) and (b) are right."))], {}, {})
    cols = max(len(curves) for _, _, curves in parts)
    titles = [f"({part}) {metric}" if j < len(curves) else "" for part, _, curves in parts
              for j, metric in enumerate([*curves, *[""] * (cols - len(curves))])]
    fig = make_subplots(rows=len(parts), cols=cols, horizontal_spacing=0.06, vertical_spacing=0.22,
                        subplot_titles=titles)
    for row, (part, ref, curves) in enumerate(parts, start=1):
        for col, (metric, (mine, theirs)) in enumerate(curves.items(), start=1):
            for ys, colour, name, dash in ((theirs, THEIRS, tr(ref, may_stay=True), "solid"),
                                           (mine, YOURS, tr("your run"), "dash")):
                fig.add_scatter(x=list(range(1, len(ys) + 1)), y=ys, mode="lines+markers", marker_size=3,
                                name=name, line={"color": colour, "dash": dash}, legendgroup=f"{part}{name}",
                                showlegend=col == 1, row=row, col=col)
            fig.update_xaxes(title_text=tr("step"), row=row, col=col)
    fig.update_layout(height=300 * len(parts), margin={"t": 60}, legend={"orientation": "h", "y": -0.15},
                      title=tr("your losses training the model, beside ppolab's"))
    fig.update_annotations(font_size=11)
    figs = {"curves": go.FigureWidget(fig)}
    return _box([figs["curves"]], {}, figs)
