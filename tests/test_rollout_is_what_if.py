"""Exercise 02.5's what-if (chapter §3, §5): the IS weights stage 7 would make at another threshold, and the loss
they give — on the shipped vLLM bf16 run, and refused in one line on a run whose engine agrees with its trainer."""
from __future__ import annotations

import pytest
import torch

from ppolab.numbers import rollout_is
from ppolab.numbers.needs import RunLacks
from ppolab.run.reader import resolve_run

RUN = "grpo_tiny_vllm_bf16"


def test_the_weights_at_the_runs_own_threshold_are_the_recorded_ones():
    r = resolve_run(RUN)
    s = rollout_is.is_weighted_step(r)
    recorded = r.step(s).tensors["rollout_is_weights"]
    assert torch.allclose(rollout_is.is_weights_at(r, s), recorded, rtol=0, atol=1e-6)


def test_the_tighter_threshold_binds_on_some_tokens_and_changes_the_loss():
    r = resolve_run(RUN)
    s = rollout_is.is_weighted_step(r)
    c = rollout_is.tighter_is_threshold(r, s)
    t = r.step(s).tensors
    w = rollout_is.is_weights_at(r, s, c)[t["response_mask"].bool()]
    assert 1.0 < c < 2.0 and 0.01 < float((w >= c - 1e-9).float().mean()) < 0.2
    assert rollout_is.pg_loss_is_what_if(r, s) != 0.0


def test_a_run_whose_engine_agrees_with_its_trainer_lacks_the_what_if(monkeypatch):
    """With every weight exactly 1, no truncation binds and 0 would be the answer to any threshold: the exercise says
    what the run lacks instead of grading a question with no content."""
    monkeypatch.setattr(rollout_is.algos, "raw_is_weights",
                        lambda old, rollout, mask, level: (torch.ones_like(mask), None))
    with pytest.raises(RunLacks, match="rollout IS weights above 1.001"):
        rollout_is.tighter_is_threshold(RUN)
    with pytest.raises(RunLacks):
        rollout_is.pg_loss_is_what_if(RUN)
