"""``value_clip_explorer``: the critic's clipped value loss on a recorded PPO+GAE step (chapter §8).

Every number comes from ``ppolab.algos``: the per-token bars from ``value_clip_terms`` (the pieces of the loss
before aggregation), the totals from ``compute_value_loss`` on the whole mini-batch.
"""
from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.i18n import tr
from ppolab.algos import compute_value_loss, value_clip_terms
from ppolab.widgets.common import resolve_run, step_tensors, on_move


def _record(run, step, default):
    r = resolve_run(run, default)
    if step is not None and step not in r.steps:
        raise ValueError(f"step must be one of the recorded steps {r.steps}, got {step!r}")
    return r, step_tensors(r, step, default)


def per_token_value_losses(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
                           cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(½·(V_new − G)², ½·max(unclipped, clipped)) per token: ``ppolab.algos.value_clip_terms`` with the ½ that
    ``compute_value_loss`` applies after aggregation, so the bars add up to its token-sum."""
    _, unclipped, _, used = value_clip_terms(vpreds, returns, values, cliprange_value)
    return 0.5 * unclipped, 0.5 * used


def value_clip_explorer(run=None, step=None, update: int | None = None, cliprange_value: float | None = None,
                        loss_agg_mode: str | None = None) -> W.VBox:
    """Slide ε_v (``critic.cliprange_value``) over the critic's recorded predictions of one optimizer step.

    ``run`` defaults to the shipped ``ppo_gae_tiny``; ``update`` picks the critic optimizer step whose vpreds
    (``critic_vpreds[update]``, default the last) are used, with V_old = ``values`` and G = ``returns`` of the same
    rows — that optimizer step's global mini-batch, padding rows included. vf_loss is normalised as the engine does:
    token-mean by Σ ``loss_mask`` of the mini-batch, the seq-mean modes by its row count; vf_clipfrac is the share
    pooled over the mini-batch's valid tokens (the trainer logs the mean of the per-micro-batch shares instead).
    Figures: ``tokens`` (½·unclipped vs the ½·max actually used, per token), ``summary`` (vf_loss and
    vf_clipfrac from compute_value_loss), ``sweep`` (both against ε_v, the current ε_v marked).
    """
    r, rec = _record(run, step, "ppo_gae_tiny")
    t = rec.tensors
    missing = [k for k in ("values", "critic_vpreds", "returns") if k not in t]
    if missing:
        raise ValueError(f"run must have a critic (recorded {missing} missing); use run='ppo_gae_tiny' or a run with "
                         "algorithm.adv_estimator=gae")
    n_updates = t["critic_vpreds"].shape[0]
    update = n_updates - 1 if update is None else update
    if not isinstance(update, int) or not 0 <= update < n_updates:
        raise ValueError(f"update must be an int in 0..{n_updates - 1} (critic optimizer steps), got {update!r}")
    critic_cfg = r.ppo_config().critic
    mode = loss_agg_mode or critic_cfg.loss_agg_mode
    from ppolab.algos import LOSS_AGG_MODES
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {list(LOSS_AGG_MODES)}, got {mode!r}")
    eps0 = critic_cfg.cliprange_value if cliprange_value is None else cliprange_value
    if not isinstance(eps0, (int, float)) or not 0 <= eps0 <= 2:
        raise ValueError(f"cliprange_value must be a number in [0, 2], got {eps0!r}")

    controls = {
        "cliprange_value": W.FloatSlider(value=float(eps0), min=0.0, max=2.0, step=0.01, description="ε_v",
                                         continuous_update=False, readout_format=".2f"),
        "update": W.IntSlider(value=update, min=0, max=n_updates - 1, description=tr("update"),
                              continuous_update=False),
    }
    figs = {
        "tokens": go.FigureWidget(layout={"title": tr("per-token value loss"), "barmode": "overlay", "height": 320,
                                              "xaxis_title": tr("token (row:position)"), "yaxis_title": tr("loss")}),
        "summary": go.FigureWidget(layout={"title": tr("compute_value_loss on the mini-batch"), "height": 280}),
        "sweep": go.FigureWidget(layout={"title": tr("vf_loss and vf_clipfrac against ε_v"), "height": 280,
                                             "xaxis_title": "cliprange_value"}),
    }
    figs["tokens"].add_bar(name=tr("½(V_new − G)²  (unclipped)"), opacity=0.6)
    figs["tokens"].add_bar(name=tr("½·max(unclipped, clipped)  (used)"), opacity=0.6)
    figs["summary"].add_bar(x=["vf_loss", "vf_clipfrac"])
    figs["sweep"].add_scatter(name="vf_loss", mode="lines")
    figs["sweep"].add_scatter(name="vf_clipfrac", mode="lines")
    figs["sweep"].add_scatter(name=tr("current ε_v"), mode="markers", marker={"size": 10})

    def batch_of(u):
        # the critic optimizer step's own rows and tensors (V_old where the recording holds NaN: no NaN can leak)
        b = rec.opt_step(u, "critic").batch()
        return b["vpreds"], b["returns"], b["values"], b["response_mask"], b["rows"]

    grid = [round(0.05 * i, 2) for i in range(41)]

    @on_move
    def refresh(*_):
        u, eps = controls["update"].value, controls["cliprange_value"].value
        vp, g, v, m, row_ids = batch_of(u)
        keep = m.bool()
        unclipped, clipped = per_token_value_losses(vp[keep], g[keep], v[keep], eps)
        labels = [f"{int(row_ids[i])}:{j}" for i, j in keep.nonzero().tolist()]
        # the global counts the critic's update divided by (its plan): batch_num_tokens = Σ loss_mask of the global
        # mini-batch — rejected tokens included (§9) — and global_batch_size = its rows
        info = rec.opt_step(u, "critic").step.info()
        counts = {"batch_num_tokens": info.batch_num_tokens, "global_batch_size": info.global_batch_size}
        vf_loss, vf_clipfrac = compute_value_loss(vp, g, v, m, eps, mode, **counts)
        sweep = [compute_value_loss(vp, g, v, m, e, mode, **counts) for e in grid]
        with figs["tokens"].batch_update():
            figs["tokens"].data[0].update(x=labels, y=unclipped.tolist())
            figs["tokens"].data[1].update(x=labels, y=clipped.tolist())
        with figs["summary"].batch_update():
            figs["summary"].data[0].update(y=[float(vf_loss), float(vf_clipfrac)],
                                           text=[f"{float(vf_loss):.4f}", f"{float(vf_clipfrac):.3f}"])
            figs["summary"].layout.title = tr("compute_value_loss, ε_v = {eps:.2f}, {mode}, update {u}: vf_loss "
                                              "{loss:.4f}, vf_clipfrac {frac:.3f}").format(
                eps=eps, mode=mode, u=u, loss=float(vf_loss), frac=float(vf_clipfrac))
        with figs["sweep"].batch_update():
            figs["sweep"].data[0].update(x=grid, y=[float(a) for a, _ in sweep])
            figs["sweep"].data[1].update(x=grid, y=[float(b) for _, b in sweep])
            figs["sweep"].data[2].update(x=[eps], y=[float(vf_loss)])
        box.result = {"vf_loss": float(vf_loss), "vf_clipfrac": float(vf_clipfrac), "unclipped": unclipped,
                      "clipped": clipped}

    box = W.VBox([W.HBox(list(controls.values())), *figs.values()])
    box.controls, box.figures, box.record = controls, figs, rec
    box.batch = batch_of
    for c in controls.values():
        c.observe(refresh, names="value")
    refresh()
    return box
