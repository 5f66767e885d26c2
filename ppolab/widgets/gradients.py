"""``gradient_gallery`` (lab 06, chapter §5.2): how hard each policy-loss mode pushes one token's log-probability,
as a function of its ratio, for A > 0 and A < 0 — and where the tokens of a recorded optimizer step sit.

The per-token gradient weight of a loss L is

    w_t = −(∂L/∂log π_θ(t)) / s_t

computed by ``torch.autograd`` through the registered function itself (``POLICY_LOSS_REGISTRY[mode]``), never by a
hand-written derivative. The minus sign makes a positive weight *raise* log π_θ(t) (gradient descent moves log π
along −∂L/∂log π). s_t is the token's share in the mode's aggregation (1/N for ``token-mean``), so the weight does
not depend on how many tokens the batch has: for ``vanilla`` inside the clip range w = A·r, the familiar
policy-gradient weight; where the clip binds, w = 0.

The curves use a grid batch of one-token sequences, one per ratio, so the sequence-level modes (gspo, geo_mean)
reduce to their token formula (a one-token sequence's ratio *is* its token's ratio). Two modes pick tokens by a batch
statistic (the covariance of advantage and log-prob), so a token's weight there is not a function of its ratio:
their curves show both branches a token can be on, each obtained by a config change that puts every grid token on
that branch (:data:`BRANCHES`); the recorded scatter shows which token the real batch picked.
"""

from __future__ import annotations

import html
import math
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ppolab.i18n import tr
from ppolab.algos import POLICY_LOSS_REGISTRY
from ppolab.algos.masked import MASKED_EPS
from ppolab.config.actor import ActorConfig
from ppolab.run.reader import Run
from ppolab.run.step import StepRecord
from ppolab.widgets.common import (
    _box,
    check_index,
    n_opt_steps,
    opt_step_label,
    _opt_step_slider,
    _vline,
    actor_config,
    as_array,
    drawn,
    drawn_note,
    on_move,
    resolve_run,
    step_batches,
    step_tensors,
)
from ppolab.numbers.gradients import (  # noqa: F401 (re-exported)
    BRANCHES,
    DEFAULT_OLD_PROB,
    DRO_BETA_SHOWN,
    token_weights,
    gradient_weights,
    mode_config,
    token_share,
)

#: Ratio grid of the curves. 400 points that never land exactly on a kink (1 ± ε, clip_ratio_c), where autograd
#: would report the mean of the two one-sided slopes.
RATIO_GRID = torch.linspace(0.4, 2.5, 400, dtype=torch.float64)
#: Modes whose loss reads π_old itself, not only the ratio.
PROB_MODES = ("dppo_tv", "dppo_kl")


#: What each curve means (shown under the figure; verl `core_algos.py` function of the same name).
NOTES = {
    "vanilla": "w = A·r inside [1−ε_low, 1+ε_high]; w = 0 once the clip binds on the side the advantage pushes "
               "(A>0: r>1+ε_high; A<0: r<1−ε_low). For A<0 the dual clip also zeroes r > clip_ratio_c.",
    "gspo": "One ratio per sequence, s_i = exp(mean_t log r_t), clipped per sequence, no dual clip. Every token of "
            "a sequence gets w = A_t·s_i or 0. The curve is a one-token sequence; the scatter is plotted at s_i.",
    "sapo": "No hard clip: w = A·r·sech²(τ(r−1)/2) (τ = tau_pos for A>0, tau_neg otherwise), a smooth gate that "
            "equals A at r = 1 and decays far from it, but never reaches 0.",
    "gpg": "w = A for every token: no ratio, no clip — the ratio does not matter at all.",
    "cispo": "w = A·clip(r, 1−ε_low, 1+ε_high): the clipped ratio is a stop-gradient weight, so the clip bounds the "
             "push but never switches it off.",
    "dppo_tv": "A token is dropped (w = 0) once its probability moved by more than δ = clip_ratio in the advantage's "
               "direction: the cut in r is 1 ± δ/π_old, so it depends on the token's own π_old (curve at the "
               "π_old slider; recorded tokens have their own). Kept tokens: w = A·min(r, clip_ratio_c).",
    "dppo_kl": "As dppo_tv with the binary KL between Bernoulli(π_old) and Bernoulli(π_θ) as the divergence; a move "
               "against the advantage's direction is never dropped. Depends on π_old, not on r alone.",
    "clip_cov": "The plain clip (no dual clip), plus k = max(1, ⌊clip_cov_ratio·N⌋) tokens drawn at random among "
                "those whose covariance (A−Ā)(log π−mean) lies in (clip_cov_lb, clip_cov_ub): their w = 0 (dotted). "
                "Which token is drawn is a property of the batch and the seed, not of r.",
    "kl_cov": "No clip: w = A·r. The top-k tokens by covariance also get −ppo_kl_coef·sign(log r) (dotted); there "
              "w/|A| depends on |A|, not on r alone.",
    "geo_mean": "The ratio of a sequence is the geometric mean of its token ratios, clipped per token in log space: "
                "a token gets w = Ā_i·ρ_i (its sequence's mean advantage × the clipped geometric-mean ratio) while its "
                "own log-ratio stays inside the clip on the pushing side, else 0 — not a function of one ratio. "
                "Scatter at the sequence's geometric-mean ratio, y divided by |Ā_i|.",
    "dro": "No clip: w = A − β·log r (β = dro_beta, 0.1 shown when the run sets none): a pull back towards r = 1 "
           "whose size relative to A depends on |A|, so recorded points with |A| ≠ 1 leave the curve.",
    "bypass_mode": "old_log_prob = the rollout log-probs, so the ratio is π_θ/π_rollout (scatter: actor vs "
                   "rollout_log_probs). loss_type=ppo_clip: the vanilla curve; loss_type=reinforce (dotted): "
                   "w = A·min(IS weight, rollout_is_threshold).",
}


# --------------------------------------------------------------------------------------------- pure functions


def mode_curves(mode: str, config: ActorConfig, old_prob: float = DEFAULT_OLD_PROB,
                grid: torch.Tensor = RATIO_GRID) -> dict[str, dict[str, torch.Tensor]]:
    """branch label → {"pos": w at A = +1, "neg": w at A = −1} over ``grid``. Modes without :data:`BRANCHES` have
    one entry, labelled ``mode``; for bypass_mode the config's own ``loss_type`` comes first."""
    names: list[str | None] = list(BRANCHES.get(mode, {None: None}))
    if mode == "bypass_mode":
        own = f"loss_type={config.policy_loss.rollout_correction.loss_type}"
        names.sort(key=lambda b: b != own)
    out = {}
    for b in names:
        out[mode if b is None else b] = {
            sign: gradient_weights(mode, grid, a, config, old_prob=old_prob, branch=b)
            for sign, a in (("pos", 1.0), ("neg", -1.0))
        }
    return out


def recorded_weights(mode: str, batch: dict[str, torch.Tensor], config: ActorConfig,
                     rollout_log_probs: torch.Tensor | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """The gradient weights of a recorded mini-batch under ``mode`` (autograd on the real (rows, T) tensors).

    ``batch`` is :func:`ppolab.widgets.common.optimizer_step_batch`'s dict; bypass_mode needs the rows'
    ``rollout_log_probs`` (its old_log_prob). Returns 1-D tensors over the valid tokens with a nonzero advantage:
    ``x`` (the ratio the mode clips on: the token's r, gspo's sequence ratio s_i, geo_mean's geometric-mean ratio,
    bypass_mode's π_θ/π_rollout), ``a`` (the advantage the mode multiplies: Ā_i for geo_mean, else A_t), ``w``,
    ``reference`` (the curve's weight at (x, a): what a one-token sequence alone would get), ``off_curve``
    (bool: |w − reference| beyond float noise — a token the batch treated differently), ``row``, ``position``.
    The whole mini-batch is one loss call here, so clip_cov / kl_cov select among all its tokens; the trainer calls
    the loss per micro-batch and rank, where each call selects its own k.
    """
    cfg = mode_config(config, mode)
    m = batch["response_mask"].double()
    lp, adv = batch["log_prob"].double(), batch["advantages"].double()
    old = batch["old_log_probs"].double()
    if mode == "bypass_mode":
        if rollout_log_probs is None:
            raise ValueError("bypass_mode needs the rollout log-probs (its old_log_prob)")
        old = rollout_log_probs.double()
    w = token_weights(mode, cfg, old, lp, adv, m, torch.Generator().manual_seed(seed))
    d = (lp - old) * m
    lengths = m.sum(dim=-1, keepdim=True)
    if mode == "gspo":
        x = torch.exp(d.sum(dim=-1, keepdim=True) / lengths.clamp(min=1)).expand_as(lp)
    elif mode == "geo_mean":
        x = torch.exp(d.sum(dim=-1, keepdim=True) / (lengths + MASKED_EPS)).expand_as(lp)
    else:
        x = torch.exp(lp - old)
    a = ((adv * m).sum(dim=-1, keepdim=True) / (lengths + MASKED_EPS)).expand_as(adv) if mode == "geo_mean" else adv
    keep = (m > 0) & (a != 0)
    p_old = torch.exp(old[keep]) if mode in PROB_MODES else torch.full_like(x[keep], 1e-3)
    default_branch = next(iter(BRANCHES[mode])) if mode in BRANCHES and mode != "bypass_mode" else None
    ref = gradient_weights(mode, x[keep], a[keep], config, old_prob=p_old, branch=default_branch, seed=seed)
    wk = w[keep]
    idx = torch.nonzero(keep)
    return {"x": x[keep], "a": a[keep], "w": wk, "reference": ref,
            "off_curve": (wk - ref).abs() > 1e-9 + 1e-6 * ref.abs(),
            "row": batch["rows"][idx[:, 0]], "position": idx[:, 1]}


# ------------------------------------------------------------------------------------------------- explorer
_COLORS = {"pos": "#1f77b4", "neg": "#d62728"}


def _all_modes_figure(curves: dict[str, dict], grid: torch.Tensor) -> go.FigureWidget:
    modes = list(curves)
    ncols = 4
    fig = go.FigureWidget(make_subplots(rows=math.ceil(len(modes) / ncols), cols=ncols, subplot_titles=modes,
                                        shared_xaxes=True, vertical_spacing=0.08, horizontal_spacing=0.05))
    x = grid.tolist()
    for i, mode in enumerate(modes):
        row, col = i // ncols + 1, i % ncols + 1
        for j, (label, ws) in enumerate(curves[mode].items()):
            for sign in ("pos", "neg"):
                fig.add_scatter(x=x, y=ws[sign].tolist(), mode="lines", row=row, col=col, showlegend=False,
                                name=(tr("{mode}: {label}, A > 0") if sign == "pos" else
                                      tr("{mode}: {label}, A < 0")).format(mode=mode, label=tr(label)),
                                line=dict(color=_COLORS[sign], width=1.5, dash=None if j == 0 else "dot"))
    fig.update_layout(height=620, margin=dict(t=70, l=40, r=10, b=40),
                      title=tr("gradient weight w = −∂L/∂log π_θ (per unit share) vs ratio r: A = +1 blue, A = −1 red, "
                            "dotted = the other branch"))
    return fig


def gradient_gallery(
    run: Run | str | None = None,
    step: int | None = None,
    opt_step: int | None = None,
    mode: str = "vanilla",
    old_prob: float = DEFAULT_OLD_PROB,
    seed: int = 0,
) -> W.VBox:
    """Lab 06 (§5.2): the per-token gradient weight of every policy-loss mode against the ratio, and the tokens of
    a recorded optimizer step (default run ``ppo_fire_tiny``, ε = 0.07, clip_ratio_c = 1.2, where the clip binds).

    Controls: ``mode`` (every POLICY_LOSS_REGISTRY name), ``opt_step``, ``old_prob`` (π_old of the curves; only
    dppo_tv / dppo_kl read it). Figures: ``all_modes`` (small multiples of the twelve curves at the run's config),
    ``mode`` (the chosen mode, A > 0 and A < 0 side by side: curve(s) for A = ±1 and the recorded tokens at
    (x, w/|a|), off-curve tokens in orange). Every weight is autograd through the registry function on the run's
    ActorConfig (dro_beta 0.1 when unset); the recorded step's ``actor_log_probs[opt_step]`` is log π_θ.
    ``state`` holds ``mode``, ``opt_step``, ``n_tokens``, ``n_zero`` (tokens with w = 0), ``n_off_curve`` and
    ``recorded`` (:func:`recorded_weights`'s dict).
    """
    r = resolve_run(run, default="ppo_fire_tiny")
    rec: StepRecord = step_tensors(r, step)
    opt_step = check_index("opt_step", opt_step, n_opt_steps(rec))
    if mode not in POLICY_LOSS_REGISTRY:
        raise ValueError(f"mode={mode!r} is not registered; choose one of {', '.join(POLICY_LOSS_REGISTRY)}")
    if not 0.02 <= old_prob <= DEFAULT_OLD_PROB:
        raise ValueError(f"old_prob={old_prob} is out of range; allowed: 0.02 … {DEFAULT_OLD_PROB} (the slider's)")
    base = actor_config(r)
    controls = {
        "mode": W.Dropdown(options=list(POLICY_LOSS_REGISTRY), value=mode, description="loss_mode"),
        "opt_step": _opt_step_slider(rec, opt_step),
        "old_prob": W.FloatSlider(value=old_prob, min=0.02, max=DEFAULT_OLD_PROB, step=0.02, description=tr("π_old"),
                                  readout_format=".2f", continuous_update=False),
    }
    grid = RATIO_GRID
    cache: dict[tuple[str, float], dict] = {}

    def curves(m: str, p: float) -> dict:
        key = (m, round(p, 6) if m in PROB_MODES else 0.0)
        if key not in cache:
            cache[key] = mode_curves(m, base, p, grid)
        return cache[key]

    f_all = _all_modes_figure({m: curves(m, old_prob) for m in POLICY_LOSS_REGISTRY}, grid)
    f_mode = go.FigureWidget(make_subplots(rows=1, cols=2, subplot_titles=("A > 0", "A < 0"), shared_yaxes=False))
    f_mode.update_layout(height=420, margin=dict(t=80), legend=dict(orientation="h", y=-0.18))
    f_mode.update_xaxes(title_text=tr("ratio"))
    f_mode.update_yaxes(title_text=tr("w / |A|  (A = ±1 curves)"), col=1)
    hover = tr("row %{customdata[0]}, position %{customdata[1]}, A = %{customdata[2]:+.3g}, "
               "w = %{customdata[3]:.4g}") + "<extra></extra>"
    grid_x = as_array(grid)
    # fixed trace slots: per side 2 curves (default branch, other branch), on-curve tokens, off-curve tokens
    for col, sign in ((1, "pos"), (2, "neg")):
        for dash in (None, "dot"):
            f_mode.add_scatter(x=[], y=[], mode="lines", row=1, col=col, line=dict(color=_COLORS[sign], dash=dash))
        f_mode.add_scatter(x=[], y=[], mode="markers", row=1, col=col, name=tr("recorded tokens"),
                           marker=dict(color="black", size=5, opacity=0.6), showlegend=col == 1, hovertemplate=hover)
        f_mode.add_scatter(x=[], y=[], mode="markers", row=1, col=col, name=tr("off the curve (batch-coupled)"),
                           marker=dict(color="orange", size=9, symbol="diamond"), showlegend=col == 1,
                           hovertemplate=hover)
    note = W.HTML()
    state: dict[str, Any] = {}
    rollout = rec.tensors.get("rollout_log_probs")
    batch = step_batches(rec)
    recorded: dict[tuple[str, int], dict] = {}  # (mode, opt step) → weights and what the figure draws of them

    def recorded_view(m: str, k: int) -> dict:
        """The recorded weights of mode ``m`` at optimizer step ``k`` (every token) and the traces that draw them
        (at most MAX_DRAWN_POINTS a trace, evenly spaced): the curve's π_old slider does not change them."""
        if (m, k) not in recorded:
            b = batch(k)
            rw = recorded_weights(m, b, base, None if rollout is None else rollout[b["rows"]].double(), seed)
            y = rw["w"] / rw["a"].abs()
            traces, notes = [], []
            # hover text from numbers (customdata + a template): no string per point to build or to send
            custom = torch.stack([rw["row"].double(), rw["position"].double(), rw["a"], rw["w"]], dim=-1)
            for sign in ("pos", "neg"):
                sel = rw["a"] > 0 if sign == "pos" else rw["a"] < 0
                for part in (sel & ~rw["off_curve"], sel & rw["off_curve"]):
                    shown = drawn(part)
                    traces.append((as_array(rw["x"][shown]), as_array(y[shown]), as_array(custom[shown])))
                    notes.append(drawn_note(part, shown))
            recorded[(m, k)] = {"rw": rw, "traces": traces, "note": "".join(dict.fromkeys(n for n in notes if n))}
        return recorded[(m, k)]

    @on_move
    def update_all(*_):
        p = controls["old_prob"].value
        with f_all.batch_update():
            i = 0
            for m in POLICY_LOSS_REGISTRY:
                for ws in curves(m, p).values():
                    for sign in ("pos", "neg"):
                        if m in PROB_MODES:
                            f_all.data[i].y = ws[sign].tolist()
                        i += 1

    @on_move
    def update(*_):
        m, k, p = controls["mode"].value, controls["opt_step"].value, controls["old_prob"].value
        cs = curves(m, p)
        view = recorded_view(m, k)
        rw = view["rw"]
        labels = list(cs)
        with f_mode.batch_update():
            for side, sign in enumerate(("pos", "neg")):
                t0 = 4 * side
                for j in range(2):
                    trace = f_mode.data[t0 + j]
                    if j < len(labels):
                        trace.x, trace.y = grid_x, as_array(cs[labels[j]][sign])
                        trace.name = tr("{label} (A = ±1)").format(label=tr(labels[j]))
                    else:
                        trace.x, trace.y, trace.name = [], [], ""
                    trace.showlegend = side == 0 and j < len(labels)
                for j in (2, 3):
                    trace = f_mode.data[t0 + j]
                    trace.x, trace.y, trace.customdata = view["traces"][2 * side + j - 2]
            f_mode.layout.shapes = [
                {**_vline(1 - e), "xref": f"x{'' if c == 1 else c}"} for c in (1, 2) for e in (eps_lo, -eps_hi)
            ]
            f_mode.layout.title.text = tr("loss_mode={m}: gradient weight vs ratio — {label}, {n} tokens with "
                                          "A ≠ 0").format(m=m, label=opt_step_label(rec, k),
                                                          n=int(rw["w"].numel())) + view["note"]
        n_zero = int((rw["w"] == 0).sum())
        state.update(mode=m, opt_step=k, old_prob=p, n_tokens=int(rw["w"].numel()), n_zero=n_zero,
                     n_off_curve=int(rw["off_curve"].sum()), recorded=rw, curves=cs)
        recorded_line = (tr("Recorded: {n} tokens, {zero} with w = 0, {off} off the curve. Config: ε_low = {lo:g}, "
                            "ε_high = {hi:g}, clip_ratio_c = {c:g}, π_old = {p:g}") if m in PROB_MODES else
                         tr("Recorded: {n} tokens, {zero} with w = 0, {off} off the curve. Config: ε_low = {lo:g}, "
                            "ε_high = {hi:g}, clip_ratio_c = {c:g}"))
        # the note is text, not markup: its "A<0: r<1−ε_low" must not open a tag
        note.value = (tr("<b>{m}</b> (verl <code>core_algos.py::compute_policy_loss_{m}</code>): {note}").format(
            m=m, note=html.escape(tr(NOTES[m]), quote=False)) + "<br>" + recorded_line.format(
            n=state["n_tokens"], zero=n_zero, off=state["n_off_curve"], lo=eps_lo, hi=eps_hi, c=base.clip_ratio_c, p=p))

    from ppolab.algos.policy_loss import clip_bounds

    eps_lo, eps_hi = clip_bounds(base)
    controls["mode"].observe(update, names="value")
    controls["opt_step"].observe(update, names="value")
    controls["old_prob"].observe(update_all, names="value")
    controls["old_prob"].observe(update, names="value")
    update()
    return _box([W.HBox(list(controls.values())), note, f_mode, f_all], controls,
                {"mode": f_mode, "all_modes": f_all}, state=state, record=rec)
