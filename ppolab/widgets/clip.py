"""``clip_explorer`` and ``dual_clip_explorer`` (labs 04–05, chapter §4): the clipped surrogate, its six cases,
ε_low/ε_high and clip_ratio_c, on the recorded batch. Numbers come from ``ppolab.algos``
(``ppo_clip_terms``, ``compute_policy_loss_vanilla``); a recorded step's ``actor_log_probs[k]`` against
``old_log_probs`` is exactly the ratio the trainer's loss saw at optimizer step ``k``.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.i18n import tr
from ppolab.algos import (
    compute_policy_loss_vanilla,
    ppo_clip_terms,
)
from ppolab.algos.policy_loss import clip_bounds
from ppolab.config.actor import ActorConfig
from ppolab.run.reader import Run
from ppolab.widgets.common import (
    _box,
    drawn,
    drawn_note,
    check_index,
    _hline,
    n_opt_steps,
    opt_step_label,
    _opt_step_slider,
    _vline,
    _vrect,
    actor_config,
    as_array,
    optimizer_step_batch,
    real_rows,
    resolve_run,
    step_tensors,
    on_move,
)

_RATIO_AXIS = torch.linspace(0.0, 2.5, 501, dtype=torch.float64)


def _surrogate(
    axis: torch.Tensor, adv: float, low: float, high: float, c: float = 3.0
) -> dict[str, torch.Tensor]:
    """ppo_clip_terms over a ratio axis (log_prob = log r, old = 0) for a constant advantage."""
    lp = torch.log(axis.clamp(min=1e-12))
    return ppo_clip_terms(torch.zeros_like(axis), lp, torch.full_like(axis, adv), low, high, c)


def _grad_of_loss(fn, batch: dict[str, torch.Tensor], cfg: ActorConfig) -> tuple[torch.Tensor, dict]:
    """∂ pg_loss / ∂ log_prob per token (autograd through the ppolab.algos loss) and its metrics."""
    lp = batch["log_prob"].clone().double().requires_grad_(True)
    loss, metrics = fn(
        batch["old_log_probs"].double(),
        lp,
        batch["advantages"].double(),
        batch["response_mask"].double(),
        cfg.loss_agg_mode,
        cfg,
    )
    loss.backward()
    return lp.grad.detach(), metrics


def _clip_on_batch(rec, k, cfg):
    b = optimizer_step_batch(rec, k)
    low, high = clip_bounds(cfg)
    terms = ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], low, high, cfg.clip_ratio_c)
    grad, metrics = _grad_of_loss(compute_policy_loss_vanilla, b, cfg)
    return b, terms, grad, metrics


def _clipped_table(b: dict, terms: dict, clipped: torch.Tensor, limit: int = 12) -> str:
    """An HTML table of (up to ``limit``) clipped tokens: row, position, ratio, advantage."""
    idx = torch.nonzero(clipped).tolist()
    if not idx:
        return tr("<br><i>no token is clipped at these settings</i>")
    rows = "".join(
        f"<tr><td>{int(b['rows'][i])}</td><td>{j}</td><td>{terms['ratio'][i, j].item():.4f}</td>"
        f"<td>{b['advantages'][i, j].item():+.4f}</td></tr>"
        for i, j in idx[:limit]
    )
    more = tr("<br><i>… and {n} more</i>").format(n=len(idx) - limit) if len(idx) > limit else ""
    head = "".join(f"<th>{tr(h)}</th>" for h in ("row", "position", "ratio", "advantage"))
    return f"<br><table><tr>{head}</tr>{rows}</table>{more}"


def _eps_sliders(eps_low: float, eps_high: float) -> dict[str, W.FloatSlider]:
    """The ε_low / ε_high sliders (clip_ratio_low / clip_ratio_high) both clip explorers share."""
    return {name: W.FloatSlider(value=value, min=0.01, max=0.9, step=0.01, description=label, continuous_update=False)
            for name, label, value in (("eps_low", "ε_low", eps_low), ("eps_high", "ε_high", eps_high))}


def clip_explorer(
    run: Run | str | None = None,
    step: int | None = None,
    opt_step: int | None = None,
    eps_low: float | None = None,
    eps_high: float | None = None,
) -> W.VBox:
    """Lab 04 (§4.1–4.3): the clipped surrogate for A > 0 and A < 0, and the clipped tokens of a recorded
    batch (default run: ``ppo_fire_tiny``, trained at ε = 0.07, where the clip binds on a few % of the tokens).

    Controls: ``eps_low``, ``eps_high`` (clip_ratio_low / clip_ratio_high), ``opt_step``.
    Figures: ``surrogate`` (objective −loss over the ratio for A = +1 and A = −1, the six cases shaded),
    ``batch`` (every real token of the optimizer step's mini-batch: ratio vs advantage, clipped in red).
    ``state`` holds the displayed numbers: ``pg_clipfrac`` (compute_policy_loss_vanilla's metric),
    ``n_clipped``, ``n_tokens``, ``n_zero_grad`` (tokens whose ∂loss/∂log_prob is 0, by autograd), ``n_dual_clipped``
    (tokens the run's dual clip bounds: A < 0 and ratio > clip_ratio_c, lab 05).
    """
    r = resolve_run(run, default="ppo_fire_tiny")
    rec = step_tensors(r, step)
    opt_step = check_index("opt_step", opt_step, n_opt_steps(rec))
    base = actor_config(r)
    eps_low = clip_bounds(base)[0] if eps_low is None else eps_low
    eps_high = clip_bounds(base)[1] if eps_high is None else eps_high
    for name, v in (("eps_low", eps_low), ("eps_high", eps_high)):
        if not 0.01 <= v <= 0.9:
            raise ValueError(f"{name}={v} is out of range; allowed: 0.01 … 0.9 (the slider's range)")
    controls = {**_eps_sliders(eps_low, eps_high), "opt_step": _opt_step_slider(rec, opt_step)}
    f_sur = go.FigureWidget(
        layout=dict(
            title=tr("PPO objective min(r·A, clip(r)·A) = −pg_losses_clip"),
            height=380,
            xaxis_title=tr("ratio r"),
            yaxis_title=tr("objective (maximised)"),
        )
    )
    x = _RATIO_AXIS.tolist()
    for name, dash in (
        ("A = +1: clipped objective", None),
        ("A = +1: unclipped r·A", "dot"),
        ("A = −1: clipped objective", None),
        ("A = −1: unclipped r·A", "dot"),
    ):
        f_sur.add_scatter(x=x, y=[0.0] * len(x), mode="lines", name=tr(name), line=dict(dash=dash))
    f_batch = go.FigureWidget(
        layout=dict(
            height=380, xaxis_title=tr("ratio (actor_log_probs[k] vs old_log_probs)"), yaxis_title=tr("advantage")
        )
    )
    f_batch.add_scatter(
        x=[], y=[], mode="markers", name=tr("not clipped"), marker=dict(color="steelblue", size=5)
    )
    f_batch.add_scatter(
        x=[], y=[], mode="markers", name=tr("clipped (zero gradient)"), marker=dict(color="red", size=7)
    )
    readout = W.HTML()
    state: dict[str, Any] = {}

    @on_move
    def update(*_):
        low, high, k = controls["eps_low"].value, controls["eps_high"].value, controls["opt_step"].value
        cfg = actor_config(r, clip_ratio_low=low, clip_ratio_high=high)
        pos, neg = _surrogate(_RATIO_AXIS, 1.0, low, high), _surrogate(_RATIO_AXIS, -1.0, low, high)
        lo, hi = 1 - low, 1 + high
        with f_sur.batch_update():
            f_sur.data[0].y = as_array(-pos["pg_losses_clip"])
            f_sur.data[1].y = as_array(-pos["pg_losses1"])
            f_sur.data[2].y = as_array(-neg["pg_losses_clip"])
            f_sur.data[3].y = as_array(-neg["pg_losses1"])
            f_sur.layout.shapes = [
                _vrect(0.0, lo),
                _vrect(hi, float(_RATIO_AXIS[-1])),
                _vline(lo),
                _vline(hi),
            ]
            right = float(_RATIO_AXIS[-1])
            cases = [
                (lo / 2, 0.99, "① A>0, r<1−ε_low:<br>unclipped, gradient"),
                ((lo + hi) / 2, 0.99, "② A>0, inside:<br>unclipped"),
                ((hi + right) / 2, 0.99, "③ A>0, r>1+ε_high:<br>clipped, zero gradient"),
                (lo / 2, 0.01, "④ A<0, r<1−ε_low:<br>clipped, zero gradient"),
                ((lo + hi) / 2, 0.01, "⑤ A<0, inside:<br>unclipped"),
                ((hi + right) / 2, 0.01, "⑥ A<0, r>1+ε_high:<br>unclipped, gradient<br>up to c (dual clip, lab 05)"),
            ]
            f_sur.layout.annotations = [
                dict(
                    x=cx,
                    y=cy,
                    xref="x",
                    yref="paper",
                    text=tr(txt),
                    showarrow=False,
                    yanchor="top" if cy > 0.5 else "bottom",
                    font=dict(size=10),
                )
                for cx, cy, txt in cases
            ]
        b, terms, grad, metrics = _clip_on_batch(rec, k, cfg)
        m = b["response_mask"] > 0
        clipped = (terms["clipped"] > 0) & m
        zero_grad = (grad == 0) & m
        zero_adv = (b["advantages"] == 0) & m
        dual = (terms["dual_clipped"] > 0) & m
        state.update(
            eps_low=low,
            eps_high=high,
            opt_step=k,
            pg_clipfrac=metrics["actor/pg_clipfrac"],
            ppo_kl=metrics["actor/ppo_kl"],
            pg_clipfrac_lower=metrics["actor/pg_clipfrac_lower"],
            n_tokens=int(m.sum()),
            n_clipped=int(clipped.sum()),
            n_zero_grad=int(zero_grad.sum()),
            n_zero_adv=int(zero_adv.sum()),
            n_zero_grad_clipped=int((zero_grad & ~zero_adv).sum()),
            n_dual_clipped=int(dual.sum()),
            n_padding_rows=int((~real_rows(rec)[b["rows"]]).sum()),
            clipped=clipped,
            zero_grad=zero_grad,
            rows=b["rows"],
        )
        ratio, adv = terms["ratio"], b["advantages"]
        label = opt_step_label(rec, k)
        point = tr("row {row}, position {pos}, ∂loss/∂log_prob = {g:.3g}")

        def hover(sel):
            idx = torch.nonzero(sel)  # row-major, the order of ratio[sel]
            rows, pos, g = b["rows"][idx[:, 0]].tolist(), idx[:, 1].tolist(), grad[sel].tolist()
            return [point.format(row=i, pos=j, g=x) for i, j, x in zip(rows, pos, g)]

        free, bound = drawn(m & ~clipped), drawn(clipped)  # a bounded sample of points; the numbers use all
        with f_batch.batch_update():  # numpy buffers: plotly validates a list of floats one by one
            f_batch.data[0].x, f_batch.data[0].y = as_array(ratio[free]), as_array(adv[free])
            f_batch.data[0].hovertext = hover(free)
            f_batch.data[1].x, f_batch.data[1].y = as_array(ratio[bound]), as_array(adv[bound])
            f_batch.data[1].hovertext = hover(bound)
            f_batch.layout.shapes = [_vline(lo), _vline(hi)]
            f_batch.layout.title.text = tr("{label}: pg_clipfrac = {f:.4f} ({n}/{m} tokens)").format(
                label=label, f=state["pg_clipfrac"], n=state["n_clipped"], m=state["n_tokens"]
            ) + drawn_note(m, free | bound)
        # one whole template per line (and per variant of a line), so the Chinese has its own word order
        head = (tr("<b>{label}</b>, {rows} rows ({pad} of them synthetic padding rows, no tokens), "
                   "{tokens} real tokens") if state["n_padding_rows"] else
                tr("<b>{label}</b>, {rows} rows, {tokens} real tokens"))
        zero = (tr("tokens with zero gradient ∂loss/∂log_prob: {zero} — {adv} because A = 0 (in GRPO: a group whose "
                   "rewards were all equal), {clip} because the clip took the ratio out of the loss ({dual} of them by "
                   "the dual clip: A &lt; 0 and ratio &gt; clip_ratio_c = {c:g}, lab 05)") if state["n_dual_clipped"]
                else tr("tokens with zero gradient ∂loss/∂log_prob: {zero} — {adv} because A = 0 (in GRPO: a group "
                        "whose rewards were all equal), {clip} because the clip took the ratio out of the loss"))
        readout.value = "<br>".join([
            head.format(label=label, rows=len(b["rows"]), pad=state["n_padding_rows"], tokens=state["n_tokens"]),
            tr("actor/pg_clipfrac = <b>{f:.6f}</b> (compute_policy_loss_vanilla), actor/ppo_kl = {kl:.3g}").format(
                f=state["pg_clipfrac"], kl=state["ppo_kl"]),
            zero.format(zero=state["n_zero_grad"], adv=state["n_zero_adv"], clip=state["n_zero_grad_clipped"],
                        dual=state["n_dual_clipped"], c=cfg.clip_ratio_c),
        ]) + _clipped_table(b, terms, clipped)

    for c in controls.values():
        c.observe(update, names="value")
    update()
    return _box(
        [W.HBox(list(controls.values())), readout, f_sur, f_batch],
        controls,
        {"surrogate": f_sur, "batch": f_batch},
        state=state,
        record=rec,
    )


# -------------------------------------------------------------------------------------------- 3. dual clip
def dual_clip_explorer(
    run: Run | str | None = None,
    step: int | None = None,
    opt_step: int | None = None,
    clip_ratio_c: float | None = None,
    stretch: float = 1.0,
) -> W.VBox:
    """Lab 05 (§4.4): the dual clip bounds the loss of negative-advantage tokens at −A·c (c =
    clip_ratio_c > 1).

    Controls: ``clip_ratio_c`` (1.05 … 10; verl asserts c > 1), ``eps_low``, ``eps_high``, ``opt_step`` and
    ``stretch`` s. At s = 1 (the default) the batch is the recorded update itself: on the default run
    ``ppo_fire_tiny`` (clip_ratio_c = 1.2) the dual clip binds on real optimizer steps. s > 1 is a what-if
    (synthetic): it replays the recorded update s times as far (log_prob = old + s·(actor − old)), for the large
    ratios of a run like verl's default c = 3. Figures: ``loss_curve`` (A = −1: ordinary clipped loss vs dual
    clipped loss over the ratio), ``batch`` (negative-advantage tokens: ratio vs per-token loss).
    ``state['pg_clipfrac_lower']`` is compute_policy_loss_vanilla's metric.
    """
    r = resolve_run(run, default="ppo_fire_tiny")
    rec = step_tensors(r, step)
    opt_step = check_index("opt_step", opt_step, n_opt_steps(rec))
    base = actor_config(r)
    c0 = base.clip_ratio_c if clip_ratio_c is None else clip_ratio_c
    if not c0 > 1.0:
        raise ValueError(
            f"clip_ratio_c={c0} is out of range; verl requires clip_ratio_c > 1.0 (slider: 1.05 … 10)"
        )
    if not 1.0 <= stretch <= 50.0:
        raise ValueError(f"stretch={stretch} is out of range; allowed: 1 … 50")
    controls = {
        "clip_ratio_c": W.FloatSlider(
            value=min(max(c0, 1.05), 10.0),
            min=1.05,
            max=10.0,
            step=0.05,
            description="clip_ratio_c",
            continuous_update=False,
        ),
        **_eps_sliders(*clip_bounds(base)),
        "opt_step": _opt_step_slider(rec, opt_step),
        "stretch": W.FloatSlider(
            value=stretch, min=1.0, max=50.0, step=0.5, description=tr("stretch"), continuous_update=False
        ),
    }
    axis = torch.linspace(0.0, 12.0, 481, dtype=torch.float64)
    f_curve = go.FigureWidget(
        layout=dict(
            title=tr("A = −1: loss = min(pg_losses_clip, −A·c)"),
            height=360,
            xaxis_title=tr("ratio r"),
            yaxis_title=tr("per-token loss (minimised)"),
        )
    )
    f_curve.add_scatter(
        x=axis.tolist(),
        y=[0.0] * len(axis),
        mode="lines",
        name=tr("ordinary clip (unbounded)"),
        line=dict(dash="dot"),
    )
    f_curve.add_scatter(x=axis.tolist(), y=[0.0] * len(axis), mode="lines", name=tr("dual clip (verl)"))
    f_batch = go.FigureWidget(
        layout=dict(
            height=360, xaxis=dict(title=tr("ratio"), type="log"), yaxis_title=tr("per-token loss (A < 0 tokens)")
        )
    )
    f_batch.add_scatter(
        x=[], y=[], mode="markers", name=tr("not dual-clipped"), marker=dict(color="steelblue", size=5)
    )
    f_batch.add_scatter(
        x=[], y=[], mode="markers", name=tr("dual-clipped (loss = −A·c)"), marker=dict(color="red", size=7)
    )
    readout = W.HTML()
    state: dict[str, Any] = {}

    @on_move
    def update(*_):
        c, low, high = controls["clip_ratio_c"].value, controls["eps_low"].value, controls["eps_high"].value
        k, s = controls["opt_step"].value, controls["stretch"].value
        cfg = actor_config(r, clip_ratio_c=c, clip_ratio_low=low, clip_ratio_high=high)
        curve = _surrogate(axis, -1.0, low, high, c)
        with f_curve.batch_update():
            f_curve.data[0].y = curve["pg_losses_clip"].tolist()
            f_curve.data[1].y = curve["pg_losses"].tolist()
            f_curve.layout.shapes = [_hline(c, "red", "dash"), _vline(c, "grey", "dot")]
        b = optimizer_step_batch(rec, k)
        b["log_prob"] = b["old_log_probs"] + s * (b["log_prob"] - b["old_log_probs"])
        terms = ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], low, high, c)
        _, metrics = compute_policy_loss_vanilla(
            b["old_log_probs"], b["log_prob"], b["advantages"], b["response_mask"], cfg.loss_agg_mode, cfg
        )
        m = b["response_mask"] > 0
        neg = m & (b["advantages"] < 0)
        dual = (terms["dual_clipped"] > 0) & m
        state.update(
            clip_ratio_c=c,
            stretch=s,
            opt_step=k,
            pg_clipfrac_lower=metrics["actor/pg_clipfrac_lower"],
            pg_clipfrac=metrics["actor/pg_clipfrac"],
            n_tokens=int(m.sum()),
            n_negative=int(neg.sum()),
            n_dual_clipped=int(dual.sum()),
            max_negative_loss=float(terms["pg_losses"][neg].max()) if neg.any() else float("nan"),
        )
        with f_batch.batch_update():
            keep, shown_dual = drawn(neg & ~dual), drawn(dual)  # a bounded sample of points; the numbers use all
            f_batch.data[0].x, f_batch.data[0].y = (
                terms["ratio"][keep].tolist(),
                terms["pg_losses"][keep].tolist(),
            )
            f_batch.data[1].x, f_batch.data[1].y = (
                terms["ratio"][shown_dual].tolist(),
                terms["pg_losses"][shown_dual].tolist(),
            )
            title = (tr("{label}, recorded update: pg_clipfrac_lower = {f:.4f}") if s == 1 else
                     tr("{label}, stretch {s:g} (what-if, synthetic): pg_clipfrac_lower = {f:.4f}"))
            f_batch.layout.title.text = title.format(
                label=opt_step_label(rec, k), s=s, f=state["pg_clipfrac_lower"]) + drawn_note(neg, keep | shown_dual)
        head = (tr("<b>recorded update</b> (stretch 1): {neg} of {tokens} real tokens have A &lt; 0; the dual clip "
                   "bites on {dual} (ratio &gt; c = {c:g}).") if s == 1 else
                tr("<b>what-if (synthetic)</b>: the recorded update replayed {s:g}× as far; {neg} of {tokens} real "
                   "tokens have A &lt; 0; the dual clip bites on {dual} (ratio &gt; c = {c:g})."))
        readout.value = "<br>".join([
            head.format(s=s, neg=state["n_negative"], tokens=state["n_tokens"], dual=state["n_dual_clipped"], c=c),
            tr("actor/pg_clipfrac_lower = <b>{lower:.6f}</b>, actor/pg_clipfrac = {f:.6f} "
               "(compute_policy_loss_vanilla)").format(lower=state["pg_clipfrac_lower"], f=state["pg_clipfrac"]),
        ])

    for ctl in controls.values():
        ctl.observe(update, names="value")
    update()
    return _box(
        [W.HBox(list(controls.values())[:3]), W.HBox(list(controls.values())[3:]), readout, f_curve, f_batch],
        controls,
        {"loss_curve": f_curve, "batch": f_batch},
        state=state,
        record=rec,
    )


# ------------------------------------------------------------------------------------------ 4. loss assembly
