"""``aggregation_explorer``: the five ``loss_agg_mode``s on a recorded batch (chapter §10).

The weight a mode gives a trajectory is read off ``agg_loss`` by autograd — Σ_t ∂L/∂ℓ_{i,t} — so the bars are
exactly what the optimizer sees, with no formula re-written here.
"""
from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.i18n import tr
from ppolab.algos import LOSS_AGG_MODES
from ppolab.widgets.common import real_rows, resolve_run, step_tensors, on_move
from ppolab.numbers.aggregation import trajectory_weights  # noqa: F401 (re-exported)

#: Token-loss matrices the learner can aggregate (name → recorded tensor → (N, R) matrix).
LOSS_SOURCES = {
    "-advantages": lambda t: -t["advantages"],
    "entropy": lambda t: t["entropy"],
    "-old_log_probs (NLL)": lambda t: -t["old_log_probs"],
    "ones": lambda t: torch.ones_like(t["response_mask"]),
}


def aggregation_explorer(run=None, step=None, loss: str = "-advantages", loss_scale_factor: float | None = None,
                         n_rows: int = 16) -> W.VBox:
    """Aggregate one token-loss matrix of a recorded step with all five modes.

    ``loss``: a key of :data:`LOSS_SOURCES`; ``loss_scale_factor``: the divisor of seq-mean-token-sum-norm
    (None = padded response width, verl's fallback); ``n_rows``: trajectories shown in the weight bars (the
    aggregation always uses every real row). Figures: ``weights`` (per-trajectory weight, one bar group per
    mode), ``totals`` (the five scalars from ``agg_loss``).
    """
    r = resolve_run(run)
    if step is not None and step not in r.steps:
        raise ValueError(f"step must be one of the recorded steps {r.steps}, got {step!r}")
    rec = step_tensors(r, step)
    if loss not in LOSS_SOURCES:
        raise ValueError(f"loss must be one of {list(LOSS_SOURCES)}, got {loss!r}")
    t = rec.tensors
    keep = real_rows(rec)
    mask = t["response_mask"][keep]
    n_real, width = mask.shape
    if not isinstance(n_rows, int) or not 1 <= n_rows <= n_real:
        raise ValueError(f"n_rows must be an int in 1..{n_real}, got {n_rows!r}")
    max_lsf = 8 * width
    lsf = width if loss_scale_factor is None else loss_scale_factor
    if not isinstance(lsf, (int, float)) or not 1 <= lsf <= max_lsf:
        raise ValueError(f"loss_scale_factor must be a number in [1, {max_lsf}] or None, got {loss_scale_factor!r}")

    controls = {
        "loss": W.Dropdown(options=list(LOSS_SOURCES), value=loss, description=tr("token loss")),
        "loss_scale_factor": W.IntSlider(value=int(lsf), min=1, max=max_lsf, description="loss_scale_factor",
                                         continuous_update=False, style={"description_width": "initial"}),
        "n_rows": W.IntSlider(value=n_rows, min=1, max=n_real, description=tr("rows shown"), continuous_update=False),
    }
    figs = {
        # log axis: token-sum's weights are ~T_i, the other modes' ~T_i / (tokens or rows); on a linear axis they
        # (and the only bars loss_scale_factor moves, seq-mean-token-sum-norm) would be invisible next to it
        "weights": go.FigureWidget(layout={"title": tr("weight of each trajectory (Σ_t ∂L/∂ℓ_t, log scale)"),
                                               "barmode": "group", "height": 340, "yaxis_type": "log",
                                               "xaxis_title": tr("trajectory (response length)")}),
        "totals": go.FigureWidget(layout={"title": "agg_loss", "height": 280}),
    }
    for mode in LOSS_AGG_MODES:
        figs["weights"].add_bar(name=mode)
    figs["totals"].add_bar(x=list(LOSS_AGG_MODES))
    lengths = mask.sum(-1).long().tolist()

    @on_move
    def refresh(*_):
        mat = LOSS_SOURCES[controls["loss"].value](t)[keep]
        factor = float(controls["loss_scale_factor"].value)
        k = controls["n_rows"].value
        labels = [f"{i} ({lengths[i]})" for i in range(k)]
        totals, weights = [], {}
        for mode in LOSS_AGG_MODES:
            total, w = trajectory_weights(mat, mask, mode, factor if mode == "seq-mean-token-sum-norm" else None)
            totals.append(float(total))
            weights[mode] = w
        with figs["weights"].batch_update():
            for trace, mode in zip(figs["weights"].data, LOSS_AGG_MODES):
                trace.update(x=labels, y=weights[mode][:k].tolist())
        with figs["totals"].batch_update():
            figs["totals"].data[0].update(y=totals, text=[f"{v:.4g}" for v in totals])
        box.result = {"totals": dict(zip(LOSS_AGG_MODES, totals)), "weights": weights}

    for c in controls.values():
        c.observe(refresh, names="value")
    box = W.VBox([W.HBox(list(controls.values())), *figs.values()])
    box.controls, box.figures, box.record = controls, figs, rec
    refresh()
    return box
