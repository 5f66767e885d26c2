"""Lab 08 (§7): the reference-KL estimators and the two KL paths, computed by ``ppolab.algos``.

* estimators: value and gradient of :func:`ppolab.algos.kl_penalty` over a synthetic log-ratio axis
  (d = logprob − ref_logprob), for every name in ``KL_PENALTY_TYPES`` (the '+' straight-through variants
  share the value of their base estimator and the gradient of k2);
* the recorded pairs: loss-side (``actor_log_probs[k]`` vs ``ref_log_prob``, what ``use_kl_loss`` adds to
  the loss) and reward-side (``old_log_probs`` vs ``ref_log_prob``, what ``use_kl_in_reward`` subtracts from
  the reward);
* the :class:`AdaptiveKLController` replayed on the run's KL series from ``run.metrics``;
* chapter §7.3 on full distributions (the vocabulary of the shipped model is tiny): the exact
  KL(π_θ‖π_ref) at every response position of a recorded step, and each estimator's exact mean, per-token
  variance and expected gradient for tokens sampled from π_θ or from π_ref (:func:`estimator_table`,
  :func:`gradient_table`, :func:`exact_kl_explorer`).
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.i18n import tr
from ppolab.algos import KL_PENALTY_TYPES, agg_loss, kl_penalty, masked_mean
from ppolab.run.reader import Run
from ppolab.widgets.common import resolve_run, step_tensors
from ppolab.widgets.common import (
    _box,
    check_index,
    _hline,
    n_opt_steps,
    opt_step_label,
    _opt_step_slider,
    as_array,
    on_move,
    step_batches,
)
from ppolab.numbers.steps import global_batch_info
from ppolab.numbers.kl import (  # noqa: F401 (re-exported)
    CANONICAL,
    ESTIMATORS_AND_ST,
    mask_before_rejection,
    moments_table,
    adaptive_kl_trace,
    estimator_moments,
    estimator_table,
    exact_kl,
    expected_estimator_gradient,
    full_log_probs,
    gradient_table,
    kl_gradient,
    replay_adaptive_kl,
    response_logits,
)

__all__ = ["kl_explorer", "estimator_curves", "replay_adaptive_kl", "adaptive_kl_trace", "KL_SERIES",
           "response_logits", "full_log_probs", "exact_kl", "estimator_moments", "expected_estimator_gradient",
           "kl_gradient", "estimator_table", "gradient_table", "exact_kl_explorer"]

#: The run metrics a KL controller can be replayed on (reward-side first: that is what verl feeds it; the
#: loss-side ``actor/kl_loss`` is a what-if). ``actor/ppo_kl`` is not a reference KL (§7.5), so it is not
#: offered.
KL_SERIES = ("actor/reward_kl_penalty", "actor/kl_loss")


def estimator_curves(d: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, ∂value/∂logprob) of ``kl_penalty(logprob=d, ref_logprob=0, name)`` at every point of ``d``."""
    lp = d.detach().clone().double().requires_grad_(True)
    value = kl_penalty(lp, torch.zeros_like(lp), name)
    value.sum().backward()
    return value.detach(), lp.grad.detach()


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
    series — only the training steps that logged it, as :func:`adaptive_kl_trace`; at the run's own settings the
    replay on ``actor/reward_kl_penalty`` is the logged β — and the logged ``actor/reward_kl_penalty_coeff``).
    ``state`` holds ``loss_side`` (agg_loss token-mean of the loss-side estimate), ``reward_side`` (batch mean
    of per-sequence means, as apply_kl_penalty), ``betas``, ``series``, ``steps``, ``n_steps``.
    """
    r = resolve_run(run)
    rec = step_tensors(r, step)
    opt_step = check_index("opt_step", opt_step, n_opt_steps(rec))
    cfg = r.ppo_config()
    actor, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    if kl_type is None:
        kl_type = actor.kl_loss_type if actor.use_kl_loss else algo.kl_penalty
    if kl_type not in KL_PENALTY_TYPES:
        raise ValueError(f"kl_type={kl_type!r} is not valid; choose one of {', '.join(KL_PENALTY_TYPES)}")
    metrics = r.metrics
    available = [s for s in KL_SERIES if s in metrics.columns and metrics[s].notna().any()]
    if not available:
        raise ValueError(f"{r.path} logs none of the KL metrics {', '.join(KL_SERIES)}")
    series = available[0] if series is None else series
    if series not in available:
        raise ValueError(f"series={series!r} is not logged by this run; choose one of {', '.join(available)}")
    kl_ctrl = algo.kl_ctrl
    # apply_kl_penalty passes n_steps = the rows of the batch it sees: the balanced batch, padding rows included
    n_seq = int(rec.tensors["responses"].shape[0])

    controls = {
        "kl_type": W.Dropdown(options=list(KL_PENALTY_TYPES), value=kl_type, description=tr("estimator")),
        "d_range": W.FloatSlider(
            value=3.0, min=0.5, max=25.0, step=0.5, description=tr("|d| range"), continuous_update=False
        ),
        "opt_step": _opt_step_slider(rec, opt_step),
        "series": W.Dropdown(options=available, value=series, description=tr("KL series")),
        "init_kl_coef": W.FloatLogSlider(
            value=float(kl_ctrl.kl_coef),
            base=10,
            min=-4,
            max=0,
            step=0.1,
            description=tr("init β"),
            continuous_update=False,
        ),
        "target_kl": W.FloatLogSlider(
            value=float(kl_ctrl.target_kl),
            base=10,
            min=-4,
            max=0,
            step=0.1,
            description="target_kl",
            continuous_update=False,
        ),
        "horizon": W.FloatLogSlider(
            value=float(kl_ctrl.horizon),
            base=10,
            min=1,
            max=5,
            step=0.1,
            description=tr("horizon"),
            continuous_update=False,
        ),
    }
    f_val = go.FigureWidget(
        layout=dict(
            title=tr("estimator value, d = logprob − ref_logprob"),
            height=320,
            xaxis_title="d",
            yaxis_title=tr("kl_penalty value"),
        )
    )
    f_grad = go.FigureWidget(
        layout=dict(
            title=tr("gradient ∂/∂logprob (autograd)"), height=320, xaxis_title="d", yaxis_title=tr("gradient")
        )
    )
    for name in CANONICAL:
        f_val.add_scatter(x=[], y=[], mode="lines", name=name)
        f_grad.add_scatter(x=[], y=[], mode="lines", name=name)
    f_val.add_scatter(x=[], y=[], mode="lines", name=tr("chosen"), line=dict(width=5, color="black", dash="dot"))
    f_grad.add_scatter(x=[], y=[], mode="lines", name=tr("chosen"), line=dict(width=5, color="black", dash="dot"))
    f_pairs = go.FigureWidget(
        layout=dict(height=340, barmode="overlay", xaxis_title=tr("per-token estimate"), yaxis_title=tr("tokens"))
    )
    f_pairs.add_histogram(x=[], name=tr("loss-side: actor vs ref"), opacity=0.6, nbinsx=60)
    f_pairs.add_histogram(x=[], name=tr("reward-side: old vs ref"), opacity=0.6, nbinsx=60)
    f_ctrl = go.FigureWidget(
        layout=dict(
            height=340,
            xaxis_title=tr("training step"),
            yaxis=dict(title=tr("β (adaptive replay)")),
            yaxis2=dict(title=tr("KL series"), overlaying="y", side="right"),
        )
    )
    f_ctrl.add_scatter(x=[], y=[], mode="lines", name=tr("β replayed"))
    f_ctrl.add_scatter(x=[], y=[], mode="lines", name=tr("KL series"), yaxis="y2", line=dict(dash="dot"))
    # the β the run's reward-side penalty used, as logged (only a run with use_kl_in_reward logs it)
    beta_col = metrics.get("actor/reward_kl_penalty_coeff")
    beta_logged = {} if beta_col is None else beta_col.dropna().to_dict()
    f_ctrl.add_scatter(x=[int(s) for s in beta_logged], y=[float(b) for b in beta_logged.values()],
                       mode="markers", name=tr("β logged (reward_kl_penalty_coeff)"), marker=dict(size=5))
    readout = W.HTML()
    state: dict[str, Any] = {}

    batch = step_batches(rec)
    curve_cache: dict[tuple[str, float], tuple[torch.Tensor, torch.Tensor]] = {}
    pair_cache: dict[tuple, Any] = {}

    def curve(n: str, half: float) -> tuple[torch.Tensor, torch.Tensor]:
        if (n, half) not in curve_cache:
            curve_cache[(n, half)] = estimator_curves(torch.linspace(-half, half, 241, dtype=torch.float64), n)
        return curve_cache[(n, half)]

    @on_move
    def update_curves(*_):
        name, half = controls["kl_type"].value, controls["d_range"].value
        d = torch.linspace(-half, half, 241, dtype=torch.float64)
        xs = as_array(d)
        with f_val.batch_update(), f_grad.batch_update():
            for i, n in enumerate(CANONICAL):
                v, g = curve(n, half)
                f_val.data[i].x, f_val.data[i].y = xs, as_array(v)
                f_grad.data[i].x, f_grad.data[i].y = xs, as_array(g)
            v, g = curve(name, half)
            f_val.data[-1].x, f_val.data[-1].y, f_val.data[-1].name = xs, as_array(v), name
            f_grad.data[-1].x, f_grad.data[-1].y, f_grad.data[-1].name = xs, as_array(g), name
        state.update(d=d, value=v, grad=g)

    def reward_side_of(name: str) -> tuple[float, torch.Tensor]:
        """The reward-side statistic and per-token estimates: every row of the step, whatever the optimizer step."""
        if ("reward", name) not in pair_cache:
            t = rec.tensors
            # the reward-side statistic uses the response_mask that apply_kl_penalty saw, before rejection
            # sampling rewrote it — which is the recorded loss_mask (§7.1)
            full_mask = mask_before_rejection(rec)
            reward_kl = kl_penalty(t["old_log_probs"].float(), t["ref_log_prob"].float(), name) * full_mask
            pair_cache[("reward", name)] = (float(torch.mean(masked_mean(reward_kl, full_mask, axis=-1))),
                                            reward_kl[full_mask > 0])
        return pair_cache[("reward", name)]

    def loss_side_of(name: str, k: int) -> tuple[float, torch.Tensor]:
        if ("loss", name, k) not in pair_cache:
            b = batch(k)
            m = b["response_mask"]
            loss_kl = kl_penalty(b["log_prob"], b["ref_log_prob"], name)
            # normalised by the engine's batch_num_tokens = Σ loss_mask of the global mini-batch (rejected tokens
            # included, chapter §9), as the worker counts it
            num_tokens = global_batch_info(r, rec, k).batch_num_tokens
            pair_cache[("loss", name, k)] = (float(agg_loss(loss_kl, m, "token-mean", batch_num_tokens=num_tokens)),
                                             loss_kl[m > 0])
        return pair_cache[("loss", name, k)]

    @on_move
    def update_pairs(*_):
        name, k = controls["kl_type"].value, controls["opt_step"].value
        loss_side, loss_tokens = loss_side_of(name, k)
        reward_side, reward_tokens = reward_side_of(name)
        state.update(
            loss_side=loss_side,
            reward_side=reward_side,
            loss_tokens=loss_tokens,
            reward_tokens=reward_tokens,
        )
        with f_pairs.batch_update():  # a histogram of every token: numpy arrays go as one binary buffer each
            f_pairs.data[0].x = as_array(loss_tokens)
            f_pairs.data[1].x = as_array(reward_tokens)
            f_pairs.layout.title.text = tr("{name} on the recorded pairs, step {step}, {label}").format(
                name=name, step=rec.step, label=opt_step_label(rec, k))
        readout.value = "<br>".join([
            tr("<b>loss-side</b> (use_kl_loss: kl_penalty(log_prob, ref_log_prob) at {label}, token-mean over its "
               "global mini-batch, ÷ Σ loss_mask) = <b>{kl:.6g}</b>").format(label=opt_step_label(rec, k),
                                                                             kl=loss_side),
            tr("<b>reward-side</b> (use_kl_in_reward: kl_penalty(old_log_probs, ref_log_prob), batch mean of "
               "per-sequence means, as apply_kl_penalty) = <b>{kl:.6g}</b>").format(kl=reward_side),
            tr("this run: use_kl_loss={loss} ({loss_type}), use_kl_in_reward={reward} ({reward_type})").format(
                loss=actor.use_kl_loss, loss_type=actor.kl_loss_type, reward=algo.use_kl_in_reward,
                reward_type=algo.kl_penalty),
        ])

    @on_move
    def update_ctrl(*_):
        # the training steps that logged the series: the validation-only step 0 is no update and feeds no KL
        logged = metrics[controls["series"].value].dropna().astype(float)
        s, steps = logged.tolist(), [int(i) for i in logged.index]
        betas = replay_adaptive_kl(
            s, controls["init_kl_coef"].value, controls["target_kl"].value, controls["horizon"].value, n_seq
        )
        state.update(betas=betas, series=s, steps=steps, n_steps=n_seq)
        with f_ctrl.batch_update():
            f_ctrl.data[0].x, f_ctrl.data[0].y = steps, betas
            f_ctrl.data[1].x, f_ctrl.data[1].y = steps, s
            f_ctrl.layout.shapes = [dict(_hline(controls["target_kl"].value, "red", "dash"), yref="y2")]
            f_ctrl.layout.title.text = tr("AdaptiveKLController replayed on {series} (n_steps = {n} sequences per "
                                          "update; red: target_kl)").format(series=controls["series"].value, n=n_seq)

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


# --------------------------------------------------------------------------- §7.3 on full distributions


#: Said under a full-distribution reading that kept a sample of the positions (numbers.kl.sample_positions).
SAMPLED_NOTE = ("a fixed, evenly spaced sample of the step's {n} response tokens (each a full distribution over the "
                "vocabulary)")


def exact_kl_explorer(run: Run | str | None = None, step: int | None = None, temperature: float = 0.7) -> W.VBox:
    """Chapter §7.3 on full distributions: the estimators' exact mean and per-token spread against the exact
    KL(π_θ‖π_ref), for tokens sampled from π_θ and from π_ref, with π_θ = the base model at temperature T_θ.

    Control: ``temperature`` (T_θ). Figures: ``means`` (E_q[k] averaged over positions, per estimator and
    sampler; the exact KL(π_θ‖π_ref) and −KL(π_ref‖π_θ) as lines), ``spread`` (√ of the mean per-token variance),
    ``sweep`` (the exact KL and the k1 / k3 variance under a ∼ π_θ against T_θ). ``state`` holds the last
    :func:`estimator_table`.
    """
    if not isinstance(temperature, (int, float)) or not 0.2 <= temperature <= 3.0:
        raise ValueError(f"temperature must be a number in [0.2, 3.0], got {temperature!r}")
    controls = {"temperature": W.FloatSlider(value=float(temperature), min=0.2, max=3.0, step=0.05,
                                             description="T_θ", continuous_update=False)}
    f_means = go.FigureWidget(layout=dict(height=330, barmode="group", yaxis_title=tr("mean over positions of E_q[k]")))
    f_spread = go.FigureWidget(layout=dict(height=300, barmode="group",
                                           yaxis_title=tr("per-token std √(mean Var_q[k])")))
    for sampler in ("a ∼ π_θ", "a ∼ π_ref"):
        f_means.add_bar(name=sampler, x=list(CANONICAL))
        f_spread.add_bar(name=sampler, x=list(CANONICAL))
    grid = [round(0.1 * i, 1) for i in range(3, 21)]
    src = response_logits(run, step)
    sweep = [moments_table(src["logits"], src["mask"], src["temperature"], T, ("k1", "k3")) for T in grid]
    f_sweep = go.FigureWidget(layout=dict(height=320, xaxis_title=tr("T_θ (π_ref: the run's temperature)"),
                                          yaxis_type="log", title=tr("under a ∼ π_θ")))
    f_sweep.add_scatter(x=grid, y=[s["kl"] for s in sweep], mode="lines", name=tr("KL(π_θ‖π_ref)"))
    for name in ("k1", "k3"):
        f_sweep.add_scatter(x=grid, y=[s["rows"][name]["pi_theta"]["var"] for s in sweep], mode="lines",
                            name=f"Var[{name}]")
    f_sweep.add_scatter(x=[], y=[], mode="markers", marker=dict(size=10, color="black"), name="T_θ")
    readout = W.HTML()
    state: dict[str, Any] = {}

    def update(*_):
        tab = moments_table(src["logits"], src["mask"], src["temperature"], controls["temperature"].value, CANONICAL)
        state.clear()
        state.update(tab)
        with f_means.batch_update(), f_spread.batch_update(), f_sweep.batch_update():
            for i, sampler in enumerate(("pi_theta", "pi_ref")):
                f_means.data[i].y = [tab["rows"][n][sampler]["mean"] for n in CANONICAL]
                f_spread.data[i].y = [tab["rows"][n][sampler]["std"] for n in CANONICAL]
            f_means.layout.shapes = [_hline(tab["kl"], "black", "dash"), _hline(-tab["reverse_kl"], "red", "dot")]
            f_means.layout.title.text = tr("T_θ = {t}: black dashed KL(π_θ‖π_ref) = {kl:.4g}, red dotted "
                                           "−KL(π_ref‖π_θ) = {minus_reverse:.4g}").format(
                t=tab["temperature"], kl=tab["kl"], minus_reverse=-tab["reverse_kl"])
            f_sweep.data[-1].x, f_sweep.data[-1].y = [tab["temperature"]], [tab["kl"]]
        fields = dict(n=tab["n_positions"], t_ref=tab["ref_temperature"], t=tab["temperature"])
        if src["sampled"]:  # a real vocabulary: a bounded, fixed sample keeps every move's cost flat
            readout.value = tr("{n} response positions; π_ref = base model at T = {t_ref}, π_θ = base model at "
                               "T_θ = {t} — {note}").format(**fields, note=tr(SAMPLED_NOTE).format(n=src["n_valid"]))
        else:
            readout.value = tr("{n} response positions; π_ref = base model at T = {t_ref}, π_θ = base model at "
                               "T_θ = {t}").format(**fields)

    controls["temperature"].observe(update, names="value")
    update()
    return _box([controls["temperature"], readout, f_means, f_spread, f_sweep], controls,
                {"means": f_means, "spread": f_spread, "sweep": f_sweep}, state=state)
