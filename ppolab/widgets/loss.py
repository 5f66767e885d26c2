"""``loss_assembly`` (lab 06, chapter §5): pg − c_H·H + c_KL·KL from ``ppolab.algos.ppo_loss`` on the recorded
batch, and the same advantages through every registered ``policy_loss.loss_mode``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.i18n import tr
from ppolab.algos import (
    POLICY_LOSS_REGISTRY,
    ppo_loss,
)
from ppolab.config.actor import LOSS_AGG_MODES, ActorConfig
from ppolab.run.reader import Run
from ppolab.widgets.common import (
    _box,
    check_index,
    n_opt_steps,
    opt_step_label,
    _opt_step_slider,
    actor_config,
    on_move,
    resolve_run,
    step_batches,
    step_tensors,
)


#: ``policy_loss.dro_beta`` used for the dro bar when the run sets none (verl's default None makes dro raise).
DRO_BETA_SHOWN = 0.1


def loss_assembly(
    run: Run | str | None = None,
    step: int | None = None,
    opt_step: int | None = None,
    loss_mode: str | None = None,
) -> W.VBox:
    """Lab 06 (§5): L_actor = L_PG − c_H·H + c_KL·K̂_ref, by ``ppolab.algos.ppo_loss`` on a recorded
    mini-batch.

    Controls: ``entropy_coeff``, ``kl_loss_coef``, ``use_kl_loss`` (starts at the run's setting; the recorded
    ``ref_log_prob`` lets a run without loss-side KL show what it would add), ``kl_loss_type``,
    ``loss_agg_mode``,
    ``loss_mode`` (every POLICY_LOSS_REGISTRY name), ``opt_step``. Figures: ``terms`` (pg, −c_H·H, +c_KL·K̂,
    total), ``modes`` (pg_loss of every registered loss on the same advantages — adv_estimator ⟂ loss_mode).
    ``state`` holds ``loss``, ``metrics`` (ppo_loss's) and ``mode_losses``.
    """
    r = resolve_run(run)
    rec = step_tensors(r, step)
    opt_step = check_index("opt_step", opt_step, n_opt_steps(rec))
    base = actor_config(r)
    adv_est = r.ppo_config().algorithm.adv_estimator
    loss_mode = base.policy_loss.loss_mode if loss_mode is None else loss_mode
    if loss_mode not in POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"loss_mode={loss_mode!r} is not registered; choose one of {', '.join(POLICY_LOSS_REGISTRY)}"
        )
    from ppolab.algos import KL_PENALTY_TYPES

    controls = {
        "entropy_coeff": W.FloatSlider(
            value=base.entropy_coeff,
            min=0.0,
            max=0.1,
            step=0.001,
            readout_format=".3f",
            description="entropy_coeff",
            continuous_update=False,
        ),
        "kl_loss_coef": W.FloatSlider(
            value=base.kl_loss_coef,
            min=0.0,
            max=1.0,
            step=0.001,
            readout_format=".3f",
            description="kl_loss_coef",
            continuous_update=False,
        ),
        "use_kl_loss": W.Checkbox(value=bool(base.use_kl_loss), description="use_kl_loss"),
        "kl_loss_type": W.Dropdown(
            options=list(KL_PENALTY_TYPES), value=base.kl_loss_type, description="kl_loss_type"
        ),
        "loss_agg_mode": W.Dropdown(
            options=list(LOSS_AGG_MODES), value=base.loss_agg_mode, description="loss_agg_mode"
        ),
        "loss_mode": W.Dropdown(options=list(POLICY_LOSS_REGISTRY), value=loss_mode, description="loss_mode"),
        "opt_step": _opt_step_slider(rec, opt_step),
    }
    f_terms = go.FigureWidget(layout=dict(height=340, yaxis_title=tr("contribution to the actor loss")))
    f_terms.add_bar(
        x=["L_PG", "−c_H·H", "+c_KL·K̂_ref", tr("total")],
        y=[0, 0, 0, 0],
        text=["", "", "", ""],
        textposition="outside",
    )
    modes = list(POLICY_LOSS_REGISTRY)
    f_modes = go.FigureWidget(
        layout=dict(height=340, title=tr("the same advantages through each loss_mode ppolab registers"),
                    yaxis_title="pg_loss")
    )
    f_modes.add_bar(x=modes, y=[0.0] * len(modes))
    readout = W.HTML()
    state: dict[str, Any] = {}

    batch = step_batches(rec)
    mode_cache: dict[tuple[int, str], tuple[dict[str, float], dict[str, str]]] = {}

    def cfg_for(mode: str, **settings: Any) -> ActorConfig:
        """The run's actor config (read once) with the controls' settings and ``loss_mode = mode``."""
        policy = replace(base.policy_loss, loss_mode=mode)
        if mode == "dro" and policy.dro_beta is None:  # verl's default None raises; show a value
            policy.dro_beta = DRO_BETA_SHOWN
        return replace(base, policy_loss=policy, **settings)

    def settings() -> dict[str, Any]:
        return {key: controls[key].value
                for key in ("entropy_coeff", "kl_loss_coef", "use_kl_loss", "kl_loss_type", "loss_agg_mode")}

    def pg_of_every_mode(k: int, agg: str, args: dict) -> tuple[dict[str, float], dict[str, str]]:
        """pg_loss of every registered mode at optimizer step ``k`` and ``agg`` — what the entropy and KL controls
        do not change, so it is computed once per (k, agg); ppo_loss without those terms (its pg_loss is the same)."""
        if (k, agg) not in mode_cache:
            mode_losses, skipped = {}, {}
            for mode in modes:
                try:
                    with torch.random.fork_rng():  # clip_cov draws tokens at random: same draw on every redraw
                        torch.manual_seed(0)
                        cfg = cfg_for(mode, loss_agg_mode=agg, use_kl_loss=False)
                        mode_losses[mode] = ppo_loss(cfg, **{**args, "entropy": None})[1]["actor/pg_loss"]
                except Exception as exc:  # noqa: BLE001 — a mode that needs settings the run does not have
                    mode_losses[mode], skipped[mode] = float("nan"), f"{type(exc).__name__}: {exc}"
            mode_cache[(k, agg)] = mode_losses, skipped
        return mode_cache[(k, agg)]

    @on_move
    def update(*_):
        k = controls["opt_step"].value
        b = batch(k)
        args = dict(old_log_prob=b["old_log_probs"], log_prob=b["log_prob"], advantages=b["advantages"],
                    response_mask=b["response_mask"], entropy=b.get("entropy"), ref_log_prob=b.get("ref_log_prob"))
        cfg = cfg_for(controls["loss_mode"].value, **settings())
        with torch.random.fork_rng():  # clip_cov draws tokens at random: same draw on every redraw
            torch.manual_seed(0)
            loss, metrics = ppo_loss(cfg, **args)
        pg = metrics["actor/pg_loss"]
        ent = -cfg.entropy_coeff * metrics.get("actor/entropy_loss", 0.0)
        kl = cfg.kl_loss_coef * metrics["actor/kl_loss"] if cfg.use_kl_loss else 0.0
        mode_losses, skipped = pg_of_every_mode(k, cfg.loss_agg_mode, args)
        state.update(
            loss=float(loss),
            metrics=metrics,
            pg=pg,
            entropy_term=ent,
            kl_term=kl,
            mode_losses=mode_losses,
            config=cfg,
        )
        with f_terms.batch_update():
            f_terms.data[0].y = [pg, ent, kl, float(loss)]
            f_terms.data[0].text = [f"{v:.4g}" for v in (pg, ent, kl, float(loss))]
            f_terms.layout.title.text = tr("{label}, loss_mode={mode}, {agg}").format(
                label=opt_step_label(rec, controls["opt_step"].value), mode=cfg.policy_loss.loss_mode,
                agg=cfg.loss_agg_mode)
        with f_modes.batch_update():
            f_modes.data[0].y = [mode_losses[mm] for mm in modes]
            f_modes.data[0].marker.color = [
                "red" if mm == cfg.policy_loss.loss_mode else "steelblue" for mm in modes
            ]
        not_shown = tr("<br><i>{mode} not shown (needs more config): {error}</i>")
        readout.value = (
            tr("advantages from <code>adv_estimator={adv}</code>, loss from <code>policy_loss.loss_mode={mode}</code>")
            .format(adv=adv_est, mode=cfg.policy_loss.loss_mode) + "<br>"
            + "<br>".join(f"{k_} = {v_:.6g}" for k_, v_ in metrics.items())
            + f"<br><b>loss = {float(loss):.6g}</b>"
            # the error is the exception's own English; tr translates the parts it knows
            + "".join(not_shown.format(mode=mm, error=tr(msg)) for mm, msg in skipped.items())
        )

    for ctl in controls.values():
        ctl.observe(update, names="value")
    update()
    items = list(controls.values())
    return _box(
        [W.HBox(items[:3]), W.HBox(items[3:6]), items[6], readout, f_terms, f_modes],
        controls,
        {"terms": f_terms, "modes": f_modes},
        state=state,
        record=rec,
    )
