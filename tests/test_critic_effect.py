"""The critic's half of the update (ppolab.numbers.critic_effect): the replay is the run's own critic update — its
predictions before each optimizer step are the ones the training recorded — and it shows what lab 09 teaches on real
tensors: a critic tensor moves, and a value-clipped token has no gradient of its own yet still moves."""
from __future__ import annotations

import pytest
import torch

from ppolab.numbers.critic_effect import critic_step_effect, critic_steps
from ppolab.numbers.needs import RunLacks
from ppolab.run.reader import resolve_run


def _replays_the_recorded_update(name: str) -> None:
    r = resolve_run(name)
    rec = r.step(1)
    for k in range(critic_steps(r, 1)):
        e = critic_step_effect(r, 1, k)
        seen = rec.tensors["critic_vpreds"][k].float()
        rows = torch.as_tensor(e["rows"])
        valid = ~torch.isnan(seen[rows]) & (e["mask"][rows] > 0)
        gap = (e["values_before"][rows][valid] - seen[rows][valid]).abs().max()
        assert float(gap) < 1e-5, (name, k, float(gap))  # what optimizer step k predicted, as the training did
        assert e["loss"] == pytest.approx(float(e["metrics"]["critic/vf_loss"]))
    moved = [p for p in critic_step_effect(r, 1, 0)["params"] if p["name"].startswith("value_head")]
    assert moved and all(p["delta_norm"] > 0 for p in moved)  # the value head leaves its seeded start


def test_the_critic_replay_is_the_recorded_update():
    _replays_the_recorded_update("ppo_gae_tiny")


@pytest.mark.slow
def test_a_value_clipped_token_has_no_gradient_yet_moves():
    from ppolab.exercises.lab09 import clipped_move_case

    r = resolve_run("ppo_fire_tiny")
    _replays_the_recorded_update("ppo_fire_tiny")
    e = critic_step_effect(r, 1, clipped_move_case(r)["update"])
    clipped = e["clipped"]
    assert int(clipped.sum()) > 0
    assert float(e["coefficient"][clipped].abs().max()) == 0.0  # the clipped error is a constant in V
    moved = (e["values_after"] - e["values_before"])[clipped].abs()
    assert float(moved.max()) > 1e-4  # the shared weights moved it all the same


def test_a_run_without_a_critic_or_another_step_says_what_it_lacks():
    with pytest.raises(RunLacks, match="critic update"):
        critic_step_effect("grpo_tiny", 1, 0)
    with pytest.raises(RunLacks, match="only step 1"):
        critic_step_effect("ppo_gae_tiny", 5, 0)
