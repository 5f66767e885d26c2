"""Lab 08 (§7): the reference-KL estimators and the two KL paths, computed by ``ppolab.algos``.

* estimators: value and gradient of :func:`ppolab.algos.kl_penalty` over a synthetic log-ratio axis
  (d = logprob − ref_logprob), for every name in ``KL_PENALTY_TYPES`` (the '+' straight-through variants
  share the value of their base estimator and the gradient of k2);
* the recorded pairs: loss-side (``actor_log_probs[k]`` vs ``ref_log_prob``, what ``use_kl_loss`` adds to
  the loss) and reward-side (``old_log_probs`` vs ``ref_log_prob``, what ``use_kl_in_reward`` subtracts from
  the reward);
* the :class:`AdaptiveKLController` replayed on the run's KL series from ``run.metrics``.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.algos import KL_PENALTY_TYPES, AdaptiveKLController, agg_loss, kl_penalty, masked_mean
from ppolab.record import Run
from ppolab.widgets.common import real_rows, resolve_run, step_tensors
from ppolab.widgets.common import (
    _box,
    _check_index,
    _hline,
    _n_opt_steps,
    _opt_step_label,
    _opt_step_slider,
    optimizer_step_batch,
)

__all__ = ["kl_explorer", "estimator_curves", "replay_adaptive_kl", "KL_SERIES"]

#: The run metrics a KL controller can be replayed on (reward-side first: that is what verl feeds it; the
#: loss-side ``actor/kl_loss`` is a what-if). ``actor/ppo_kl`` is not a reference KL (§7.5), so it is not
#: offered.
KL_SERIES = ("actor/reward_kl_penalty", "actor/kl_loss")
#: The canonical estimators drawn together (aliases kl=k1, mse=k2, low_var_kl=k3 give the same curves).
CANONICAL = ("k1", "abs", "k2", "k3")


def estimator_curves(d: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, ∂value/∂logprob) of ``kl_penalty(logprob=d, ref_logprob=0, name)`` at every point of ``d``."""
    lp = d.detach().clone().double().requires_grad_(True)
    value = kl_penalty(lp, torch.zeros_like(lp), name)
    value.sum().backward()
    return value.detach(), lp.grad.detach()


def replay_adaptive_kl(
    kl_series: list[float], init_kl_coef: float, target_kl: float, horizon: float, n_steps: int
) -> list[float]:
    """β used at each step when an :class:`AdaptiveKLController` sees ``kl_series`` (β read before update)."""
    ctrl = AdaptiveKLController(init_kl_coef=init_kl_coef, target_kl=target_kl, horizon=horizon)
    betas = []
    for kl in kl_series:
        betas.append(ctrl.value)
        ctrl.update(current_kl=kl, n_steps=n_steps)
    return betas


def kl_explorer(
    run: Run | str | None = None,
    step: int | None = None,
    opt_step: int | None = None,
    kl_type: str | None = None,
    series: str | None = None,
) -> W.VBox:
    """The KL estimators, the two KL paths on a recorded step, and the adaptive controller on the run's KL.

    Controls: ``kl_type`` (every KL_PENALTY_TYPES name), ``d_range`` (half-width of the log-ratio axis),
    ``opt_step``, ``series`` (a KL metric of the run), ``init_kl_coef``, ``target_kl``, ``horizon``.
    Figures: ``values`` and ``grads`` (the canonical estimators, the chosen one bold), ``pairs`` (the chosen
    estimator per token on the loss-side and the reward-side pairs), ``controller`` (β replayed on the
    series).
    ``state`` holds ``loss_side`` (agg_loss token-mean of the loss-side estimate), ``reward_side`` (batch mean
    of per-sequence means, as apply_kl_penalty), ``betas``.
    """
    r = resolve_run(run)
    rec = step_tensors(r, step)
    opt_step = _check_index("opt_step", opt_step, _n_opt_steps(rec))
    actor = r.config.get("actor_rollout_ref", {}).get("actor", {})
    algo = r.config.get("algorithm", {})
    if kl_type is None:
        kl_type = (
            actor.get("kl_loss_type", "low_var_kl")
            if actor.get("use_kl_loss")
            else algo.get("kl_penalty", "kl")
        )
    if kl_type not in KL_PENALTY_TYPES:
        raise ValueError(f"kl_type={kl_type!r} is not valid; choose one of {', '.join(KL_PENALTY_TYPES)}")
    metrics = r.metrics
    available = [s for s in KL_SERIES if s in metrics.columns and metrics[s].notna().any()]
    if not available:
        raise ValueError(f"{r.path} logs none of the KL metrics {', '.join(KL_SERIES)}")
    series = available[0] if series is None else series
    if series not in available:
        raise ValueError(f"series={series!r} is not logged by this run; choose one of {', '.join(available)}")
    kl_ctrl = algo.get("kl_ctrl", {})
    n_seq = int(rec.info.get("batch_plan", {}).get("n_trajectories", rec.tensors["responses"].shape[0]))

    controls = {
        "kl_type": W.Dropdown(options=list(KL_PENALTY_TYPES), value=kl_type, description="estimator"),
        "d_range": W.FloatSlider(
            value=3.0, min=0.5, max=25.0, step=0.5, description="|d| range", continuous_update=False
        ),
        "opt_step": _opt_step_slider(rec, opt_step),
        "series": W.Dropdown(options=available, value=series, description="KL series"),
        "init_kl_coef": W.FloatLogSlider(
            value=float(kl_ctrl.get("kl_coef", 0.001)),
            base=10,
            min=-4,
            max=0,
            step=0.1,
            description="init β",
            continuous_update=False,
        ),
        "target_kl": W.FloatLogSlider(
            value=float(kl_ctrl.get("target_kl", 0.1)),
            base=10,
            min=-4,
            max=0,
            step=0.1,
            description="target_kl",
            continuous_update=False,
        ),
        "horizon": W.FloatLogSlider(
            value=float(kl_ctrl.get("horizon", 10000)),
            base=10,
            min=1,
            max=5,
            step=0.1,
            description="horizon",
            continuous_update=False,
        ),
    }
    f_val = go.FigureWidget(
        layout=dict(
            title="estimator value, d = logprob − ref_logprob",
            height=320,
            xaxis_title="d",
            yaxis_title="kl_penalty value",
        )
    )
    f_grad = go.FigureWidget(
        layout=dict(
            title="gradient ∂/∂logprob (autograd)", height=320, xaxis_title="d", yaxis_title="gradient"
        )
    )
    for name in CANONICAL:
        f_val.add_scatter(x=[], y=[], mode="lines", name=name)
        f_grad.add_scatter(x=[], y=[], mode="lines", name=name)
    f_val.add_scatter(x=[], y=[], mode="lines", name="chosen", line=dict(width=5, color="black", dash="dot"))
    f_grad.add_scatter(x=[], y=[], mode="lines", name="chosen", line=dict(width=5, color="black", dash="dot"))
    f_pairs = go.FigureWidget(
        layout=dict(height=340, barmode="overlay", xaxis_title="per-token estimate", yaxis_title="tokens")
    )
    f_pairs.add_histogram(x=[], name="loss-side: actor vs ref", opacity=0.6, nbinsx=60)
    f_pairs.add_histogram(x=[], name="reward-side: old vs ref", opacity=0.6, nbinsx=60)
    steps = [int(s) for s in metrics.index]
    f_ctrl = go.FigureWidget(
        layout=dict(
            height=340,
            xaxis_title="training step",
            yaxis=dict(title="β (adaptive replay)"),
            yaxis2=dict(title="KL series", overlaying="y", side="right"),
        )
    )
    f_ctrl.add_scatter(x=steps, y=[], mode="lines", name="β")
    f_ctrl.add_scatter(x=steps, y=[], mode="lines", name="KL series", yaxis="y2", line=dict(dash="dot"))
    readout = W.HTML()
    state: dict[str, Any] = {}

    def update_curves(*_):
        name, half = controls["kl_type"].value, controls["d_range"].value
        d = torch.linspace(-half, half, 241, dtype=torch.float64)
        xs = d.tolist()
        with f_val.batch_update(), f_grad.batch_update():
            for i, n in enumerate(CANONICAL):
                v, g = estimator_curves(d, n)
                f_val.data[i].x, f_val.data[i].y = xs, v.tolist()
                f_grad.data[i].x, f_grad.data[i].y = xs, g.tolist()
            v, g = estimator_curves(d, name)
            f_val.data[-1].x, f_val.data[-1].y, f_val.data[-1].name = xs, v.tolist(), name
            f_grad.data[-1].x, f_grad.data[-1].y, f_grad.data[-1].name = xs, g.tolist(), name
        state.update(d=d, value=v, grad=g)

    def update_pairs(*_):
        name, k = controls["kl_type"].value, controls["opt_step"].value
        b = optimizer_step_batch(rec, k)
        m = b["response_mask"]
        loss_kl = kl_penalty(b["log_prob"], b["ref_log_prob"], name)
        t = rec.tensors
        full_mask = t["response_mask"].float() * real_rows(rec).float().unsqueeze(-1)
        reward_kl = kl_penalty(t["old_log_probs"].float(), t["ref_log_prob"].float(), name) * full_mask
        loss_side = float(agg_loss(loss_kl, m, "token-mean"))
        reward_side = float(torch.mean(masked_mean(reward_kl, full_mask, axis=-1)))
        state.update(
            loss_side=loss_side,
            reward_side=reward_side,
            loss_tokens=loss_kl[m > 0],
            reward_tokens=reward_kl[full_mask > 0],
        )
        with f_pairs.batch_update():
            f_pairs.data[0].x = loss_kl[m > 0].tolist()
            f_pairs.data[1].x = reward_kl[full_mask > 0].tolist()
            f_pairs.layout.title.text = (
                f"{name} on the recorded pairs, step {rec.step}, {_opt_step_label(rec, k)}"
            )
        readout.value = (
            f"<b>loss-side</b> (use_kl_loss: kl_penalty(log_prob, ref_log_prob) at "
            f"{_opt_step_label(rec, k)}, "
            f"token-mean over its mini-batch) = <b>{loss_side:.6g}</b><br>"
            f"<b>reward-side</b> (use_kl_in_reward: kl_penalty(old_log_probs, ref_log_prob), batch mean of "
            f"per-sequence means, as apply_kl_penalty) = <b>{reward_side:.6g}</b><br>"
            f"this run: use_kl_loss={actor.get('use_kl_loss')} ({actor.get('kl_loss_type')}), "
            f"use_kl_in_reward={algo.get('use_kl_in_reward')} ({algo.get('kl_penalty')})"
        )

    def update_ctrl(*_):
        s = metrics[controls["series"].value].astype(float).fillna(0.0).tolist()
        betas = replay_adaptive_kl(
            s, controls["init_kl_coef"].value, controls["target_kl"].value, controls["horizon"].value, n_seq
        )
        state.update(betas=betas, series=s, n_steps=n_seq)
        with f_ctrl.batch_update():
            f_ctrl.data[0].y = betas
            f_ctrl.data[1].y = s
            f_ctrl.layout.shapes = [dict(_hline(controls["target_kl"].value, "red", "dash"), yref="y2")]
            f_ctrl.layout.title.text = (
                f"AdaptiveKLController replayed on {controls['series'].value} "
                f"(n_steps = {n_seq} sequences per update; red: target_kl)"
            )

    controls["kl_type"].observe(update_curves, names="value")
    controls["d_range"].observe(update_curves, names="value")
    controls["kl_type"].observe(update_pairs, names="value")
    controls["opt_step"].observe(update_pairs, names="value")
    for key in ("series", "init_kl_coef", "target_kl", "horizon"):
        controls[key].observe(update_ctrl, names="value")
    update_curves()
    update_pairs()
    update_ctrl()
    items = list(controls.values())
    return _box(
        [W.HBox(items[:3]), f_val, f_grad, readout, f_pairs, W.HBox(items[3:5]), W.HBox(items[5:]), f_ctrl],
        controls,
        {"values": f_val, "grads": f_grad, "pairs": f_pairs, "controller": f_ctrl},
        state=state,
        record=rec,
    )
