"""``ablation_curves``: lab 15's predict-the-curve figures — every knob's short runs against their base, seed by seed
(ppolab.experiments.ablations)."""
from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ppolab.experiments import ablations
from ppolab.i18n import tr
from ppolab.widgets.common import _box, on_move

#: Line colours of the base and of the run with the knob; one dash a seed.
BASE, KNOB = "rgb(120,120,120)", "rgb(200,30,60)"
DASHES = ("solid", "dash", "dot", "dashdot")
#: One colour a seed in the overview of differences.
SEED_COLOURS = ("rgb(200,30,60)", "rgb(40,90,200)", "rgb(30,150,80)", "rgb(160,100,20)")


def ablation_curves(run="grpo_tiny", knob: str | None = None) -> W.VBox:
    """The short runs of :func:`ppolab.experiments.ablations.ablation_runs` on ``run`` (trained on first use for a
    run that is not the shipped ``grpo_tiny``): every knob's own metric as each seed's difference from its base —
    what :func:`~ppolab.experiments.ablations.verdict` reads — and, for one knob, its runs and bases beside the
    outcomes (:data:`~ppolab.experiments.ablations.OUTCOMES`: score and response length).

    Controls: ``knob`` (Dropdown). Figures: ``overview`` (every knob's differences), ``knob`` (the chosen knob's
    metric and the outcome curves, one line a seed).
    """
    runs = ablations.ablation_runs(run)
    shown = [k for k in ablations.KNOBS if k in runs]
    if not shown:
        raise ValueError(f"no knob of ppolab.experiments.ablations.KNOBS applies to {run}")
    knob = knob or shown[0]
    if knob not in shown:
        raise ValueError(f"knob must be one of {shown} (the knobs this run can take), got {knob!r}")
    labels = {k: ablations.knob_label(run, k) for k in shown}
    seeds = ablations.seeds(run)
    steps = list(range(1, ablations.STEPS + 1))

    cols = min(4, len(shown))
    rows = -(-len(shown) // cols)
    overview = make_subplots(rows=rows, cols=cols, vertical_spacing=0.16, horizontal_spacing=0.06,
                             subplot_titles=[f"{labels[k]}<br>{ablations.KNOBS[k].metric}" for k in shown])
    for i, k in enumerate(shown):
        at = {"row": i // cols + 1, "col": i % cols + 1}
        overview.add_hline(y=0, line_color="grey", line_width=1, **at)
        for j, d in enumerate(ablations.differences(runs, k)):
            name = tr("seed {seed}").format(seed=seeds[j])
            overview.add_scatter(x=steps, y=d, mode="lines+markers", marker_size=3, name=name, legendgroup=name,
                                 line_color=SEED_COLOURS[j % len(SEED_COLOURS)], showlegend=i == 0, **at)
    overview.update_layout(height=300 * rows, margin={"t": 80}, legend={"orientation": "h", "y": -0.08},
                           title=tr("with the knob − base, seed by seed: {steps} steps, one knob changed").format(
                               steps=ablations.STEPS))
    overview.update_annotations(font_size=10)
    figs = {"overview": go.FigureWidget(overview)}

    panels = (None, *ablations.OUTCOMES)
    figs["knob"] = go.FigureWidget(make_subplots(rows=1, cols=len(panels), horizontal_spacing=0.07,
                                                 subplot_titles=[" "] * len(panels)))
    figs["knob"].update_layout(height=340, margin={"t": 80}, legend={"orientation": "h", "y": -0.2})
    controls = {"knob": W.Dropdown(options=[(labels[k], k) for k in shown], value=knob, description=tr("knob"),
                                   layout={"width": "520px"}, style={"description_width": "initial"})}

    @on_move
    def update(*_):
        k = controls["knob"].value
        fig = figs["knob"]
        mine, base = ablations.pair(runs, k)
        with fig.batch_update():
            fig.data = ()
            for col, metric in enumerate((ablations.KNOBS[k].metric, *ablations.OUTCOMES), start=1):
                for j in range(len(seeds)):
                    dash = DASHES[j % len(DASHES)]
                    for rs, colour, who in ((base, BASE, tr("base")), (mine, KNOB, tr("with the knob"))):
                        name = tr("{who}, seed {seed}").format(who=who, seed=seeds[j])
                        fig.add_scatter(x=steps, y=ablations.curve(rs[j], metric), mode="lines", name=name,
                                        legendgroup=name, line={"color": colour, "dash": dash},
                                        showlegend=col == 1, row=1, col=col)
                fig.layout.annotations[col - 1].text = metric
            fig.layout.title.text = labels[k]

    controls["knob"].observe(update, names="value")
    update()
    note = W.HTML(tr("Above: each seed's curve with the knob minus its own base's (the two share the seed and the "
                     "first rollouts). A knob's verdict reads each seed's mean difference over steps 2–{steps}: "
                     "<code>up</code> where every seed's is above 0 by more than their spread, <code>down</code> "
                     "likewise below, <code>flat</code> otherwise. Below: the chosen knob's runs and their bases, "
                     "its metric beside the outcomes.").format(steps=ablations.STEPS))
    return _box([figs["overview"], controls["knob"], figs["knob"], note], controls, figs, runs=runs)
