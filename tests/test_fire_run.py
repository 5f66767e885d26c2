"""The shipped ``data/runs/ppo_fire_tiny`` really fires every mechanism the labs teach (design rule: a lab's run
must make its mechanism fire). Asserts on the shipped files only, so a regenerated run that stops firing fails."""
import pytest

import ppolab
from ppolab.widgets.common import SHIPPED_RUNS


@pytest.fixture(scope="module")
def run():
    return ppolab.load_run(SHIPPED_RUNS["ppo_fire_tiny"])


@pytest.fixture(scope="module")
def steps(run):
    m = run.metrics
    return m[m.index > 0]  # row 0 holds the validation before training


def test_recorded_with_two_ranks_and_enough_recorded_steps(run, steps):
    assert run.info["world_size"] == 2 and run.config["trainer"]["experiment_name"] == "ppo_fire_tiny"
    assert len(steps) == run.config["trainer"]["total_training_steps"]
    assert 10 <= len(run.steps) <= 20


def test_the_clip_and_the_dual_clip_bind(steps):
    assert steps["actor/pg_clipfrac"].median() >= 0.03
    assert (steps["actor/pg_clipfrac_lower"] > 0).mean() >= 0.10


def test_the_value_clip_binds_on_most_steps(run, steps):
    assert run.config["algorithm"]["adv_estimator"] == "gae" and run.config["critic"]["cliprange_value"] < 0.5
    assert (steps["critic/vf_clipfrac"] > 0).mean() > 0.5


def test_the_adaptive_reward_kl_controller_moves_its_coefficient(run, steps):
    alg = run.config["algorithm"]
    assert alg["use_kl_in_reward"] and alg["kl_ctrl"]["type"] == "adaptive"
    beta = steps["actor/reward_kl_penalty_coeff"]
    assert beta.notna().all() and beta.iloc[0] == pytest.approx(alg["kl_ctrl"]["kl_coef"])
    assert beta.max() / beta.min() >= 2


def test_both_kl_paths_and_the_entropy_bonus_are_on(run, steps):
    actor = run.config["actor_rollout_ref"]["actor"]
    assert actor["use_kl_loss"] and run.config["algorithm"]["use_kl_in_reward"]  # chapter §7.4, deliberately
    assert actor["entropy_coeff"] > 0
    assert steps["actor/kl_loss"].notna().all() and (steps["actor/reward_kl_penalty"] > 0).any()


def test_recorded_steps_hold_synthetic_padding_rows(run):
    assert run.info["batch_plan"]["padding_rows"] > 0
    for k in run.steps:
        rec = run.step(k)
        pad = rec["is_pad"].bool()
        assert pad.sum() == run.info["batch_plan"]["padding_rows"], k
        assert (rec["response_mask"][pad] == 0).all() and (rec["loss_mask"][pad] == 0).all()


def test_rejection_sampling_is_configured_and_measured(run, steps):
    rc = run.config["algorithm"]["rollout_correction"]
    assert rc["rollout_rs"] and rc["rollout_rs_threshold"] is not None
    frac = steps["rollout_corr/rollout_rs_masked_fraction"]
    assert frac.notna().all()
    assert (frac > 0).any()  # the bf16 rollout / fp32 trainer gap is real, so some tokens were rejected
    rec = run.step(run.steps[0])  # rejected tokens leave response_mask but stay in loss_mask (verl V1)
    assert (rec["response_mask"] <= rec["loss_mask"]).all()


def test_it_still_learns(run):
    s = run.summary
    assert s["val_after"]["val/accuracy"] - s["val_before"]["val/accuracy"] >= 0.20
