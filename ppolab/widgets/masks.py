"""``mask_viewer``: which token is prompt, response, padding, a synthetic padding row, a tool observation or a token
dropped by rejection sampling, and the one-token shift between logit positions and the response tokens they predict
(chapter §9, §1)."""
from __future__ import annotations


import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.i18n import tr
from ppolab.widgets.common import real_rows, resolve_run, step_tensors, on_move
from ppolab.numbers.masks import CATEGORIES, run_tokenizer, shift_table, token_categories  # noqa: F401

_COLORS = ["#e0e0e0", "#7fa7d9", "#f2a65a", "#b58ad8", "#6cc08b", "#d9534f"]


def mask_viewer(run=None, step=None, rows: list[int] | None = None, tokenizer=None) -> W.VBox:
    """Decoded tokens of ``rows`` coloured by category, and the shift table of one of them.

    ``rows`` default: the first four rows plus the first synthetic padding row, if the step has one.
    Controls: ``rows`` (SelectMultiple), ``row`` (the row of the shift table). Figures: ``tokens`` (heatmap of
    :func:`token_categories`, hover = decoded token), ``shift`` (table from :func:`shift_table`).
    """
    r = resolve_run(run)
    if step is not None and step not in r.steps:
        raise ValueError(f"step must be one of the recorded steps {r.steps}, got {step!r}")
    rec = step_tensors(r, step)
    t = rec.tensors
    n, P = t["prompts"].shape
    R = t["responses"].shape[1]
    if rows is None:
        rows = list(range(min(4, n)))
        pads = (~real_rows(rec)).nonzero().flatten().tolist()
        rows += pads[:1]
    rows = list(rows)
    bad = [x for x in rows if not isinstance(x, int) or not 0 <= x < n]
    if bad or not rows:
        raise ValueError(f"rows must be a non-empty list of ints in 0..{n - 1}, got {rows!r}")
    tok = tokenizer or run_tokenizer(r)
    cats = token_categories(rec)
    seqs = torch.cat([t["prompts"], t["responses"]], dim=1)
    decoded: dict[int, list[str]] = {}

    def words(i):
        if i not in decoded:
            decoded[i] = [tok.decode([int(x)]) for x in seqs[i]]
        return decoded[i]

    controls = {
        "rows": W.SelectMultiple(options=list(range(n)), value=tuple(rows), description=tr("rows"), rows=6),
        "row": W.Dropdown(options=list(range(n)), value=rows[0], description=tr("shift of row")),
    }
    figs = {
        "tokens": go.FigureWidget(layout={"title": tr("prompt | response (left-padded prompt, right-padded response)"),
                                              "height": 120 + 40 * len(rows), "xaxis_title": tr("position"),
                                              "yaxis": {"autorange": "reversed", "type": "category"}}),
        "shift": go.FigureWidget(layout={"title": tr("one-token shift: logits at position P−1+j predict response "
                                                        "token j"),
                                             "height": 60 + 28 * (R + 1)}),
    }
    n_cat = len(CATEGORIES)
    scale = [[k / n_cat, c] for i, c in enumerate(_COLORS) for k in (i, i + 1)]
    figs["tokens"].add_heatmap(colorscale=scale, zmin=-0.5, zmax=n_cat - 0.5, showscale=True, xgap=1, ygap=1,
                               colorbar={"tickvals": list(CATEGORIES),
                                         "ticktext": [tr(c) for c in CATEGORIES.values()]},
                               texttemplate="%{text}",
                               hovertemplate=tr("row %{y}, position %{x}: %{text}<extra></extra>"))
    figs["tokens"].add_vline(x=P - 0.5, line_dash="dash")
    figs["shift"].add_table()

    @on_move
    def refresh(*_):
        sel = list(controls["rows"].value) or [controls["row"].value]
        with figs["tokens"].batch_update():
            figs["tokens"].data[0].update(z=cats[sel].tolist(), text=[words(i) for i in sel],
                                          y=[(tr("row {i} (pad)") if cats[i, 0] == 3 else tr("row {i}")).format(i=i)
                                             for i in sel],
                                          x=list(range(P + R)))
            figs["tokens"].layout.height = 120 + 40 * len(sel)
        table = shift_table(rec, tok, controls["row"].value)
        with figs["shift"].batch_update():
            figs["shift"].data[0].update(header={"values": list(table)}, cells={"values": list(table.values())})

    for c in controls.values():
        c.observe(refresh, names="value")
    box = W.VBox([W.HBox(list(controls.values())), *figs.values()])
    box.controls, box.figures, box.record, box.tokenizer = controls, figs, rec, tok
    refresh()
    return box
