"""``update_effect_explorer`` (lab 18, the chapter's title question): what one optimizer step of the actor did to
every token and to every parameter tensor. A view of :func:`ppolab.numbers.update_effect.step_effect` — the
worker's own update, replayed from the recorded state before the step (step 1: the seeded adapter; a later step:
``trainer.record_update_state``) — which computes every number shown.
"""
from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.errors import whole_argument
from ppolab.i18n import tr
from ppolab.numbers.update_effect import (CLIP_STATES, clip_state_name, layer_of, n_optimizer_steps, replayable_steps,
                                          step_effect)
from ppolab.run.reader import Run
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


def _step_effects(r: Run, step: int) -> list[dict[str, Any]]:
    """Every optimizer step of recorded ``step``, from one replay (cached by the numbers layer)."""
    return [step_effect(r, step, k) for k in range(n_optimizer_steps(r, step))]


def _labels(effects: list[dict[str, Any]]) -> list[str]:
    return [tr("opt step {k} (epoch {e}, mini-batch {m})").format(k=k, e=e["epoch"], m=e["mini_batch"])
            for k, e in enumerate(effects)]


def update_effect_explorer(run: Run | str | None = None, opt_step: int = 0, term: str = "total",
                           step: int | None = None) -> W.VBox:
    """Lab 18: pick a recorded step (where the run can replay more than step 1), an optimizer step of it and a loss
    term.

    Figures: ``tokens`` (Δ log π of every token against its advantage, coloured by its clip state at that
    optimizer step; the rest of the batch in grey), ``layers`` (per layer: ‖Δθ‖, and the chosen term's share of
    the gradient norm). The readout lists the tokens that moved most, decoded with the run's tokenizer, in their
    responses. A step's optimizer steps are replayed once, when it is first shown; a move only redraws.
    ``step``: default 1 — the replayable steps are step 1 and those recorded with ``trainer.record_update_state``."""
    r = resolve_run(run)
    steps = replayable_steps(r)
    if not steps:
        from ppolab.numbers.needs import RunLacks

        raise RunLacks("a recorded step with an actor update that can be replayed (step 1, or a step recorded with "
                       "trainer.record_update_state=true)", r)
    step = steps[0] if step is None else step
    if step not in steps:
        raise ValueError(f"step={step!r} cannot be replayed on this run; replayable steps: {steps} (a later step "
                         "needs trainer.record_update_state=true)")
    shown: dict[str, Any] = {}  # the step on screen: its record, effects and labels

    def show_step(k: int) -> None:
        shown["step"], shown["effects"] = k, _step_effects(r, k)  # cached: a step shown before costs no replay
        shown["labels"], shown["rec"] = _labels(shown["effects"]), r.step(k)
        texts = (shown["rec"].texts or {}).get("responses")
        shown["texts"] = texts or [""] * shown["rec"].tensors["responses"].shape[0]

    show_step(step)
    n = len(shown["effects"])
    terms = ["total", *[t for t in ("pg", "entropy", "kl") if any(t in e["terms"] for e in shown["effects"])]]
    if term not in terms:
        raise ValueError(f"term={term!r}; this run's loss has the terms {', '.join(terms)}")
    opt_step = whole_argument("opt_step", opt_step, range(n), "an optimizer step of the shown step")
    tok = r.tokenizer()
    # labels and values whole: the description at its own width, the menu as wide as its longest option
    style, wide = {"description_width": "initial"}, W.Layout(width="auto", min_width="24em")
    controls = {
        "opt_step": W.Dropdown(options=[(label, k) for k, label in enumerate(shown["labels"])], value=opt_step,
                               description=tr("optimizer step"), style=style, layout=wide),
        "term": W.Dropdown(options=[(tr(t), t) for t in terms], value=term, description=tr("loss term"),
                           style=style, layout=W.Layout(width="auto", min_width="14em")),
    }
    if len(steps) > 1:  # a run recorded with its update states: every such step can be replayed
        controls = {"step": W.Dropdown(options=steps, value=step, description=tr("step"), style=style), **controls}
    f_tokens = go.FigureWidget(layout=dict(
        title=tr("Δ log π of each token after the optimizer step, against its advantage"), height=380,
        xaxis_title=tr("advantage A"), yaxis_title=tr("Δ log π (after − before)")))
    f_tokens.add_scatter(x=[], y=[], mode="markers", name=tr("rest of the batch (not trained here)"),
                         marker=dict(color="lightgrey", size=4))
    for name, colour in zip(CLIP_STATES, COLOURS):
        f_tokens.add_scatter(x=[], y=[], mode="markers", name=tr(name), marker=dict(color=colour, size=6))
    layer_names = list(_per_layer(shown["effects"][0]["names"], shown["effects"][0]["grads"]))
    # two quantities of different units (a step in weight space, a gradient): an axis each, the bars side by side
    f_layers = go.FigureWidget(layout=dict(
        title=tr("per layer: ‖Δθ‖ and the gradient of the chosen term"), height=340, barmode="group",
        yaxis=dict(title=tr("‖Δθ‖ (the optimizer step)")),
        yaxis2=dict(title=tr("‖gradient‖ of the chosen term"), overlaying="y", side="right", showgrid=False),
        legend=dict(orientation="h", y=-0.25)))
    f_layers.add_bar(x=layer_names, y=[0.0] * len(layer_names), name=tr("‖Δθ‖ (the optimizer step)"),
                     offsetgroup="step", yaxis="y")
    f_layers.add_bar(x=layer_names, y=[0.0] * len(layer_names), name=tr("‖gradient‖ of the chosen term"),
                     offsetgroup="gradient", yaxis="y2")
    readout, top = W.HTML(), W.HTML()
    state: dict[str, Any] = {}

    def pick_step(change) -> None:  # another step: replay it (once), then offer its optimizer steps
        show_step(change["new"])
        opt = controls["opt_step"]
        keep = min(opt.value, len(shown["labels"]) - 1)  # the same optimizer step where the new step has it
        opt.options = [(label, k) for k, label in enumerate(shown["labels"])]  # (this resets the value to 0)
        opt.value = keep

    @on_move
    def update(*_):
        k, t = controls["opt_step"].value, controls["term"].value
        effects, labels, rec, texts = shown["effects"], shown["labels"], shown["rec"], shown["texts"]
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
        state.update(step=shown["step"], opt_step=k, term=t, effect=e, counts=counts)

    if "step" in controls:
        controls["step"].observe(pick_step, names="value")  # first: the options change before the redraw
    for c in controls.values():
        c.observe(update, names="value")
    update()
    return _box([W.HBox(list(controls.values())), readout, f_tokens, f_layers, top], controls,
                {"tokens": f_tokens, "layers": f_layers}, state=state, record=shown["rec"])
