"""``ratio_explorer`` (lab 03, chapter §3): log-prob difference → ratio, the ±20 clamp, and the ratio drifting
from 1 across the recorded optimizer steps. Every number comes from ``ppolab.algos.ppo_clip_terms``.
"""

from __future__ import annotations

import math
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.i18n import tr
from ppolab.algos import (
    ppo_clip_terms,
)
from ppolab.algos.policy_loss import LOG_RATIO_CLAMP, clip_bounds
from ppolab.run.reader import Run
from ppolab.widgets.common import (
    _box,
    check_index,
    _fmt,
    _hline,
    n_opt_steps,
    opt_step_label,
    _opt_step_slider,
    _vline,
    actor_config,
    as_array,
    on_move,
    real_rows,
    resolve_run,
    step_tensors,
)


def ratio_explorer(
    run: Run | str | None = None,
    step: int | None = None,
    row: int = 0,
    token: int = 0,
    opt_step: int | None = None,
) -> W.VBox:
    """Lab 03 (§3): log_prob − old_log_prob → clamp(±20) → ratio, on a recorded step and on a synthetic axis.

    Controls: ``row``, ``token``, ``opt_step``. Figures: ``row`` (ratio of every token of the row at that
    optimizer step), ``clamp`` (ratio over a synthetic log-ratio axis, showing the ±20 clamp, with the
    chosen token marked), ``drift`` (ratio spread per optimizer step: how far each mini-batch update moved).
    A row that is not in the chosen optimizer step's mini-batch shows as empty (NaN).
    """
    r = resolve_run(run)
    rec = step_tensors(r, step)
    t = rec.tensors
    n_rows, width = t["responses"].shape
    row, token = check_index("row", row, n_rows), check_index("token", token, width)
    opt_step = check_index("opt_step", opt_step, n_opt_steps(rec))
    cfg = actor_config(r)
    low, high = clip_bounds(cfg)  # ε_low / ε_high with verl's fallback to clip_ratio
    K = n_opt_steps(rec)
    mask = t["response_mask"].float() * real_rows(rec).float().unsqueeze(-1)
    old = t["old_log_probs"].float()

    # ratio of every recorded token at every optimizer step (NaN outside the mini-batch)
    if opt_step is None:  # the last optimizer step whose mini-batch holds the row
        holding = [k for k in range(K) if row in rec.opt_step(k).rows()]
        opt_step = holding[-1] if holding else K - 1
    ratios = torch.stack(
        [
            ppo_clip_terms(old, t["actor_log_probs"][k].float(), torch.zeros_like(old), low, high)["ratio"]
            for k in range(K)
        ]
    )
    controls = {
        "row": W.IntSlider(value=row, min=0, max=n_rows - 1, description=tr("row"), continuous_update=False),
        "token": W.IntSlider(value=token, min=0, max=width - 1, description=tr("token"), continuous_update=False),
        "opt_step": _opt_step_slider(rec, opt_step),
    }
    axis = torch.linspace(-1.25 * LOG_RATIO_CLAMP, 1.25 * LOG_RATIO_CLAMP, 201, dtype=torch.float64)
    synth = ppo_clip_terms(torch.zeros_like(axis), axis, torch.zeros_like(axis), low, high)
    f_clamp = go.FigureWidget(
        layout=dict(
            title=tr("ratio = exp(clamp(log_prob − old_log_prob, −20, 20))"),
            height=320,
            xaxis_title=tr("raw log-ratio log_prob − old_log_prob"),
            yaxis=dict(title=tr("ratio"), type="log"),
        )
    )
    f_clamp.add_scatter(x=axis.tolist(), y=synth["ratio"].tolist(), mode="lines", name=tr("ratio (ppolab.algos)"))
    f_clamp.add_scatter(
        x=[0.0], y=[1.0], mode="markers", marker=dict(size=12, color="red"), name=tr("chosen token")
    )
    f_clamp.layout.shapes = [_vline(-LOG_RATIO_CLAMP, dash="dot"), _vline(LOG_RATIO_CLAMP, dash="dot")]
    f_row = go.FigureWidget(
        layout=dict(
            title=tr("ratio of each token of the row"),
            height=300,
            xaxis_title=tr("response position"),
            yaxis_title=tr("ratio"),
        )
    )
    f_row.add_bar(x=list(range(width)), y=[0.0] * width, name=tr("ratio"))
    f_row.layout.shapes = [_hline(1.0)]
    f_drift = go.FigureWidget(
        layout=dict(
            title=tr("ratio drift across the optimizer steps of this training step"),
            height=340,
            yaxis_title=tr("ratio of the mini-batch's real tokens"),
            showlegend=True,
        )
    )
    labels = [opt_step_label(rec, k) for k in range(K)]
    for k in range(K):
        sel = (mask > 0) & ~torch.isnan(ratios[k])
        f_drift.add_box(y=as_array(ratios[k][sel]), name=labels[k], boxpoints=False)
    f_drift.add_scatter(
        x=labels, y=[float("nan")] * K, mode="lines+markers", name=tr("chosen token"), line=dict(color="red")
    )
    f_drift.layout.shapes = [_hline(1.0)]
    readout = W.HTML()
    state: dict[str, Any] = {"ratios": ratios}

    valid = (mask > 0).tolist()  # per row, per position: in the loss

    @on_move
    def update(*_):
        i, j, k = controls["row"].value, controls["token"].value, controls["opt_step"].value
        lp, o = t["actor_log_probs"][k, i, j].item(), old[i, j].item()
        terms = ppo_clip_terms(
            old[i : i + 1, j : j + 1],
            t["actor_log_probs"][k, i : i + 1, j : j + 1].float(),
            torch.zeros(1, 1),
            low,
            high,
        )
        ratio, clamped = terms["ratio"].item(), terms["log_ratio"].item()
        state.update(row=i, token=j, opt_step=k, ratio=ratio, log_ratio=clamped, raw_log_ratio=lp - o)
        rollout_line = ""
        if "rollout_log_probs" in t:  # §3: the PPO ratio does not correct π_rollout ≠ π_old
            ro = t["rollout_log_probs"][i : i + 1, j : j + 1].float()
            old_vs_rollout = ppo_clip_terms(ro, old[i : i + 1, j : j + 1], torch.zeros(1, 1), low, high)[
                "ratio"
            ].item()
            state["old_over_rollout"] = old_vs_rollout
            rollout_line = tr(
                "<br><span style='color:grey'>for comparison, π_old/π_rollout on this token = {r} "
                "(rollout_log_probs = {lp}); the PPO ratio does not correct this gap — only rollout_is would</span>"
            ).format(r=_fmt(old_vs_rollout), lp=_fmt(ro.item()))
        in_batch = not math.isnan(lp)
        with f_row.batch_update():
            f_row.data[0].y = as_array(ratios[k, i])
            f_row.data[0].marker.color = [
                "red" if p == j else ("steelblue" if v else "lightgrey") for p, v in enumerate(valid[i])
            ]
            f_row.layout.title.text = (tr("row {i}, {label}") if in_batch else
                                       tr("row {i}, {label} — row not in this mini-batch")).format(i=i, label=labels[k])
        with f_clamp.batch_update():
            f_clamp.data[1].x = [lp - o if in_batch else 0.0]
            f_clamp.data[1].y = [ratio if in_batch else 1.0]
        with f_drift.batch_update():
            f_drift.data[-1].y = ratios[:, i, j].tolist()
        text = t["responses"][i, j].item()
        resp = rec.texts.get("responses", [""] * n_rows)[i] if rec.texts else ""
        head = (tr("<b>row {i}</b> response {resp}, position {j} (token id {token})") if mask[i, j] > 0 else
                tr("<b>row {i}</b> response {resp}, position {j} (token id {token}) "
                   "<b>(masked position: not in the loss)</b>"))
        readout.value = (
            head.format(i=i, resp=repr(resp), j=j, token=text) + "<br>"
            + tr("old_log_prob = {old}, log_prob ({label}) = {lp}").format(old=_fmt(o), label=labels[k], lp=_fmt(lp))
            + f"<br>log_prob − old = {_fmt(lp - o)} → clamp(±{LOG_RATIO_CLAMP:g}) = {_fmt(clamped)} → "
            f"ratio = {_fmt(ratio)}"
            + ("" if in_batch else tr("<br><i>this row was not in that optimizer step's mini-batch (NaN)</i>"))
            + rollout_line
        )

    for c in controls.values():
        c.observe(update, names="value")
    update()
    return _box(
        [W.HBox(list(controls.values())), readout, f_row, f_clamp, f_drift],
        {**controls},
        {"row": f_row, "clamp": f_clamp, "drift": f_drift},
        state=state,
        record=rec,
    )


# ------------------------------------------------------------------------------------------------- 2. clip
