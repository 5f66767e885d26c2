"""One real training step for every registered advantage estimator and every policy-loss mode (issue 16):
the trainer wires each one end to end on the tiny model, the loss is finite and the LoRA weights move."""
import math

import pytest
import torch

from ppolab.algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from ppolab.train import resolve_config
from ppolab.trainer import PPOTrainer

from test_trainer import SMALL

ONE_STEP = [*SMALL, "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.total_training_steps=1"]
#: what each estimator or loss needs beyond the defaults (verl's own requirements)
ESTIMATOR_NEEDS = {
    "gae": ["critic.enable=true", "critic.ppo_micro_batch_size_per_gpu=4"],
    "gdpo": ["algorithm.gdpo_reward_keys=[acc,format]"],  # the arith reward's two components
    "optimal_token_baseline": ["actor_rollout_ref.actor.calculate_sum_pi_squared=true"],
    "tir_optimal_token_baseline": ["actor_rollout_ref.actor.calculate_sum_pi_squared=true"],
}
LOSS_NEEDS = {"dro": ["actor_rollout_ref.actor.policy_loss.dro_beta=0.1"]}


def one_step(overrides):
    trainer = PPOTrainer(resolve_config("grpo_tiny", [*ONE_STEP, *overrides]))
    before = [p.detach().clone() for p in trainer.models.actor_parameters()]
    metrics, batch, *_ = trainer.step()
    moved = max(float((p.detach() - b).abs().max()) for p, b in zip(trainer.models.actor_parameters(), before))
    return metrics, batch, moved


#: Trained by default; the other estimators are behind the ``slow`` marker (about 2 min on 2 cores; .ci/run runs it).
DEFAULT_ESTIMATORS = ("gae", "grpo")


@pytest.mark.parametrize("estimator", [e if e in DEFAULT_ESTIMATORS else pytest.param(e, marks=pytest.mark.slow)
                                       for e in sorted(ADV_ESTIMATOR_REGISTRY)])
def test_every_estimator_trains_one_step(estimator):
    metrics, batch, moved = one_step([f"algorithm.adv_estimator={estimator}", *ESTIMATOR_NEEDS.get(estimator, [])])
    assert torch.isfinite(batch["advantages"][batch["response_mask"].bool()]).all()
    assert math.isfinite(metrics["actor/pg_loss"]) and moved > 0, (estimator, metrics["actor/pg_loss"], moved)
    if estimator == "remax":  # the greedy baseline was generated and scored for every trajectory
        assert batch["reward_baselines"].shape == (len(batch),)
    if "optimal_token_baseline" in estimator:
        m = batch["response_mask"].bool()
        assert ((batch["sum_pi_squared"][m] > 0) & (batch["sum_pi_squared"][m] <= 1 + 1e-6)).all()


@pytest.mark.parametrize("mode", sorted(POLICY_LOSS_REGISTRY))
def test_every_loss_mode_trains_one_step(mode):
    metrics, _, moved = one_step([f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}", *LOSS_NEEDS.get(mode, [])])
    assert math.isfinite(metrics["actor/pg_loss"]) and moved > 0, (mode, metrics["actor/pg_loss"], moved)
