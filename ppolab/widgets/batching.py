"""``batch_calculator``: batch → mini-batch → micro-batch arithmetic (chapter §11–§12) from ``ppolab.batching``.

The table is ``plan_batches(..., pad_to=padding_multiple(...))`` itself — a step whose rows do not fill whole
mini-batches is padded with synthetic rows, as the trainer's balance stage does; combinations that cannot work
show the ``ValueError`` text — the timeline draws the plan's optimizer steps, and the dynamic-batch figure is
``plan_dynamic_micro_batches`` on the recorded sequence lengths of the first mini-batch of a recorded step.
"""
from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.i18n import tr
from ppolab.batching import padding_multiple, plan_batches, plan_dynamic_micro_batches
from ppolab.widgets.common import resolve_run, step_tensors, on_move

#: Slider ranges (min, max) of the plan's inputs.
RANGES = {"train_batch_size": (1, 256), "rollout_n": (1, 16), "ppo_mini_batch_size": (1, 256), "dp_size": (1, 16),
          "ppo_micro_batch_size_per_gpu": (1, 128), "ppo_epochs": (1, 4)}
#: The timeline draws at most this many optimizer steps.
MAX_TIMELINE_STEPS = 256


def synthetic_padding(train_batch_size: int, rollout_n: int, ppo_mini_batch_size: int, dp_size: int = 1,
                      ppo_micro_batch_size_per_gpu: int | None = None, ppo_epochs: int = 1,
                      critic_ppo_mini_batch_size: int | None = None, run=None, step: int | None = None) -> dict:
    """What the trainer's balance stage (stage 3) does to a step whose rows do not divide: verl V1's
    ``padding_utils.upsample_batch_to_divisible_size``, in ppolab ``PPOTrainer.balance_batch`` →
    ``add_padding_samples`` (chapter §9, §11).

    ``plan`` is ``plan_batches(..., pad_to=padding_multiple(dp, actor mini×n[, critic mini×n]))``, the planner
    the trainer builds; ``batch`` is the trainer's own stage-3 function (``ppolab.batch.pad_and_balance``) run on
    a recorded step batch resized to ``train_batch_size × rollout_n`` rows (rows repeated
    as needed; no model is loaded). Returns ``rows`` (before), ``multiple``, ``synthetic_rows`` (rows flagged
    ``is_pad`` after the stage; equal to ``plan.padding_rows``), ``padded_rows``, ``optimizer_steps_per_epoch``,
    ``plan`` and ``batch``.
    """
    from ppolab.batch import Batch, pad_and_balance
    from ppolab.widgets.masks import run_tokenizer

    minis = [ppo_mini_batch_size * rollout_n]
    if critic_ppo_mini_batch_size is not None:
        minis.append(critic_ppo_mini_batch_size * rollout_n)
    multiple = padding_multiple(dp_size, *minis)
    plan = plan_batches(train_batch_size, rollout_n, ppo_mini_batch_size, dp_size, ppo_micro_batch_size_per_gpu,
                        ppo_epochs, pad_to=multiple)
    r = resolve_run(run)
    rec = step_tensors(r, step)
    recorded = rec.batch_tensors()
    n_rows = plan.n_trajectories
    batch = Batch(recorded).select([i % len(recorded["is_pad"]) for i in range(n_rows)])
    batch["is_pad"] = torch.zeros(n_rows, dtype=torch.bool)  # every row of the resized batch is a real trajectory
    padded, _ = pad_and_balance(batch, multiple, dp_size, run_tokenizer(r))
    synthetic = int(padded["is_pad"].sum())
    if synthetic != plan.padding_rows or len(padded) % multiple:
        raise AssertionError(f"balance stage added {synthetic} rows, the plan says {plan.padding_rows}")
    return {"rows": n_rows, "multiple": multiple, "synthetic_rows": synthetic, "padded_rows": len(padded),
            "optimizer_steps_per_epoch": plan.optimizer_steps_per_epoch, "plan": plan, "batch": padded}


def batch_calculator(run=None, step=None, max_token_len: int | None = None, **sizes) -> W.VBox:
    """Sliders for every input of ``plan_batches`` (defaults: the recorded step's plan) and a token budget.

    ``sizes``: any of :data:`RANGES`' keys. Attributes after every change: ``plan`` (the BatchPlan or None) and
    ``error`` (the ValueError text or None). Figures: ``timeline`` (one bar per optimizer step: rows it sees,
    colour = epoch, text = micro-batch waves), ``dynamic`` (token sum of each dynamic micro-batch of the recorded
    first mini-batch, stacked per sequence, with the budget line). Controls: the six sizes and ``max_token_len``.
    """
    r = resolve_run(run)
    if step is not None and step not in r.steps:
        raise ValueError(f"step must be one of the recorded steps {r.steps}, got {step!r}")
    rec = step_tensors(r, step)
    unknown = set(sizes) - set(RANGES)
    if unknown:
        raise ValueError(f"unknown size {sorted(unknown)}; allowed: {list(RANGES)}")
    recorded = rec.info.get("batch_plan", {})
    values = {k: sizes.get(k, recorded.get(k) or lo) for k, (lo, hi) in RANGES.items()}
    for k, v in values.items():
        lo, hi = RANGES[k]
        if not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"{k} must be an int in {lo}..{hi}, got {v!r}")
    lens = rec.opt_step(0, "actor").seq_lens()  # rank 0's share of the first mini-batch, as the worker cut it
    lo_tok, hi_tok = max(lens), sum(lens)
    mtl = max_token_len if max_token_len is not None else max(lo_tok, hi_tok // 4)
    if not isinstance(mtl, int) or not lo_tok <= mtl <= hi_tok:
        raise ValueError(f"max_token_len must be an int in {lo_tok}..{hi_tok} (longest sequence .. all tokens of "
                         f"the mini-batch), got {mtl!r}")

    style = {"description_width": "initial"}
    controls = {k: W.IntSlider(value=values[k], min=RANGES[k][0], max=RANGES[k][1], description=k, style=style,
                               continuous_update=False) for k in RANGES}
    controls["max_token_len"] = W.IntSlider(value=mtl, min=lo_tok, max=hi_tok, description="ppo_max_token_len_per_gpu",
                                            style=style, continuous_update=False)
    table = W.HTML()
    figs = {
        "timeline": go.FigureWidget(layout={"title": tr("optimizer steps of one training step"), "height": 300,
                                                "xaxis_title": tr("optimizer step"),
                                                "yaxis_title": tr("rows (global mini-batch)")}),
        "dynamic": go.FigureWidget(layout={"title": tr("use_dynamic_bsz micro-batches"), "barmode": "overlay",
                                               "height": 320, "xaxis_title": tr("micro-batch (execution order)"),
                                               "yaxis_title": tr("tokens"),
                                               "showlegend": False}),
    }
    figs["timeline"].add_bar()
    figs["dynamic"].add_bar(marker={"line": {"width": 1, "color": "white"}})
    figs["dynamic"].add_scatter(mode="lines", line={"dash": "dash", "color": "red"}, name=tr("budget"))

    @on_move
    def refresh_plan(*_):
        kw = {k: controls[k].value for k in RANGES}
        try:
            # a step whose rows do not fill whole mini-batches is padded with synthetic rows, as the trainer does
            plan = plan_batches(**kw, pad_to=padding_multiple(kw["dp_size"],
                                                              kw["ppo_mini_batch_size"] * kw["rollout_n"]))
            error = None
        except ValueError as e:
            plan, error = None, str(e)
        box.plan, box.error = plan, error
        if plan is None:
            # the error is ppolab.batching's own English; tr translates the parts it knows
            table.value = tr("<b style='color:#b00'>invalid: {error}</b>").format(error=html.escape(tr(error)))
            with figs["timeline"].batch_update():
                figs["timeline"].data[0].update(x=[], y=[], text=[])
                figs["timeline"].layout.title = tr("invalid configuration")
            return
        table.value = tr(plan._repr_html_())
        shown = min(plan.optimizer_steps, MAX_TIMELINE_STEPS)
        per_epoch = plan.optimizer_steps_per_epoch
        xs = [f"e{i // per_epoch + 1}·m{i % per_epoch + 1}" for i in range(shown)]
        text = [tr("{n} waves × {rows} rows").format(n=plan.micro_batches_per_mini, rows=plan.micro_batch_wave)] * shown
        with figs["timeline"].batch_update():
            figs["timeline"].data[0].update(x=xs, y=[plan.global_mini_batch] * shown, text=text,
                                            marker={"color": [i // per_epoch for i in range(shown)],
                                                    "colorscale": "Viridis"})
            title = (tr("{n} optimizer steps = {per_epoch} per epoch × {epochs} epochs (first {shown} shown)")
                     if shown < plan.optimizer_steps else
                     tr("{n} optimizer steps = {per_epoch} per epoch × {epochs} epochs"))
            figs["timeline"].layout.title = title.format(n=plan.optimizer_steps, per_epoch=per_epoch,
                                                         epochs=plan.ppo_epochs, shown=shown)

    @on_move
    def refresh_dynamic(*_):
        budget = controls["max_token_len"].value
        parts = plan_dynamic_micro_batches(lens, budget)
        box.micro_batches = parts
        # one bar trace for every segment (each drawn from ``base``, the tokens below it in its micro-batch), so a
        # move updates two traces in place instead of rebuilding one trace per stack depth
        xs, ys, base, text, row = [], [], [], [], tr("row {i}")
        for j, p in enumerate(parts):
            below = 0
            for i in p:
                xs.append(j), ys.append(lens[i]), base.append(below), text.append(row.format(i=i))
                below += lens[i]
        with figs["dynamic"].batch_update():
            figs["dynamic"].data[0].update(x=xs, y=ys, base=base, text=text)
            figs["dynamic"].data[1].update(x=[-0.5, len(parts) - 0.5], y=[budget, budget])
            figs["dynamic"].layout.title = tr("plan_dynamic_micro_batches: {rows} rows, {tokens} tokens, budget "
                                              "{budget} → {n} micro-batches").format(
                rows=len(lens), tokens=sum(lens), budget=budget, n=len(parts))

    for k in RANGES:
        controls[k].observe(refresh_plan, names="value")
    controls["max_token_len"].observe(refresh_dynamic, names="value")
    box = W.VBox([W.HBox([W.VBox([controls[k] for k in RANGES]), table]), figs["timeline"],
                  controls["max_token_len"], figs["dynamic"]])
    box.controls, box.figures, box.record, box.table, box.seq_lens = controls, figs, rec, table, lens
    refresh_plan()
    refresh_dynamic()
    return box
