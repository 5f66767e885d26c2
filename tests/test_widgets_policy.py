"""The policy-side and KL explorers (labs 03–06, 08): built on the shipped runs, driven through their
controls, and every displayed number checked against ppolab.algos."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ppolab.algos import (
    POLICY_LOSS_REGISTRY,
    AdaptiveKLController,
    compute_policy_loss_vanilla,
    kl_penalty,
    masked_mean,
    ppo_clip_terms,
    ppo_loss,
)
from ppolab.widgets import (
    clip_explorer,
    dual_clip_explorer,
    kl_explorer,
    loss_assembly,
    ratio_explorer,
    resolve_run,
)
from ppolab.widgets.common import actor_config, optimizer_step_batch

from helpers import sweep_all

RUNS = ["grpo_tiny", "ppo_gae_tiny"]


@pytest.fixture(scope="module", params=RUNS)
def run(request):
    return resolve_run(request.param)


def test_actor_config_follows_the_run(run):
    cfg = actor_config(run)
    raw = run.config["actor_rollout_ref"]["actor"]
    assert cfg.clip_ratio == raw["clip_ratio"] and cfg.clip_ratio_c == raw["clip_ratio_c"]
    assert cfg.policy_loss.loss_mode == raw["policy_loss"]["loss_mode"]


def test_optimizer_step_batch_rows_are_the_mini_batch(run):
    rec = run.step(1)
    plan = rec.info["batch_plan"]
    b = optimizer_step_batch(rec, 0)
    assert len(b["rows"]) == plan["global_mini_batch"]
    assert not torch.isnan(b["log_prob"]).any()


def test_ratio_explorer_matches_algos(run):
    w = ratio_explorer(run, 5, row=2, token=1)
    t = w.record.tensors
    cfg = actor_config(run)
    for k in range(t["actor_log_probs"].shape[0]):
        w.controls["opt_step"].value = k
        expect = ppo_clip_terms(
            t["old_log_probs"],
            t["actor_log_probs"][k],
            torch.zeros_like(t["old_log_probs"]),
            cfg.clip_ratio,
            cfg.clip_ratio,
        )["ratio"]
        shown = torch.tensor(w.figures["row"].data[0].y, dtype=torch.float32)
        torch.testing.assert_close(shown, expect[2], equal_nan=True)
        if not math.isnan(w.state["ratio"]):
            assert w.state["ratio"] == pytest.approx(expect[2, 1].item())
    ro = t["rollout_log_probs"][2, 1].double()
    assert w.state["old_over_rollout"] == pytest.approx(
        math.exp(t["old_log_probs"][2, 1].double() - ro), rel=1e-5
    )
    # the synthetic axis shows the ±20 clamp
    xs, ys = np.array(w.figures["clamp"].data[0].x), np.array(w.figures["clamp"].data[0].y)
    assert ys[xs > 20].max() == pytest.approx(math.exp(20.0), rel=1e-6)
    assert ys[xs < -20].min() == pytest.approx(math.exp(-20.0), rel=1e-6)
    # the drift boxes: one per optimizer step
    assert len(w.figures["drift"].data) == t["actor_log_probs"].shape[0] + 1
    sweep_all(w, n=4)


def test_ratio_explorer_rejects_bad_arguments():
    with pytest.raises(KeyError):
        ratio_explorer("grpo_tiny", step=3)
    with pytest.raises(ValueError, match="0 … 127"):
        ratio_explorer("grpo_tiny", row=128)
    with pytest.raises(ValueError, match="token"):
        ratio_explorer("grpo_tiny", token=-1)
    with pytest.raises(ValueError, match="opt_step"):
        ratio_explorer("grpo_tiny", opt_step=4)
    assert ratio_explorer("grpo_tiny", row=np.int64(5)).controls["row"].value == 5


def test_clip_explorer_clipfrac_equals_vanilla_metric(run):
    w = clip_explorer(run, 50)
    for low, high, k in [(0.1, 0.2, 0), (0.2, 0.28, 1), (0.01, 0.01, 3), (0.5, 0.9, 2)]:
        w.controls["eps_low"].value, w.controls["eps_high"].value, w.controls["opt_step"].value = low, high, k
        b = optimizer_step_batch(w.record, k)
        cfg = actor_config(run, clip_ratio_low=low, clip_ratio_high=high)
        _, metrics = compute_policy_loss_vanilla(
            b["old_log_probs"], b["log_prob"], b["advantages"], b["response_mask"], "token-mean", cfg
        )
        assert w.state["pg_clipfrac"] == pytest.approx(metrics["actor/pg_clipfrac"])
        shown_clipped = len(w.figures["batch"].data[1].x)
        shown_total = shown_clipped + len(w.figures["batch"].data[0].x)
        assert shown_total == w.state["n_tokens"]
        assert shown_clipped / shown_total == pytest.approx(metrics["actor/pg_clipfrac"], abs=1e-6)
        # a clipped token never has a gradient (dual clip aside, which only zeroes more)
        assert not (w.state["clipped"] & ~w.state["zero_grad"]).any()
    # surrogate curve: A = +1 objective is min(r, clip(r))
    w.controls["eps_low"].value, w.controls["eps_high"].value = 0.2, 0.3
    x = torch.tensor(w.figures["surrogate"].data[0].x, dtype=torch.float64)
    terms = ppo_clip_terms(torch.zeros_like(x), torch.log(x.clamp(min=1e-12)), torch.ones_like(x), 0.2, 0.3)
    np.testing.assert_allclose(w.figures["surrogate"].data[0].y, (-terms["pg_losses_clip"]).numpy())
    assert max(w.figures["surrogate"].data[0].y) == pytest.approx(1.3)
    sweep_all(w, n=4)


def test_clip_explorer_rejects_bad_eps():
    with pytest.raises(ValueError, match="eps_low"):
        clip_explorer("grpo_tiny", eps_low=1.5)


def test_dual_clip_explorer(run):
    w = dual_clip_explorer(run, 100)
    for c, s in [(1.05, 1.0), (3.0, 20.0), (2.0, 50.0)]:
        w.controls["clip_ratio_c"].value, w.controls["stretch"].value = c, s
        b = optimizer_step_batch(w.record, w.controls["opt_step"].value)
        lp = b["old_log_probs"] + s * (b["log_prob"] - b["old_log_probs"])
        cfg = actor_config(run, clip_ratio_c=c)
        _, metrics = compute_policy_loss_vanilla(
            b["old_log_probs"], lp, b["advantages"], b["response_mask"], "token-mean", cfg
        )
        assert w.state["pg_clipfrac_lower"] == pytest.approx(metrics["actor/pg_clipfrac_lower"])
        # the negative-advantage loss is bounded by -A·c
        ys = np.array(w.figures["batch"].data[0].y + w.figures["batch"].data[1].y)
        if len(ys):
            assert ys.max() <= c * float(-b["advantages"].min()) + 1e-5
        curve = np.array(w.figures["loss_curve"].data[1].y)
        assert curve.max() == pytest.approx(c)
    sweep_all(w, n=4)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        dual_clip_explorer(run, clip_ratio_c=1.0)


def test_loss_assembly_matches_ppo_loss(run):
    from ppolab.widgets.loss import DRO_BETA_SHOWN

    w = loss_assembly(run, 20)
    assert w.controls["use_kl_loss"].value == run.config["actor_rollout_ref"]["actor"]["use_kl_loss"]
    w.controls["use_kl_loss"].value = True
    w.controls["entropy_coeff"].value = 0.01
    w.controls["kl_loss_coef"].value = 0.1
    w.controls["opt_step"].value = 1
    b = optimizer_step_batch(w.record, 1)
    cfg = actor_config(run, entropy_coeff=0.01, kl_loss_coef=0.1, use_kl_loss=True)
    args = dict(old_log_prob=b["old_log_probs"], log_prob=b["log_prob"], advantages=b["advantages"],
                response_mask=b["response_mask"], entropy=b["entropy"], ref_log_prob=b["ref_log_prob"])
    loss, metrics = ppo_loss(cfg, **args)
    pg, ent, kl, total = w.figures["terms"].data[0].y
    assert total == pytest.approx(float(loss), abs=1e-6)
    assert pg == pytest.approx(metrics["actor/pg_loss"])
    assert ent == pytest.approx(-0.01 * metrics["actor/entropy_loss"])
    assert kl == pytest.approx(0.1 * metrics["actor/kl_loss"])
    assert pg + ent + kl == pytest.approx(total, abs=1e-6)
    # every registered loss runs on the same advantages
    assert list(w.figures["modes"].data[0].x) == list(POLICY_LOSS_REGISTRY)
    for mode, shown in zip(POLICY_LOSS_REGISTRY, w.figures["modes"].data[0].y):
        c = actor_config(run, entropy_coeff=0.01, kl_loss_coef=0.1, use_kl_loss=True, loss_mode=mode)
        if mode == "dro":  # the run sets no dro_beta (verl's None raises): the widget shows DRO_BETA_SHOWN
            with pytest.raises(ValueError, match="dro_beta"):
                ppo_loss(c, **args)
            c.policy_loss.dro_beta = DRO_BETA_SHOWN
        with torch.random.fork_rng():  # clip_cov's random draw, seeded as the widget seeds it
            torch.manual_seed(0)
            expected = ppo_loss(c, **args)[1]["actor/pg_loss"]
        assert shown == pytest.approx(expected)
    assert not any(math.isnan(v) for v in w.figures["modes"].data[0].y)
    sweep_all(w, n=4)
    with pytest.raises(ValueError, match="vanilla"):
        loss_assembly(run, loss_mode="nope")


def test_kl_explorer_matches_algos(run):
    w = kl_explorer(run, 10)
    for name in ["k1", "k3", "k3+", "abs", "mse"]:
        w.controls["kl_type"].value = name
        d = torch.tensor(w.figures["values"].data[-1].x, dtype=torch.float64)
        np.testing.assert_allclose(
            w.figures["values"].data[-1].y, kl_penalty(d, torch.zeros_like(d), name).numpy()
        )
        grads = np.array(w.figures["grads"].data[-1].y)
        if name.endswith("+") or name in ("mse", "k2"):
            np.testing.assert_allclose(grads, d.numpy(), atol=1e-12)  # k2's gradient
        b = optimizer_step_batch(w.record, w.controls["opt_step"].value)
        expect = masked_mean(kl_penalty(b["log_prob"], b["ref_log_prob"], name), b["response_mask"])
        assert w.state["loss_side"] == pytest.approx(float(expect), rel=1e-5, abs=1e-7)
    # reward-side with the run's own estimator equals the logged metric of a reward-side run
    if run.config["algorithm"]["use_kl_in_reward"]:
        w.controls["kl_type"].value = run.config["algorithm"]["kl_penalty"]
        assert w.state["reward_side"] == pytest.approx(
            run.metrics.loc[10, "actor/reward_kl_penalty"], rel=1e-5
        )
    # adaptive controller replay: on the training steps that logged the series (the validation-only step 0 is no
    # update), one controller update per step
    w.controls["target_kl"].value, w.controls["horizon"].value = 0.01, 1000.0
    logged = run.metrics[w.controls["series"].value].dropna().astype(float)
    assert 0 not in logged.index and list(w.figures["controller"].data[0].x) == [int(s) for s in logged.index]
    ctrl = AdaptiveKLController(w.controls["init_kl_coef"].value, 0.01, 1000.0)
    betas = []
    for kl in logged.tolist():
        betas.append(ctrl.value)
        ctrl.update(kl, w.state["n_steps"])
    np.testing.assert_allclose(w.figures["controller"].data[0].y, betas)
    sweep_all(w, n=4)
    # with a reward-side KL: on the run whose controller is adaptive, at its own kl_ctrl settings, the explorer's β is
    # the β that run logged, step for step (adaptive_kl_trace)
    if run.config["algorithm"]["use_kl_in_reward"]:
        from ppolab.widgets.kl import adaptive_kl_trace

        fire = resolve_run("ppo_fire_tiny")
        assert fire.config["algorithm"]["kl_ctrl"]["type"] == "adaptive"
        wf, trace = kl_explorer(fire, series="actor/reward_kl_penalty"), adaptive_kl_trace(fire)
        assert list(wf.figures["controller"].data[0].x) == trace["steps"]
        np.testing.assert_allclose(wf.figures["controller"].data[0].y, trace["beta"], rtol=1e-12)
        np.testing.assert_allclose(wf.figures["controller"].data[2].y, trace["beta"], rtol=0)


def test_kl_explorer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="k3"):
        kl_explorer("grpo_tiny", kl_type="full")
    with pytest.raises(ValueError, match="series"):
        kl_explorer("grpo_tiny", series="actor/reward_kl_penalty")


def test_the_clip_explorer_fires_on_a_run_whose_own_clip_never_binds(trained_run):
    """Lab 04 on a fresh ppo_gae_tiny run (ε = 0.2: no recorded optimizer step clips a token): the explorer still
    opens, at the optimizer step that moved furthest, with a narrower ε at which tokens do clip, and says so in one
    line; on ppo_fire_tiny it opens on its own case at the run's ε."""
    from helpers import FRESH

    from ppolab.numbers.cases import clip_case, clip_fire_case, fire_line
    from ppolab.numbers.needs import RunLacks

    run = trained_run("ppo_gae_tiny", FRESH)
    with pytest.raises(RunLacks):
        clip_case(run)
    case = clip_fire_case(run)
    assert case["narrowed"] and 0.01 <= case["eps"] < case["run_eps"] == 0.2
    assert "ε = 0.2" in fire_line(case) and f"ε = {case['eps']}" in fire_line(case)
    w = clip_explorer(run, step=case["step"], opt_step=case["opt_step"], eps_low=case["eps"], eps_high=case["eps"])
    assert w.state["n_clipped"] > 0
    w.controls["eps_low"].value = w.controls["eps_high"].value = 0.2  # the run's own ε: nothing clips
    assert w.state["n_clipped"] == 0
    shipped = clip_fire_case("ppo_fire_tiny")
    assert not shipped["narrowed"] and shipped["eps"] is None and fire_line(shipped) is None
