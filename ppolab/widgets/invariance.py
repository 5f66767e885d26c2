"""``invariance_explorer``: the real actor update of recorded step 1, replayed under any micro-batching (chapter §13).

Every number comes from :func:`ppolab.replay.replay_actor_update`, i.e. from the actor worker's update (what
``PPOTrainer.update_actor`` runs) on the run's step-1 mini-batch 0 from the run's own initial weights. The top
figure is the largest gradient entry that differs from the reference (one micro-batch = the whole mini-batch) for
every fixed micro-batch size that divides the mini-batch and for the dynamic (token-budget) packing — a control
move replays the reference and the chosen micro-batching only, the button fills the rest; the bottom figure shows
the micro-batches of the configuration picked with the controls.
"""
from __future__ import annotations

import atexit
import html
import threading
import weakref
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from ppolab.i18n import tr
from ppolab.config import LOSS_AGG_MODES
from ppolab.replay import max_abs_diff, mini_batch_rows, replay_rows
from ppolab.numbers.aggregation import recorded_seq_lens
from ppolab.widgets.common import resolve_run
from ppolab.numbers.invariance import DYNAMIC, cached_replay, distinct_budgets, divisors, every_setting

#: Relative tolerance of the "same gradient" verdict: gap ≤ TOL · max(1, max |g_ref|).
TOL = 1e-5
#: The explorers whose background replays may still run: stopped (and waited for) when the widget closes or the
#: interpreter exits — a thread still inside torch at shutdown aborts the process ("terminate called without an
#: active exception", exit −6), which looks like a crash at a kernel restart or a script's end.
_PREFETCHING: "weakref.WeakSet[W.VBox]" = weakref.WeakSet()


def stop_prefetch(box: W.VBox, timeout: float | None = None) -> None:
    """Ask ``box``'s background replays to stop and wait for the one in progress (at most ``timeout`` s)."""
    event, thread = getattr(box, "stop_prefetch", None), getattr(box, "prefetch", None)
    if event is not None:
        event.set()
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout)


@atexit.register
def _stop_all_prefetches() -> None:
    for box in list(_PREFETCHING):
        stop_prefetch(box)


def invariance_explorer(run=None, step: int = 1, *, loss_agg_mode: str | None = None, scale: str = "fixed",
                        scale_value: float | None = None, prefetch: bool | None = None) -> W.VBox:
    """Replay step ``step`` (must be 1: see :mod:`ppolab.replay`) under every micro-batching.

    ``loss_agg_mode``: initial mode (default: the run's); ``scale``: ``"fixed"`` (loss_scale_factor =
    ``scale_value``, default ``data.max_response_length``; the factor control offers it, 1, half and twice
    ``max_response_length``) or ``"None"`` (verl's fallback: the micro-batch's padded width). ``prefetch``: replay
    every other setting in a background thread after opening, so that later moves read the cache (default: on a
    run whose replays are bounded to the first rows — a real vocabulary, where one replay takes about a second on
    2 cores; the shipped runs' take ~0.25 s and are replayed on demand); ``box.prefetch`` is that thread (or
    None), ``box.stop_prefetch`` stops it. Controls: ``micro_batch_size`` (divisors of the mini-batch),
    ``dynamic`` (use_dynamic_bsz), ``max_token_len``, ``loss_agg_mode``, ``scale``, ``scale_value``. Figures:
    ``gap`` (max |g − g_ref| per micro-batching; x labels are the micro-batch sizes and ``"dynamic"``),
    ``micro_batches`` (tokens and rows of each micro-batch of the chosen configuration). Attributes kept current:
    ``reference`` and ``current`` (the replay dicts), ``gaps`` (x label → gap), ``state`` (gap, tol, invariant,
    n_micro, loss).
    """
    r = resolve_run(run)
    if step != 1:
        raise ValueError(f"only the recorded step 1 can be replayed exactly (its update started from the seeded "
                         f"initial adapter); got step={step!r}")
    cfg = r.ppo_config()
    a = cfg.actor_rollout_ref.actor
    mode = loss_agg_mode or a.loss_agg_mode
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {mode!r}")
    if scale not in ("fixed", "None"):
        raise ValueError(f"scale must be 'fixed' or 'None', got {scale!r}")
    factor = float(scale_value if scale_value is not None else cfg.data.max_response_length)
    if not factor > 0:
        raise ValueError(f"scale_value must be positive, got {scale_value!r}")
    rows = replay_rows(r, step, 0)  # a large run replays the first rows of the mini-batch only (said in the status)
    n_mini = len(mini_batch_rows(r, step, 0))
    note = (tr(" — replaying the first {n} of the mini-batch's {m} rows (a large vocabulary: each replay's "
               "logits stay bounded)").format(n=len(rows), m=n_mini) if len(rows) < n_mini else "")
    background = prefetch or (prefetch is None and len(rows) < n_mini)
    if background:
        note += tr("; every other setting is being replayed in the background, so a move waits for at most one "
                   "replay until that is done")
    sizes = divisors(len(rows))
    rec = r.step(step)
    lens = [recorded_seq_lens(rec)[i] for i in rows]  # the lengths the engine's dynamic packing counts
    budget = max(max(lens), sum(lens) // 16)  # ~1/16 of the mini-batch's tokens per micro-batch
    own = a.ppo_micro_batch_size_per_gpu
    horizon = float(cfg.data.max_response_length)
    # any fixed factor keeps sum-norm invariant (§10.5): a few values are enough, and every one can be precomputed
    factors = sorted({1.0, horizon / 2, horizon, 2 * horizon, factor})
    style = {"description_width": "initial"}
    controls = {
        "micro_batch_size": W.SelectionSlider(options=sizes, value=own if own in sizes else sizes[0],
                                              description="ppo_micro_batch_size_per_gpu", style=style,
                                              continuous_update=False),
        "dynamic": W.Checkbox(value=False, description="use_dynamic_bsz"),
        "max_token_len": W.IntSlider(value=budget, min=max(lens), max=sum(lens),
                                     description="ppo_max_token_len_per_gpu", style=style,
                                     continuous_update=False, disabled=True),
        "loss_agg_mode": W.Dropdown(options=list(LOSS_AGG_MODES), value=mode, description="loss_agg_mode",
                                    style=style),
        "scale": W.ToggleButtons(options=["fixed", "None"], value=scale, description="loss_scale_factor",
                                 style=style),
        "scale_value": W.SelectionSlider(options=factors, value=factor, description=tr("fixed factor"), style=style,
                                         continuous_update=False),
    }
    figs = {
        "gap": go.FigureWidget(layout={"height": 330, "yaxis": {"type": "log", "title": tr("max |g − g_ref|")},
                                       "xaxis": {"title": tr("micro-batch size (rows) · or dynamic"),
                                                 "type": "category"},
                                       "showlegend": False}),
        "micro_batches": go.FigureWidget(layout={
            "height": 300, "barmode": "group", "xaxis": {"title": tr("micro-batch (execution order)")},
            "yaxis": {"title": tr("tokens (prompt + response)")},
            "yaxis2": {"title": tr("rows"), "overlaying": "y", "side": "right", "showgrid": False},
            "legend": {"orientation": "h", "y": 1.12}}),
    }
    figs["gap"].add_bar(name=tr("gap"))
    figs["gap"].add_scatter(name=tr("tolerance"), mode="lines", line={"dash": "dash", "color": "red"})
    figs["micro_batches"].add_bar(name=tr("tokens"), offsetgroup="tokens", yaxis="y")
    figs["micro_batches"].add_bar(name=tr("rows"), offsetgroup="rows", yaxis="y2")
    status = W.HTML()

    def replay(label, *, mode, factor, compute=True) -> dict[str, Any] | None:
        """The replay of one x label under the current mode/factor (cached: the update is deterministic)."""
        dyn = label == DYNAMIC
        return cached_replay(r, step, loss_agg_mode=mode, loss_scale_factor=factor,
                             micro_batch_size=None if dyn else label,
                             max_token_len=controls["max_token_len"].value if dyn else None, compute=compute)

    def current_factor() -> float | None:
        return controls["scale_value"].value if controls["scale"].value == "fixed" else None

    def refresh(*_, every: bool = False):
        """Replay what the current setting needs — the reference (one micro-batch) and the chosen micro-batching —
        so one control move costs at most two updates; the other bars come from the cache, or from every
        micro-batching when ``every`` (the initial build and the "replay every micro-batching" button)."""
        mode, factor = controls["loss_agg_mode"].value, current_factor()
        dyn = controls["dynamic"].value
        controls["micro_batch_size"].disabled, controls["max_token_len"].disabled = dyn, not dyn
        reference = replay(len(rows), mode=mode, factor=factor)
        labels = [*sizes, DYNAMIC]
        chosen = DYNAMIC if dyn else controls["micro_batch_size"].value
        outs = {lab: replay(lab, mode=mode, factor=factor, compute=every or lab == chosen) for lab in labels}
        gaps = {lab: max_abs_diff(o["grads"], reference["grads"]) for lab, o in outs.items() if o is not None}
        g_max = max(float(g.abs().max()) for g in reference["grads"])
        tol = TOL * max(1.0, g_max)
        current = outs[chosen]
        xs = [str(x) if x != DYNAMIC else tr("dynamic ({n} tok)").format(n=controls["max_token_len"].value)
              for x in labels]
        colors = ["#7f7f7f" if x not in gaps else "#d62728" if gaps[x] > tol else "#2ca02c" for x in labels]
        line = [("#000" if x == chosen else c) for x, c in zip(labels, colors)]
        with figs["gap"].batch_update():
            figs["gap"].data[0].update(x=xs, y=[gaps.get(x) for x in labels],
                                       text=[tr("reference") if x == len(rows) else f"{gaps[x]:.1e}" if x in gaps
                                             else tr("not replayed") for x in labels],
                                       marker={"color": colors,
                                               "line": {"color": line,
                                                        "width": [3 if x == chosen else 0 for x in labels]}})
            figs["gap"].data[1].update(x=[xs[0], xs[-1]], y=[tol, tol])
            figs["gap"].layout.title = tr("{mode}, loss_scale_factor={factor}: gradient gap to one micro-batch of "
                                          "{rows} rows (max |g_ref| = {g:.3g})").format(mode=mode, factor=factor,
                                                                                       rows=len(rows), g=g_max)
        parts = current["micro_batches"]
        with figs["micro_batches"].batch_update():
            xs_mb = list(range(len(parts)))
            figs["micro_batches"].data[0].update(
                x=xs_mb, y=[sum(current["seq_lens"][i] for i in p) for p in parts],
                text=[f"T={w}" for w in current["widths"]],
                hovertext=[tr("padded response width T = {w}").format(w=w) for w in current["widths"]])
            figs["micro_batches"].data[1].update(x=xs_mb, y=[len(p) for p in parts])
            how = (tr("{n} micro-batches (dynamic, budget {budget} tokens); T = padded response width") if dyn else
                   tr("{n} micro-batches ({size} rows each); T = padded response width"))
            figs["micro_batches"].layout.title = how.format(n=len(parts), budget=controls["max_token_len"].value,
                                                            size=chosen)
        gap = gaps[chosen]
        invariant = gap <= tol
        m = current["metrics"]
        box.reference, box.current, box.gaps = reference, current, gaps
        box.state = {"gap": gap, "tol": tol, "invariant": invariant, "n_micro": len(parts),
                     "loss": m["actor/loss"], "reference_loss": reference["metrics"]["actor/loss"]}
        verdict = ("<b style='color:#2ca02c'>same gradient</b>" if invariant
                   else "<b style='color:#d62728'>different gradient: invariance broken</b>")
        status.value = tr("{verdict} — max |g − g_ref| = {gap:.3e} (tolerance {tol:.1e}); actor/loss {loss:.6f} vs "
                          "{ref:.6f}; {n} micro-batches, widths T = {widths}").format(
            verdict=tr(verdict), gap=gap, tol=tol, loss=m["actor/loss"], ref=reference["metrics"]["actor/loss"],
            n=len(parts), widths=html.escape(str(sorted(set(current["widths"]))))) + note

    every = W.Button(description=tr("replay every micro-batching"), tooltip=tr(
        "a control move replays only the chosen micro-batching (and the reference); this fills the other bars"))
    every.on_click(lambda _: refresh(every=True))
    box = W.VBox([W.HBox([W.VBox([controls["micro_batch_size"], controls["dynamic"], controls["max_token_len"]]),
                          W.VBox([controls["loss_agg_mode"], controls["scale"], controls["scale_value"], every])]),
                  status, figs["gap"], figs["micro_batches"]])
    box.controls, box.figures, box.run, box.rows = controls, figs, r, rows
    for ctl in controls.values():
        ctl.observe(refresh, names="value")
    controls["replay_all"] = every  # a button: no value, so control sweeps skip it
    refresh(every=True)
    box.prefetch, box.stop_prefetch = None, threading.Event()
    if background:
        slider = controls["max_token_len"]

        def fill() -> None:
            budgets = distinct_budgets(r, step, range(slider.min, slider.max + 1))
            for kw in every_setting(r, step, sizes=sizes, budgets=budgets, factors=[*factors, None],
                                    first=(mode, factor)):
                if box.stop_prefetch.is_set():
                    return
                cached_replay(r, step, **kw)
        box.prefetch = threading.Thread(target=fill, name="invariance-prefetch", daemon=True)
        _PREFETCHING.add(box)
        close = box.close

        def close_and_stop() -> None:  # a closed widget's replays are of no use to anyone
            stop_prefetch(box)
            close()
        box.close = close_and_stop
        box.prefetch.start()
    return box


def _showable_steps(run) -> list[int]:
    """The steps :func:`invariance_explorer` can replay exactly: step 1 alone (``ppolab.widgets.follow`` reads it)."""
    return [1]


invariance_explorer.showable_steps = _showable_steps
