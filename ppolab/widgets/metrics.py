"""``metrics_dashboard`` and ``warning_signs``: every logged metric of a run, what it means, and the chapter §15
warning signs checked automatically."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import ipywidgets as W
import plotly.graph_objects as go

from ppolab.i18n import tr
from ppolab.widgets.common import resolve_run

if TYPE_CHECKING:
    import torch

#: One line per verl metric name (exact names; ``prefix/*`` entries cover a family, see :func:`meaning`).
METRIC_MEANINGS = {
    "actor/pg_loss": "policy-gradient loss after loss_agg_mode; its sign alone says little — read it with the "
                     "advantage scale",
    "actor/pg_clipfrac": "share of response tokens where the clipped surrogate was the active branch "
                         "(micro-batch masked means, averaged)",
    "actor/pg_clipfrac_lower": "share of tokens where the dual clip (clip_ratio_c) bounded a negative-advantage loss",
    "actor/ppo_kl": "approximate KL between the current policy and π_old (the PPO anchor) — not the reference KL",
    "actor/entropy": "mean token entropy of π_old on the response tokens (aggregated with loss_agg_mode)",
    "actor/entropy_loss": "the entropy term of the actor loss, aggregated with loss_agg_mode",
    "actor/kl_loss": "loss-side KL estimator to π_ref, before multiplying by kl_loss_coef",
    "actor/kl_coef": "kl_loss_coef: the weight of actor/kl_loss in the actor loss",
    "actor/loss": "the total actor loss that was back-propagated (pg_loss − entropy_coeff·entropy + kl_coef·kl_loss)",
    "actor/grad_norm": "global gradient norm of the actor before clipping (optim.clip_grad)",
    "actor/lr": "the actor's learning rate at this step",
    "actor/reward_kl_penalty": "reward-side KL estimate between π_old and π_ref (use_kl_in_reward)",
    "actor/reward_kl_penalty_coeff": "reward-side β, the coefficient subtracted per token from the reward "
                                     "(adaptive or fixed)",
    "critic/vf_loss": "clipped value regression loss ½·max((V−G)², (V_clip−G)²)",
    "critic/vf_clipfrac": "share of tokens where the clipped value error was the larger one",
    "critic/vpred_mean": "mean critic prediction during the critic update",
    "critic/vf_explained_var": "1 − Var(G − V)/Var(G): how much of the return variance the critic explains "
                               "(1 perfect, ≤0 useless)",
    "critic/grad_norm": "global gradient norm of the critic before clipping",
    "critic/loss": "the total critic loss that was back-propagated",
    "critic/lr": "the critic's learning rate at this step",
    "critic/score/*": "sequence score from the reward function (sum of token_level_scores per real trajectory)",
    "critic/rewards/*": "sequence reward after reward-side KL (sum of token_level_rewards per real trajectory)",
    "critic/advantages/*": "advantages over the valid response tokens",
    "critic/returns/*": "returns (value targets) over the valid response tokens",
    "critic/values/*": "V_old, the critic's values over the valid response tokens",
    "response_length/*": "response tokens per real trajectory (response_mask sums)",
    "response_length/clip_ratio": "share of responses that hit data.max_response_length (truncated)",
    "prompt_length/*": "prompt tokens per real trajectory",
    "val/accuracy": "greedy validation accuracy on the held-out prompts",
    "val/reward_mean": "mean validation reward",
    "val/response_length_mean": "mean validation response length",
    "val-core/*": "verl's per-data-source validation metric (reward mean@k)",
    "timing_s/*": "wall-clock seconds of one stage of the step "
                  "(gen, reward, balance, old_log_prob, ref, values, adv, update_*)",
    "perf/total_num_tokens": "prompt + response tokens of the step batch",
    "perf/time_per_step": "wall-clock seconds of the whole step",
    "perf/throughput": "tokens per second per data-parallel rank",
    "perf/*": "performance counters",
    "training/global_step": "the training step counter",
    "training/epoch": "pass over the training prompts",
    "training/rollout_probs_diff_max": "max |π_old − π_rollout| probability gap on response tokens "
                                       "(rollout/training mismatch)",
    "training/rollout_probs_diff_mean": "mean |π_old − π_rollout| probability gap on response tokens",
    "training/rollout_probs_diff_std": "std of |π_old − π_rollout| on response tokens",
    "training/*": "trainer bookkeeping",
    "global_seqlen/min": "smallest per-rank token sum without balancing (contiguous chunks)",
    "global_seqlen/max": "largest per-rank token sum without balancing",
    "global_seqlen/minmax_diff": "max − min of the unbalanced per-rank token sums",
    "global_seqlen/balanced_min": "smallest per-rank token sum after Karmarkar–Karp balancing",
    "global_seqlen/balanced_max": "largest per-rank token sum after balancing",
    "global_seqlen/mean": "tokens per rank on average",
    "rollout_corr/*": "rollout-correction diagnostics (IS weights, mismatch KL) of π_old vs π_rollout",
}

#: Thresholds of :func:`warning_signs`.
THRESHOLDS = {
    "pg_clipfrac_high": 0.2,  # median of the late half above this: updates too large
    "ppo_kl_large": 0.05,  # |ppo_kl| above this at any step
    "entropy_collapse_ratio": 0.1,  # late entropy below this fraction of the early entropy
    "grad_norm_spike": 10.0,  # a grad_norm above this many times the run's median
    "clip_ratio_high": 0.2,  # response_length/clip_ratio mean of the late half above this
    "vf_clipfrac_high": 0.3,  # critic/vf_clipfrac median of the late half above this
    "pg_clipfrac_lower_high": 0.05,  # dual-clip share above this in the late half
    "pg_clipfrac_zero": 0.0,  # late max of pg_clipfrac at or below this: the policy barely moves (§15 table)
    "kl_term_dominates": 1.0,  # late median kl_coef·kl_loss above this many times |pg_loss| (§15 table)
    "vf_loss_large": 0.5,  # late median vf_loss above this fraction of ½·(returns max − min)² (§15 table)
    "rollout_probs_diff_high": 0.01,  # mean |π_old − π_rollout| above this at any step (a bf16 vLLM run: ~1e-3)
}


def meaning(name: str) -> str:
    """The one-line meaning of metric ``name`` (exact entry first, then the longest matching ``prefix/*``)."""
    if name in METRIC_MEANINGS:
        return METRIC_MEANINGS[name]
    parts = name.split("/")
    for cut in range(len(parts) - 1, 0, -1):
        key = "/".join(parts[:cut]) + "/*"
        if key in METRIC_MEANINGS:
            return METRIC_MEANINGS[key]
    return "(no description: not a verl metric name ppolab knows)"


def _frame(run):
    import pandas as pd

    if isinstance(run, pd.DataFrame):
        return run
    return resolve_run(run).metrics


def warning_signs(run=None, thresholds: dict | None = None) -> list[str]:
    """Chapter §15's warning signs, checked on a run's metrics (a Run, a run name/path, or a metrics DataFrame
    indexed by step). Returns one human-readable line per sign found (empty list: nothing alarming).

    "Late" means the second half of the training steps. Checks: non-finite losses; actor/pg_clipfrac persistently
    high; |actor/ppo_kl| large; actor/pg_clipfrac_lower high; actor/entropy collapse; actor/grad_norm and
    critic/grad_norm spikes; response_length/clip_ratio high; critic/vf_clipfrac high; critic/vf_explained_var
    negative late in training; actor/pg_clipfrac stuck at 0; the loss-side KL term kl_coef·kl_loss larger
    than |pg_loss|; critic/vf_loss persistently large against the spread of the returns; the rollout engine
    disagreeing with the trainer (training/rollout_probs_diff_mean); critic/score non-finite or the same for
    every response.
    """
    th = {**THRESHOLDS, **(thresholds or {})}
    unknown = set(thresholds or {}) - set(THRESHOLDS)
    if unknown:
        raise ValueError(f"unknown thresholds {sorted(unknown)}; allowed: {list(THRESHOLDS)}")
    m = _frame(run)
    if "training/global_step" in m:  # step 0 holds only the validation before training
        m = m[m["training/global_step"].notna()]
    out: list[str] = []
    if len(m) == 0:
        return out
    from ppolab.rewards import reward_warning_signs

    out += reward_warning_signs(m)  # critic/score non-finite (NaN/inf, logged as null) or the same for every response

    def col(name):
        return m[name].dropna() if name in m else None

    def late(s):
        return s.iloc[len(s) // 2:]

    for name in ("actor/pg_loss", "actor/loss", "critic/vf_loss", "actor/grad_norm", "critic/grad_norm"):
        if name not in m or m[name].notna().sum() < len(m) / 2:  # not logged (or logged only occasionally)
            continue
        s = m[name].astype(float)
        bad = s[~s.apply(math.isfinite)]  # NaN (logged as null) or ±inf
        if len(bad):
            out.append(f"{name} is not finite (NaN/inf) at {len(bad)} step(s), first at step {bad.index[0]}")
    s = col("actor/pg_clipfrac")
    if s is not None and len(s) and late(s).median() > th["pg_clipfrac_high"]:
        out.append(f"actor/pg_clipfrac persistently high (late median {late(s).median():.3f} > "
                   f"{th['pg_clipfrac_high']}): updates too large — lower lr, ppo_epochs or raise the mini-batch")
    if s is not None and len(s) >= 2 and late(s).max() <= th["pg_clipfrac_zero"]:
        out.append(f"actor/pg_clipfrac stays at 0 (late max {late(s).max():.3g}): the policy barely moves between "
                   "π_old and the update — expected only with one mini-batch and one epoch (fully on-policy)")
    s = col("actor/ppo_kl")
    if s is not None and len(s) and s.abs().max() > th["ppo_kl_large"]:
        out.append(f"actor/ppo_kl large (max |ppo_kl| {s.abs().max():.4f} at step {s.abs().idxmax()} > "
                   f"{th['ppo_kl_large']}): the update moved far from π_old")
    s = col("actor/pg_clipfrac_lower")
    if s is not None and len(s) and late(s).mean() > th["pg_clipfrac_lower_high"]:
        out.append(f"actor/pg_clipfrac_lower high (late mean {late(s).mean():.3f}): extreme ratios on "
                   "negative advantages")
    s = col("actor/entropy")
    if s is not None and len(s) >= 4:
        early = s.iloc[: max(1, len(s) // 10)].mean()
        end = s.iloc[-max(1, len(s) // 10):].mean()
        if early > 0 and end < th["entropy_collapse_ratio"] * early:
            out.append(f"actor/entropy collapsed ({early:.3f} → {end:.3f}, below {th['entropy_collapse_ratio']:.0%} "
                       "of its start): exploration is gone")
    for name in ("actor/grad_norm", "critic/grad_norm"):
        s = col(name)
        if s is not None and len(s) >= 4:
            med = s.median()
            spikes = s[s > th["grad_norm_spike"] * med] if med > 0 else s.iloc[:0]
            if len(spikes):
                out.append(f"{name} spikes: {len(spikes)} step(s) above {th['grad_norm_spike']:g}× the median "
                           f"{med:.3g} (first at step {spikes.index[0]}, {spikes.iloc[0]:.3g})")
    s = col("response_length/clip_ratio")
    if s is not None and len(s) and late(s).mean() > th["clip_ratio_high"]:
        out.append(f"response_length/clip_ratio high (late mean {late(s).mean():.2f}): many responses are truncated "
                   "at max_response_length")
    s = col("critic/vf_clipfrac")
    if s is not None and len(s) and late(s).median() > th["vf_clipfrac_high"]:
        out.append(f"critic/vf_clipfrac high (late median {late(s).median():.3f}): critic steps too large")
    if col("actor/kl_loss") is not None and col("actor/kl_coef") is not None and col("actor/pg_loss") is not None:
        kl_term = late((m["actor/kl_coef"] * m["actor/kl_loss"]).dropna()).median()
        pg = late(m["actor/pg_loss"].dropna()).abs().median()
        if len(m["actor/kl_loss"].dropna()) >= 2 and kl_term > th["kl_term_dominates"] * pg:
            out.append(f"KL term dominates: late median kl_coef·kl_loss {kl_term:.3g} > {th['kl_term_dominates']:g}×"
                       f"|pg_loss| {pg:.3g} — the reference KL, not the advantage, drives the update")
    s = col("critic/vf_loss")
    if (s is not None and len(s) >= 2 and col("critic/returns/max") is not None
            and col("critic/returns/min") is not None):
        span = late((m["critic/returns/max"] - m["critic/returns/min"]).dropna()).mean()
        scale = 0.5 * span ** 2 if span > 0 else 1.0
        if late(s).median() > th["vf_loss_large"] * scale:
            out.append(f"critic/vf_loss persistently large (late median {late(s).median():.3g} > "
                       f"{th['vf_loss_large']:g}×½·(returns span {span:.3g})²): critic and return scale do not match")
    s = col("training/rollout_probs_diff_mean")
    if s is not None and len(s) and s.max() > th["rollout_probs_diff_high"]:
        out.append(f"training/rollout_probs_diff_mean high (max {s.max():.3g} at step {s.idxmax()} > "
                   f"{th['rollout_probs_diff_high']:g}): the rollout engine samples from another policy than the "
                   "trainer's — stale weights or an adapter that did not reach the engine, or low precision; fix "
                   "the weight sync, or correct with algorithm.rollout_correction.rollout_is")
    s = col("critic/vf_explained_var")
    if s is not None and len(s) >= 2 and late(s).mean() < 0:
        out.append(f"critic/vf_explained_var negative late in training (late mean {late(s).mean():.3f}): the critic "
                   "explains less than a constant")
    return out


def metrics_dashboard(run=None, metric: str | None = None) -> W.VBox:
    """A dropdown over every logged metric of ``run`` with its meaning, its curve, and :func:`warning_signs`.

    Controls: ``metric`` (Dropdown). Figures: ``metric`` (the metric against the step). Attribute ``warnings``.
    """
    r = resolve_run(run)
    m = r.metrics
    names = sorted(m.columns)
    if not names:
        raise ValueError(f"{r.path} has no logged metrics")
    metric = metric or ("critic/score/mean" if "critic/score/mean" in names else names[0])
    if metric not in names:
        raise ValueError(f"metric must be one of the logged metrics {names}, got {metric!r}")
    controls = {"metric": W.Dropdown(options=names, value=metric, description=tr("metric"))}
    figs = {"metric": go.FigureWidget(layout={"height": 320, "xaxis_title": tr("step")})}
    figs["metric"].add_scatter(mode="lines+markers", marker={"size": 4})
    text = W.HTML()
    warnings = warning_signs(m)
    warn_html = W.HTML(tr("<b>warning signs (chapter §15):</b> ") + (
        tr("none found") if not warnings else "<ul>" + "".join(f"<li>{tr(w)}</li>" for w in warnings) + "</ul>"))

    def refresh(*_):
        name = controls["metric"].value
        s = m[name].dropna()
        with figs["metric"].batch_update():
            figs["metric"].data[0].update(x=s.index.tolist(), y=s.tolist(), name=name)
            figs["metric"].layout.title = name
            figs["metric"].layout.yaxis.title = name
        text.value = f"<code>{name}</code>: {tr(meaning(name))}"

    controls["metric"].observe(refresh, names="value")
    box = W.VBox([controls["metric"], text, figs["metric"], warn_html])
    box.controls, box.figures, box.warnings, box.run = controls, figs, warnings, r
    refresh()
    return box


# ------------------------------------------------------------------------------------------ distributions
#: The per-step distributions of chapter §15 ("reward distribution, advantage distribution, response length")
#: and the logged metric whose mean each one has (verl's compute_data_metrics, ppolab.metrics.data_metrics).
DISTRIBUTIONS = {"score": "critic/score/mean", "advantage": "critic/advantages/mean",
                 "response_length": "response_length/mean"}


def step_distributions(run=None, steps=None) -> dict[int, dict[str, torch.Tensor]]:
    """The values behind the logged means, per recorded step, from the recorded tensors (real rows only):

    * ``score`` — one value per trajectory, Σ_t token_level_scores (``critic/score/*``);
    * ``advantage`` — one value per valid response token, as ``critic/advantages/*`` is computed (for GRPO every
      token of a trajectory carries the trajectory's scalar advantage);
    * ``response_length`` — response_mask sums per trajectory (``response_length/*``; tool observations excluded);
    * ``advantage_per_trajectory`` — the masked token mean of the advantage per trajectory (NaN without tokens).

    ``steps``: recorded steps (default: all). Returns ``{step: {name: 1-D tensor}}``.
    """
    import torch

    from ppolab.widgets.common import real_rows

    r = resolve_run(run)
    chosen = r.steps if steps is None else list(steps)
    missing = [s for s in chosen if s not in r.steps]
    if missing:
        raise ValueError(f"steps {missing} were not recorded; recorded steps: {r.steps}")
    out = {}
    for s in chosen:
        rec = r.step(s)
        t, real = rec.tensors, real_rows(rec)
        mask = t["response_mask"][real].float()
        adv = t["advantages"][real].float()
        n_tok = mask.sum(-1)
        out[s] = {"score": t["token_level_scores"][real].float().sum(-1),
                  "advantage": adv[mask.bool()],
                  "response_length": n_tok,
                  "advantage_per_trajectory": torch.where(n_tok > 0, (adv * mask).sum(-1) / n_tok.clamp(min=1),
                                                          torch.full_like(n_tok, float("nan")))}
    return out


def distribution_figure(run=None, steps=None) -> go.FigureWidget:
    """Three panels against the training step: the score (stacked shares of each value when the reward takes at most
    five values, else one box per step), the token advantages and the response lengths (one box per recorded step,
    the dashed line is the box's mean), each with the logged mean metric as a line, so the curve of means is seen as
    the centre of a distribution."""
    from plotly.subplots import make_subplots

    r = resolve_run(run)
    dist = step_distributions(r, steps)
    xs = list(dist)
    m = r.metrics
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[tr("score per trajectory (reward distribution)"),
                                        tr("advantage per valid response token"),
                                        tr("response length per trajectory")])
    values = sorted({round(float(v), 6) for s in xs for v in dist[s]["score"].tolist()})
    if len(values) <= 5:
        for v in values:
            shares = [float((dist[s]["score"].sub(v).abs() < 1e-6).float().mean()) for s in xs]
            fig.add_bar(x=xs, y=shares, name=tr(f"score = {v:g}"), legendgroup="score", row=1, col=1)
        fig.update_layout(barmode="stack")
        fig.update_yaxes(title_text=tr("share of trajectories"), row=1, col=1)
    else:
        for s in xs:
            fig.add_box(x=[s] * len(dist[s]["score"]), y=dist[s]["score"].tolist(), name=tr(f"score {s}"),
                        boxmean=True, showlegend=False, marker_color="#1f77b4", row=1, col=1)
    for row, key, color in ((2, "advantage", "#d62728"), (3, "response_length", "#2ca02c")):
        for s in xs:
            fig.add_box(x=[s] * len(dist[s][key]), y=dist[s][key].tolist(), name=tr(f"{key} {s}"), boxmean=True,
                        showlegend=False, marker_color=color, row=row, col=1)
    for row, key in ((1, "score"), (2, "advantage"), (3, "response_length")):
        name = DISTRIBUTIONS[key]
        if name in m.columns and row > 1:  # the stacked shares of row 1 are on another scale
            curve = m[name].dropna()
            fig.add_scatter(x=curve.index.tolist(), y=curve.tolist(), mode="lines", name=tr(f"logged {name}"),
                            line={"color": "black", "width": 1}, row=row, col=1)
    fig.update_xaxes(title_text=tr("training step"), row=3, col=1)
    fig.update_layout(height=760, title=tr(f"{r.path.name}: distributions per recorded step (chapter §15)"),
                      legend={"orientation": "h", "y": -0.08})
    return go.FigureWidget(fig)
