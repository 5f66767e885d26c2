"""``trainers_explorer``: one optimizer step's tokens as verl 0.9.1, TRL and OpenRLHF weigh them, under the split the
learner picks (chapter §13; ``ppolab.numbers.three_trainers`` computes every weight)."""
from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go

from ppolab.i18n import tr
from ppolab.numbers import three_trainers as tt
from ppolab.numbers.invariance import divisors as _divisors
from ppolab.widgets.common import _box, on_move


def trainers_explorer(run=None, step: int | None = None, micro: int = 1, ranks: int = 1) -> W.VBox:
    """The run's optimizer step cut into micro-batches of ``micro`` rows on ``ranks`` data-parallel ranks. Figures:
    ``weights`` — each row's per-token weight × N (the step's loss tokens; 1 is the token mean over the whole step)
    against the row's loss tokens, one trace a rule; ``split`` — each rule's smallest and largest weight against its
    own weight with the whole step in one micro-batch on one rank (1 and 1: the rule is invariant)."""
    d = tt.step_mask(run, step)
    mask, rows = d["mask"], d["mask"].shape[0]
    the_rules = tt.rules(d["loss_agg_mode"], d["loss_scale_factor"])
    rank_options = [r for r in (1, 2, 4, 8) if rows % r == 0]
    if ranks not in rank_options:
        raise ValueError(f"ranks must be one of {rank_options} (they divide the optimizer step's {rows} rows), "
                         f"got {ranks!r}")
    if micro not in _divisors(rows // ranks):
        raise ValueError(f"micro must divide each rank's {rows // ranks} rows: one of {_divisors(rows // ranks)}, "
                         f"got {micro!r}")
    controls = {"ranks": W.Dropdown(options=rank_options, value=ranks, description=tr("data-parallel ranks"),
                                    style={"description_width": "initial"}),
                "micro": W.Dropdown(options=_divisors(rows // ranks), value=micro,
                                    description=tr("rows per micro-batch"), style={"description_width": "initial"})}
    lengths = mask.sum(-1)
    on_rows = lengths > 0
    # each rule's weights with the whole step in one micro-batch: what every split is compared with, once
    whole = {rule.name: tt.token_weights(mask, rule, tt.Split(rows), d["max_length"]) for rule in the_rules}
    figs = {
        "weights": go.FigureWidget(layout={
            "title": tr("weight of one token of each row × N (1 = the token mean over the optimizer step)"),
            "height": 360, "xaxis_title": tr("loss tokens of the row"), "yaxis_title": "w × N"}),
        "split": go.FigureWidget(layout={
            "title": tr("weight under this split ÷ weight with the whole step in one micro-batch (min–max)"),
            "height": 320, "barmode": "overlay", "xaxis_type": "log"}),
    }
    for rule in the_rules:
        figs["weights"].add_scatter(name=rule.name, mode="markers", marker={"size": 7, "opacity": 0.7})
    names = [rule.name for rule in the_rules]
    figs["split"].add_bar(name="max", orientation="h", y=names, marker_color="rgb(200,30,60)")
    figs["split"].add_bar(name="min", orientation="h", y=names, marker_color="rgb(60,90,200)")
    note = W.HTML()

    @on_move
    def refresh(*_):
        r = controls["ranks"].value
        options = _divisors(rows // r)
        if list(controls["micro"].options) != options:
            keep = controls["micro"].value if controls["micro"].value in options else options[0]
            controls["micro"].options = options
            controls["micro"].value = keep
        split = tt.Split(controls["micro"].value, r)
        n = float(mask.sum())
        moved, result = [], {}
        with figs["weights"].batch_update(), figs["split"].batch_update():
            highs, lows = [], []
            for trace, rule in zip(figs["weights"].data, the_rules):
                w = tt.token_weights(mask, rule, split, d["max_length"])
                per_row = w.sum(-1)[on_rows] / lengths[on_rows] * n
                trace.update(x=lengths[on_rows].tolist(), y=per_row.tolist())
                f = tt.split_factors(mask, rule, split, d["max_length"], here=w, whole=whole[rule.name])
                lo, hi = float(f.min()), float(f.max())
                lows.append(lo)
                highs.append(hi)
                result[rule.name] = {"split_min": lo, "split_max": hi, "vs_mean_min": float(per_row.min()),
                                     "vs_mean_max": float(per_row.max())}
                if hi - lo > 1e-9:
                    moved.append(f"{rule.name} (×{lo:.3g}–{hi:.3g})")
            figs["split"].data[0].update(x=highs)
            figs["split"].data[1].update(x=lows)
        acc = split.accumulation(rows)
        head = tr("{rows} rows, {n} loss tokens: {ranks} rank(s) × {acc} micro-batch(es) of {micro} row(s).").format(
            rows=rows, n=int(n), ranks=r, acc=acc, micro=split.micro)
        tail = (tr("Weights that move with this split: {rules}.").format(rules=", ".join(moved)) if moved
                else tr("No rule's weights move with this split."))
        note.value = f"<p>{head} {tail}</p>"
        box.result = result

    for c in controls.values():
        c.observe(refresh, names="value")
    box = _box([W.HBox(list(controls.values())), note, *figs.values()], controls, figs, data=d)
    refresh()
    return box
