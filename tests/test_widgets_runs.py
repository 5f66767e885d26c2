"""The run-side explorers (value clip, masks, aggregation, batches, metrics, live training; labs 00–02, 07, 09–12,
15): built on the shipped runs, driven through their controls, every displayed number checked against
ppolab.algos / ppolab.batching."""
from __future__ import annotations

import math
import tempfile

import numpy as np
import pytest
import torch

from ppolab.algos import LOSS_AGG_MODES, agg_loss, compute_value_loss
from ppolab.batching import plan_batches, plan_dynamic_micro_batches
from ppolab.widgets import (
    aggregation_explorer,
    batch_calculator,
    live_training,
    mask_viewer,
    metrics_dashboard,
    resolve_run,
    value_clip_explorer,
)
from ppolab.widgets.aggregation import LOSS_SOURCES
from ppolab.widgets.metrics import METRIC_MEANINGS, meaning, warning_signs

from helpers import sweep_all, sweep_values

RUNS = ["grpo_tiny", "ppo_gae_tiny"]


# ---------------------------------------------------------------------------------------------------- value clip
def test_value_clip_matches_compute_value_loss():
    w = value_clip_explorer()
    t = w.record.tensors
    for update in range(t["critic_vpreds"].shape[0]):
        w.controls["update"].value = update
        for eps in (0.0, 0.05, 0.2, 0.5, 2.0):
            w.controls["cliprange_value"].value = eps
            vp, g, v, m, _ = w.batch(update)
            loss, frac = compute_value_loss(vp, g, v, m, eps, "token-mean")
            assert w.figures["summary"].data[0].y == pytest.approx([float(loss), float(frac)])
            # per-token bars: ½(V−G)² unclipped and the loss actually used, whose token mean is vf_loss
            keep = m.bool()
            unclipped = compute_value_loss(vp, g, v, m, math.inf, "token-mean")[0]
            assert np.mean(w.figures["tokens"].data[0].y) == pytest.approx(float(unclipped), rel=1e-5)
            assert np.mean(w.figures["tokens"].data[1].y) == pytest.approx(float(loss), rel=1e-5)
            assert len(w.figures["tokens"].data[1].y) == int(keep.sum())
    # clipping only ever raises the loss, and some tokens are clipped at a small ε_v after updates
    w.controls["cliprange_value"].value = 0.0
    assert w.result["vf_clipfrac"] > 0
    assert all(c >= u - 1e-7 for u, c in zip(w.result["unclipped"], w.result["clipped"]))
    sweep_all(w)


def test_value_clip_rejects_bad_arguments():
    with pytest.raises(ValueError, match="critic"):
        value_clip_explorer("grpo_tiny")
    with pytest.raises(ValueError, match="update"):
        value_clip_explorer(update=99)
    with pytest.raises(ValueError, match="cliprange_value"):
        value_clip_explorer(cliprange_value=-1)
    with pytest.raises(ValueError, match="step"):
        value_clip_explorer(step=2)


# ---------------------------------------------------------------------------------------------------- masks
@pytest.mark.parametrize("run", RUNS)
def test_mask_viewer_categories_and_shift(run):
    w = mask_viewer(run)
    t = w.record.tensors
    P, R = t["prompts"].shape[1], t["responses"].shape[1]
    z = np.array(w.figures["tokens"].data[0].z)
    rows = list(w.controls["rows"].value)
    assert z.shape == (len(rows), P + R)
    assert (z[:, :P] == t["prompt_mask"][rows].numpy()).all()
    assert (z[:, P:] == 2 * t["response_mask"][rows].numpy()).all()
    # the shift: logits at P−1+j predict response token j, and the first response token is predicted by the
    # last prompt position
    cells = w.figures["shift"].data[0].cells.values
    assert list(cells[1]) == [P - 1 + j for j in range(R)]
    tok = w.tokenizer
    row = w.controls["row"].value
    assert cells[3][0] == tok.decode([int(t["responses"][row, 0])])
    assert cells[2][0] == tok.decode([int(t["prompts"][row, -1])])
    w.controls["rows"].value = (0, 5, 7)
    assert len(w.figures["tokens"].data[0].z) == 3
    for r in (0, len(w.controls["row"].options) - 1):
        w.controls["row"].value = r
    with pytest.raises(ValueError, match="rows"):
        mask_viewer(run, rows=[10_000])


def test_mask_viewer_synthetic_padding_row():
    from ppolab.widgets.masks import token_categories

    rec = resolve_run("grpo_tiny").step(1)
    fake = type(rec)(rec.step, {**rec.tensors, "is_pad": torch.zeros_like(rec.tensors["is_pad"])}, rec.info)
    fake.tensors["is_pad"][3] = 1
    cats = token_categories(fake)
    assert (cats[3] == 3).all() and not (cats[:3] == 3).any()


# ---------------------------------------------------------------------------------------------------- aggregation
@pytest.mark.parametrize("run", RUNS)
def test_aggregation_totals_and_weights(run):
    w = aggregation_explorer(run)
    t = w.record.tensors
    keep = ~t["is_pad"].bool()
    mask = t["response_mask"][keep].double()
    for source in LOSS_SOURCES:
        w.controls["loss"].value = source
        for factor in (1, 9, w.controls["loss_scale_factor"].max):
            w.controls["loss_scale_factor"].value = factor
            mat = LOSS_SOURCES[source](t)[keep].double()
            expect = [float(agg_loss(mat, mask, mode, loss_scale_factor=factor
                                     if mode == "seq-mean-token-sum-norm" else None)) for mode in LOSS_AGG_MODES]
            assert list(w.figures["totals"].data[0].y) == pytest.approx(expect, rel=1e-9, abs=1e-12)
    # weights: with ℓ ≡ 1, token-mean weighs a trajectory by its length share, seq-mean-token-mean equally
    w.controls["loss"].value = "ones"
    lengths = mask.sum(-1)
    by_mode = {tr.name: np.array(tr.y) for tr in w.figures["weights"].data}
    k = len(by_mode["token-mean"])
    assert by_mode["token-mean"] == pytest.approx((lengths / lengths.sum())[:k].numpy())
    nonempty = (lengths > 0).double()
    assert by_mode["seq-mean-token-mean"] == pytest.approx((nonempty / nonempty.sum())[:k].numpy(), rel=1e-6)
    sweep_all(w)
    with pytest.raises(ValueError, match="loss"):
        aggregation_explorer(run, loss="nope")


# ---------------------------------------------------------------------------------------------------- batches
def test_batch_calculator_plan_and_errors():
    w = batch_calculator()
    c = w.controls
    for k, v in {"train_batch_size": 128, "rollout_n": 8, "ppo_mini_batch_size": 32, "dp_size": 8,
                     "ppo_micro_batch_size_per_gpu": 2, "ppo_epochs": 2}.items():
        c[k].value = v
    plan = plan_batches(128, 8, 32, 8, 2, 2)
    assert w.plan == plan and w.error is None
    assert len(w.figures["timeline"].data[0].x) == plan.optimizer_steps == 8
    assert set(w.figures["timeline"].data[0].y) == {plan.global_mini_batch}
    assert "1024" in w.table.value
    c["dp_size"].value = 7
    with pytest.raises(ValueError) as e:
        plan_batches(128, 8, 32, 7, 2, 2)
    assert w.plan is None and w.error == str(e.value) and len(w.figures["timeline"].data[0].x) == 0
    sweep_all(w, skip=("max_token_len",))


@pytest.mark.parametrize("run", RUNS)
def test_batch_calculator_dynamic(run):
    w = batch_calculator(run)
    ctl = w.controls["max_token_len"]
    for budget in sweep_values(ctl, 8):
        ctl.value = budget
        parts = plan_dynamic_micro_batches(w.seq_lens, budget)
        assert w.micro_batches == parts
        (bar,) = [tr for tr in w.figures["dynamic"].data if tr.type == "bar"]
        # one segment per row, drawn from the tokens below it in its micro-batch: the stack tops are the sums
        x, y, base = (np.asarray(v) for v in (bar.x, bar.y, bar.base))
        assert len(x) == len(w.seq_lens)
        totals = [int((base + y)[x == j].max()) for j in range(len(parts))]
        assert totals == [sum(w.seq_lens[i] for i in p) for p in parts]
        assert all(int(base[x == j].min()) == 0 for j in range(len(parts)))
        assert max(totals) <= budget
    with pytest.raises(ValueError, match="dp_size"):
        batch_calculator(run, dp_size=0)
    with pytest.raises(ValueError, match="unknown size"):
        batch_calculator(run, micro=2)


# ---------------------------------------------------------------------------------------------------- metrics
@pytest.mark.parametrize("run", RUNS)
def test_metrics_dashboard_every_metric(run):
    w = metrics_dashboard(run)
    frame = resolve_run(run).metrics
    for name in w.controls["metric"].options:
        assert not meaning(name).startswith("(no description"), name
        w.controls["metric"].value = name
        s = frame[name].dropna()
        assert list(w.figures["metric"].data[0].y) == pytest.approx(s.tolist())
    assert w.warnings == warning_signs(run)
    with pytest.raises(ValueError, match="metric"):
        metrics_dashboard(run, metric="actor/nope")


def test_metric_meanings_cover_verl_names():
    for name in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy",
                 "actor/kl_loss", "actor/kl_coef", "actor/grad_norm", "actor/lr", "actor/reward_kl_penalty",
                 "actor/reward_kl_penalty_coeff", "critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean",
                 "critic/vf_explained_var", "val/accuracy"):
        assert name in METRIC_MEANINGS
    for family in ("critic/score", "critic/rewards", "critic/advantages", "critic/returns", "critic/values"):
        for stat in ("mean", "max", "min"):
            assert not meaning(f"{family}/{stat}").startswith("(no")
    for name in ("response_length/mean", "timing_s/gen", "perf/mfu", "training/anything", "global_seqlen/mean"):
        assert not meaning(name).startswith("(no")


def test_warning_signs_on_shipped_and_doctored_runs():
    assert warning_signs("grpo_tiny") == []
    assert warning_signs("ppo_gae_tiny") == []
    assert warning_signs("grpo_tiny_vllm_bf16") == []  # a real bf16 vLLM gap (~1e-3) is not a warning sign
    stale = resolve_run("grpo_tiny_vllm_bf16").metrics.copy()
    stale.loc[12, "training/rollout_probs_diff_mean"] = 0.05  # as if the engine had kept an old adapter version
    assert ["training/rollout_probs_diff_mean high (max 0.05 at step 12" in w for w in warning_signs(stale)] == [True]
    m = resolve_run("ppo_gae_tiny").metrics.copy()
    m["actor/pg_clipfrac"] = 0.5
    m["actor/ppo_kl"] = 0.3
    m.loc[m.index[-20:], "actor/entropy"] = 1e-3
    m.loc[50, "actor/grad_norm"] = 1e4
    m["response_length/clip_ratio"] = 0.9
    m["critic/vf_explained_var"] = -0.5
    m["critic/vf_clipfrac"] = 0.6
    m.loc[60, "actor/pg_loss"] = float("nan")
    found = "\n".join(warning_signs(m))
    for name in ("actor/pg_clipfrac persistently high", "actor/ppo_kl large", "actor/entropy collapsed",
                 "actor/grad_norm spikes", "response_length/clip_ratio high", "critic/vf_clipfrac high",
                 "critic/vf_explained_var negative", "actor/pg_loss is not finite"):
        assert name in found, name
    assert len(warning_signs(m)) == 8
    assert warning_signs(m, {"pg_clipfrac_high": 0.9}) != warning_signs(m)
    with pytest.raises(ValueError, match="thresholds"):
        warning_signs(m, {"nope": 1})


# ---------------------------------------------------------------------------------------------------- live
def test_live_training_two_steps():
    with tempfile.TemporaryDirectory() as d:
        seen = []
        w = live_training(overrides=[
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "data.val_max_samples=16",
            "trainer.total_training_steps=2", f"trainer.run_dir={d}"], on_step=lambda s, m, r: seen.append(s))
        run = w.start()
        assert seen == [0, 1, 2] and w.run is run  # step 0: the validation before training
        frame = run.metrics
        score, acc, clip = w.figures["live"].data
        assert list(score.x) == [1, 2]
        assert list(score.y) == pytest.approx(frame.loc[[1, 2], "critic/score/mean"].tolist())
        assert list(clip.y) == pytest.approx(frame.loc[[1, 2], "actor/pg_clipfrac"].tolist())
        assert list(acc.x)[0] == 0 and list(acc.y) == pytest.approx(frame["val/accuracy"].dropna().tolist())
        # one widget, one run: a second click (queued while it trained) starts nothing, and says why
        assert w.controls["start"].disabled and len(w.history) == 2
        w.controls["start"].click()
        assert w.start() is run and seen == [0, 1, 2] and len(w.history) == 2
        assert "trains one run" in w.children[0].children[1].value
    with pytest.raises(ValueError, match="metrics"):
        live_training(metrics=())


def test_step_distributions_have_the_logged_means_on_a_run_with_rejection():
    """The length distribution counts the mask as generated (loss_mask), as response_length/mean does: rejection
    zeroes tokens of response_mask after the metrics' masks are read, but does not shorten a response."""
    from ppolab.widgets.metrics import DISTRIBUTIONS, step_distributions

    r = resolve_run("ppo_fire_tiny")
    s = r.steps[0]
    t = r.step(s).tensors
    assert bool((t["loss_mask"].bool() & ~t["response_mask"].bool()).any())  # the step rejected tokens
    dist = step_distributions(r, [s])[s]
    for key, name in DISTRIBUTIONS.items():
        assert abs(float(dist[key].float().mean()) - r.metrics.loc[s, name]) < 1e-5, key
