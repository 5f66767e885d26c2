"""Lab 16's nine mistakes (chapter §16): each reproduction differs between the mistake off and on, and its
numbers are the ones ppolab.algos / ppolab.batching / ppolab.config give for those settings."""
from __future__ import annotations

import copy

import pytest
import torch

from ppolab.algos import (
    compute_grpo_outcome_advantage,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    kl_penalty,
    masked_mean,
)
from ppolab.batching import plan_batches
from ppolab.config import ConfigNotice, load_config, validate
from ppolab.widgets import mistakes_explorer, resolve_run
from ppolab.widgets.common import actor_config, optimizer_step_batch
from ppolab.widgets.mistakes import MISTAKES, OBSERVATION_POSITIONS, reproduce

RUN = "grpo_tiny"


@pytest.fixture(scope="module")
def ctx():
    r = resolve_run(RUN)
    rec = r.step()
    k = rec.tensors["actor_log_probs"].shape[0] - 1
    return r, rec, optimizer_step_batch(rec, k)


def vanilla(r, b, **overrides):
    cfg = actor_config(r, **overrides)
    return compute_policy_loss_vanilla(b["old_log_probs"], b["log_prob"], b["advantages"], b["response_mask"],
                                       cfg.loss_agg_mode, cfg)


def test_nine_from_the_chapter():
    assert [m.number for m in MISTAKES.values()] == list(range(1, 10))
    for m in MISTAKES.values():
        assert m.title and m.section.startswith("§") and m.switch and m.what_goes_wrong
    with pytest.raises(ValueError, match="unknown mistake"):
        reproduce("nope")
    with pytest.raises(ValueError, match="1 … 9"):
        reproduce(10)


@pytest.mark.parametrize("key", list(MISTAKES))
def test_each_mistake_changes_the_result(key):
    e = reproduce(key, RUN)
    assert e.differs, (key, e.off, e.on)
    assert abs(e.off - e.on) > 1e-6 * max(1.0, abs(e.off))
    assert MISTAKES[key].reproduce(RUN).off == e.off and reproduce(MISTAKES[key].number, RUN).on == e.on


def test_1_grpo_still_runs_vanilla(ctx):
    r, _, b = ctx
    e = reproduce("grpo_loss", RUN)
    assert r.config["algorithm"]["adv_estimator"] == "grpo"
    assert e.details["loss_fn"] == "compute_policy_loss_vanilla"
    assert load_config("grpo_tiny").actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    assert e.off == pytest.approx(float(vanilla(r, b)[0]), abs=1e-12)
    cfg = actor_config(r, loss_mode="gspo")
    gspo, _ = compute_policy_loss_gspo(b["old_log_probs"], b["log_prob"], b["advantages"], b["response_mask"],
                                       cfg.loss_agg_mode, cfg)
    assert e.on == pytest.approx(float(gspo), abs=1e-12)


def test_2_ppo_kl_vs_reference_kl(ctx):
    r, _, b = ctx
    e = reproduce("ppo_kl_is_not_ref_kl", RUN)
    assert e.on == pytest.approx(vanilla(r, b)[1]["actor/ppo_kl"], abs=1e-12)
    ref = masked_mean(kl_penalty(b["log_prob"], b["ref_log_prob"], "k1"), b["response_mask"])
    assert e.off == pytest.approx(float(ref), abs=1e-9)
    assert e.off > 10 * abs(e.on)  # late in training π_θ is far from π_ref, one update is close to π_old


def test_3_kl_counted_twice():
    e = reproduce("kl_twice", RUN)
    assert (e.off, e.on) == (0.0, 1.0)
    with pytest.warns(ConfigNotice, match="both KL paths"):
        load_config("grpo_tiny", ["algorithm.use_kl_in_reward=true"])
    assert e.details["mean_reward_shift"] > 0 and e.details["loss_side_term"] > 0
    assert not torch.equal(*e.pair)


def test_4_micro_batch_normalisation(ctx):
    r, _, _b = ctx
    e = reproduce("micro_is_not_the_batch", RUN)
    assert e.off == pytest.approx(e.details["mini_batch_loss"], abs=1e-7)
    assert e.on == pytest.approx(e.details["n_micro"] * e.off, rel=0.05)  # equal-length micro-batches
    a = r.config["actor_rollout_ref"]["actor"]
    plan = plan_batches(16, 8, a["ppo_mini_batch_size"], 1, a["ppo_micro_batch_size_per_gpu"], a["ppo_epochs"])
    assert e.details["optimizer_steps"] == plan.optimizer_steps == 4
    assert e.details["steps_if_micro_were_batch"] == 8


def test_5_forgetting_rollout_n(ctx):
    _, rec, _ = ctx
    e = reproduce("forget_rollout_n", RUN)
    assert e.off == plan_batches(16, 8, 8, 1, 32, 2).optimizer_steps == rec.tensors["actor_log_probs"].shape[0]
    assert e.on == 8 * e.off
    assert e.details["recorded_rows_per_step"] == [64] * 4


def test_6_epochs_update_the_policy(ctx):
    r, _, b = ctx
    e = reproduce("epochs_are_updates", RUN)
    assert e.off == pytest.approx(vanilla(r, b)[1]["actor/ppo_kl"], abs=1e-12)
    assert e.on == 0.0 and e.details["pg_clipfrac_on"] == 0.0 and e.details["pg_clipfrac_off"] > 0


def test_7_agg_mode(ctx):
    r, _, b = ctx
    e = reproduce("agg_mode_weights", RUN)
    assert e.off == pytest.approx(float(vanilla(r, b, loss_agg_mode="token-mean")[0]), abs=1e-12)
    assert e.on == pytest.approx(float(vanilla(r, b, loss_agg_mode="seq-mean-token-mean")[0]), abs=1e-12)
    w_tm, w_sm = e.pair
    assert float(w_tm.sum()) == pytest.approx(1.0) and float(w_sm.sum()) == pytest.approx(1.0)
    assert torch.allclose(w_sm, torch.full_like(w_sm, 1 / len(w_sm)))
    assert not torch.allclose(w_tm, w_sm)


def test_8_tool_observations_real_on_the_tool_run():
    # grpo_tool_tiny: the calculator's observations are attended (response_attention_mask 1) but not trained
    # (response_mask 0); the mistake leaves them in the mask with the GRPO advantage recomputed on it
    r = resolve_run("grpo_tool_tiny")
    rec = r.step()
    k = rec.tensors["actor_log_probs"].shape[0] - 1
    b = optimizer_step_batch(rec, k)
    e = reproduce("tool_obs_as_action", r)
    t = rec.tensors
    obs = t["response_attention_mask"][b["rows"]].float() * (1 - t["response_mask"][b["rows"]].float())
    assert not e.details["simulated"] and e.details["observation_tokens"] == int(obs.sum()) > 0
    assert e.off == 0.0 and e.on > 0
    cfg = actor_config(r)
    loss, _ = compute_policy_loss_vanilla(b["old_log_probs"], b["log_prob"], b["advantages"], b["response_mask"],
                                          cfg.loss_agg_mode, cfg)
    assert e.details["pg_loss_off"] == pytest.approx(float(loss), abs=1e-12)   # the run's own loss
    mask_on = b["response_mask"] + obs
    full = t["response_mask"].float().clone()
    full[b["rows"]] = mask_on
    adv_on, _ = compute_grpo_outcome_advantage(t["token_level_rewards"].float(), full, t["uid"].tolist())
    lp_on = torch.where(obs > 0, t["actor_log_probs"][k][b["rows"]].float(), b["log_prob"])
    loss_on, _ = compute_policy_loss_vanilla(b["old_log_probs"], lp_on, adv_on[b["rows"]], mask_on,
                                             cfg.loss_agg_mode, cfg)
    assert e.details["pg_loss_on"] == pytest.approx(float(loss_on), abs=1e-12)
    # the advantage reaches every observation token of a trajectory with signal, and only those get gradient
    with_signal = (adv_on[b["rows"]].abs() * obs).sum(-1) > 0
    assert e.on == float(obs[with_signal].sum())


def test_8_tool_observations_what_if_without_tool_turns(ctx):
    # a run without tool turns: the first two response tokens play the observation (what-if, synthetic)
    r, _, b = ctx
    e = reproduce("tool_obs_as_action", RUN)
    assert e.details["simulated"] and e.off == 0.0 and e.on > 0
    obs = torch.zeros_like(b["response_mask"])
    obs[:, OBSERVATION_POSITIONS] = 1.0
    cfg = actor_config(r)
    masked = b["response_mask"] * (1 - obs * b["response_mask"])
    loss, _ = compute_policy_loss_vanilla(b["old_log_probs"], b["log_prob"], b["advantages"], masked,
                                          cfg.loss_agg_mode, cfg)
    assert e.details["pg_loss_off"] == pytest.approx(float(loss), abs=1e-12)
    assert e.details["pg_loss_on"] == pytest.approx(float(vanilla(r, b)[0]), abs=1e-12)


def test_8_rejected_tokens_are_not_tool_observations():
    # ppo_fire_tiny records response_attention_mask, and rejection sampling zeroed tokens of response_mask that stay
    # attended: they are not tool output (loss_mask keeps them), so the run still falls back to the what-if
    r = resolve_run("ppo_fire_tiny")
    rec = r.step(12)
    t = rec.tensors
    assert (t["response_attention_mask"] - t["response_mask"]).sum() > 0        # rejected, still attended
    k = t["actor_log_probs"].shape[0] - 1
    b = optimizer_step_batch(rec, k)
    e = reproduce("tool_obs_as_action", r, 12, k)
    assert e.details["simulated"] and e.off == 0.0 and e.on > 0
    first_two = torch.zeros_like(b["response_mask"])
    first_two[:, OBSERVATION_POSITIONS] = 1.0
    assert e.details["observation_tokens"] == int((first_two * b["response_mask"]).sum())


def test_9_clip_cannot_create_signal(ctx):
    r, _, b = ctx
    e = reproduce("clip_without_advantage", RUN)
    assert e.off == pytest.approx(float(vanilla(r, b)[0]), abs=1e-12)
    assert e.on == pytest.approx(float(vanilla(r, b, clip_ratio=0.1)[0]), abs=1e-12)
    d = e.details
    assert d["zero_advantage_rows"] > 0
    assert d["zero_advantage_rows_with_gradient_off"] == d["zero_advantage_rows_with_gradient_on"] == 0
    assert d["rows_with_gradient_off"] == d["rows_with_gradient_on"] == d["rows"] - d["zero_advantage_rows"]


def test_validate_notice_is_real():
    cfg = copy.deepcopy(resolve_run(RUN).ppo_config())
    cfg.algorithm.use_kl_in_reward = True
    assert any("both KL paths" in n for n in validate(cfg))


@pytest.mark.parametrize("run", ["grpo_tiny", "ppo_gae_tiny"])
def test_explorer_sweep(run):
    w = mistakes_explorer(run)
    assert set(w.controls) == {"mistake", "on"} and set(w.figures) == {"effect", "detail"}
    for _, key in w.controls["mistake"].options:
        w.controls["mistake"].value = key
        for on in (True, False):
            w.controls["on"].value = on
            e = w.state["effect"]
            assert w.state["mistake"] == key and w.state["on"] is on
            assert list(w.figures["effect"].data[0].y) == [e.off, e.on]
    with pytest.raises(ValueError, match="mistake must be"):
        mistakes_explorer(run, mistake="nope")
