"""``update_effect_explorer`` (lab 18, the chapter's title question): what one optimizer step of the actor did to
every token and to every parameter tensor. A view of :func:`ppolab.numbers.update_effect.step_effect` — the
worker's own update, replayed on recorded step 1 — which computes every number shown.
"""
from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.i18n import tr
from ppolab.numbers.update_effect import CLIP_STATES, clip_state_name, layer_of, n_optimizer_steps, step_effect
from ppolab.record import Run
from ppolab.widgets.common import _box, _fmt, as_array, on_move, resolve_run

#: Colour of each clip state (inside, clipped above, clipped below, dual-clipped).
COLOURS = ("steelblue", "darkorange", "purple", "red")
TOP = 10


def _layer_label(name: str) -> str:
    layer = layer_of(name)
    return tr("layer {i}").format(i=layer.split()[1]) if layer.startswith("layer ") else layer


def _per_layer(names: list[str], tensors: list[torch.Tensor]) -> dict[str, float]:
    """‖·‖ per layer (its label in the notebook's language): the root of the summed squares of its tensors."""
    out: dict[str, float] = {}
    for name, x in zip(names, tensors):
        out[_layer_label(name)] = out.get(_layer_label(name), 0.0) + float(x.double().pow(2).sum())
    return {k: v ** 0.5 for k, v in out.items()}


def update_effect_explorer(run: Run | str | None = None, opt_step: int = 0, term: str = "total") -> W.VBox:
    """Lab 18: pick an optimizer step of recorded step 1 and a loss term.

    Figures: ``tokens`` (Δ log π of every token against its advantage, coloured by its clip state at that
    optimizer step; the rest of the batch in grey), ``layers`` (per layer: ‖Δθ‖, and the chosen term's share of
    the gradient norm). The readout lists the tokens that moved most, decoded with the run's tokenizer, in their
    responses. Every optimizer step is replayed once, at construction; a move only redraws."""
    r = resolve_run(run)
    n = n_optimizer_steps(r, 1)
    step_effect(r, 1, n - 1)  # one replay measures every optimizer step on its way
    effects = [step_effect(r, 1, k) for k in range(n)]
    terms = ["total", *[t for t in ("pg", "entropy", "kl") if any(t in e["terms"] for e in effects)]]
    if term not in terms:
        raise ValueError(f"term={term!r}; this run's loss has the terms {', '.join(terms)}")
    if not 0 <= opt_step < n:
        raise ValueError(f"opt_step={opt_step!r} is out of range; allowed: 0 … {n - 1}")
    rec = r.step(1)
    tok = r.tokenizer()
    texts = (rec.texts or {}).get("responses", [""] * rec.tensors["responses"].shape[0])
    labels = [tr("opt step {k} (epoch {e}, mini-batch {m})").format(k=k, e=e["epoch"], m=e["mini_batch"])
              for k, e in enumerate(effects)]
    controls = {
        "opt_step": W.Dropdown(options=[(label, k) for k, label in enumerate(labels)], value=opt_step,
                               description=tr("optimizer step")),
        "term": W.Dropdown(options=[(tr(t), t) for t in terms], value=term, description=tr("loss term")),
    }
    f_tokens = go.FigureWidget(layout=dict(
        title=tr("Δ log π of each token after the optimizer step, against its advantage"), height=380,
        xaxis_title=tr("advantage A"), yaxis_title=tr("Δ log π (after − before)")))
    f_tokens.add_scatter(x=[], y=[], mode="markers", name=tr("rest of the batch (not trained here)"),
                         marker=dict(color="lightgrey", size=4))
    for name, colour in zip(CLIP_STATES, COLOURS):
        f_tokens.add_scatter(x=[], y=[], mode="markers", name=tr(name), marker=dict(color=colour, size=6))
    layer_names = list(_per_layer(effects[0]["names"], effects[0]["grads"]))
    f_layers = go.FigureWidget(layout=dict(title=tr("per layer: ‖Δθ‖ and the gradient of the chosen term"),
                                           height=340, barmode="group", yaxis_title=tr("norm")))
    f_layers.add_bar(x=layer_names, y=[0.0] * len(layer_names), name=tr("‖Δθ‖ (the optimizer step)"))
    f_layers.add_bar(x=layer_names, y=[0.0] * len(layer_names), name=tr("‖gradient‖ of the chosen term"))
    readout, top = W.HTML(), W.HTML()
    state: dict[str, Any] = {}

    @on_move
    def update(*_):
        k, t = controls["opt_step"].value, controls["term"].value
        e = effects[k]
        mask, rows = e["mask"] > 0, e["in_mini_batch"].unsqueeze(-1).expand_as(e["mask"])
        delta, adv, clip = e["delta"], e["advantages"], e["clip_state"]
        with f_tokens.batch_update():
            rest = mask & ~rows
            f_tokens.data[0].x, f_tokens.data[0].y = as_array(adv[rest]), as_array(delta[rest])
            for c in range(len(CLIP_STATES)):
                sel = mask & rows & (clip == c)
                f_tokens.data[c + 1].x, f_tokens.data[c + 1].y = as_array(adv[sel]), as_array(delta[sel])
        grads = e["grads"] if t == "total" else e["terms"].get(t, [torch.zeros_like(g) for g in e["grads"]])
        with f_layers.batch_update():
            f_layers.data[0].y = list(_per_layer(e["names"], e["update"]).values())
            f_layers.data[1].y = list(_per_layer(e["names"], grads).values())
        counts = {c: int((mask & rows & (clip == c)).sum()) for c in range(len(CLIP_STATES))}
        share = {name: float(torch.cat([g.flatten() for g in v]).norm()) for name, v in e["terms"].items()}
        readout.value = (
            tr("<b>{label}</b>: loss {loss}, ‖gradient‖ before the clip {gn}, lr {lr}").format(
                label=labels[k], loss=_fmt(e["loss"]), gn=_fmt(e["grad_norm"]), lr=_fmt(e["lr"]))
            + "<br>" + tr("tokens of the mini-batch: ") + ", ".join(
                f"{tr(CLIP_STATES[c])} {counts[c]}" for c in counts)
            + "<br>" + tr("‖gradient‖ of each term alone: ") + ", ".join(
                f"{tr(name)} {_fmt(v)}" for name, v in share.items())
        )
        moved = torch.where(mask, delta.abs(), torch.zeros_like(delta)).flatten()
        order = torch.argsort(moved, descending=True)[:TOP]
        width = delta.shape[1]
        lines = []
        for flat in order.tolist():
            i, j = divmod(flat, width)
            if not mask[i, j]:
                break
            piece = html.escape(tok.decode([int(rec.tensors["responses"][i, j])]))
            lines.append(f"<tr><td>{i}</td><td>{j}</td><td><b>{piece}</b></td><td>{html.escape(texts[i])}</td>"
                         f"<td>{_fmt(float(delta[i, j]))}</td><td>{_fmt(float(adv[i, j]))}</td>"
                         f"<td>{tr(clip_state_name(int(clip[i, j])))}</td></tr>")
        top.value = (f"<b>{tr('the tokens this optimizer step moved most')}</b><table><tr><th>{tr('row')}</th>"
                     f"<th>{tr('position')}</th><th>{tr('token')}</th><th>{tr('response')}</th><th>Δ log π</th>"
                     f"<th>A</th><th>{tr('clip state')}</th></tr>" + "".join(lines) + "</table>")
        state.update(opt_step=k, term=t, effect=e, counts=counts)

    for c in controls.values():
        c.observe(update, names="value")
    update()
    return _box([W.HBox(list(controls.values())), readout, f_tokens, f_layers, top], controls,
                {"tokens": f_tokens, "layers": f_layers}, state=state, record=rec)
