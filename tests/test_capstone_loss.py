"""Lab 17 part II: the learner's losses graded by what they do (ppolab.numbers.capstone_loss).

The reference solution (labs/solutions/17_loss.py, plain torch) passes all three grades; each of ten plausible wrong
losses fails at the first grade that can see it — (a)'s stage named in FIRST_STAGE — with a line naming the part."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ppolab.algos.policy_loss import POLICY_LOSS_REGISTRY
from ppolab.numbers import capstone_loss as cl

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("solutions_17_loss", ROOT / "labs" / "solutions" / "17_loss.py")
sol = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sol)


def test_the_reference_passes_every_hidden_case():
    a = cl.grade_hidden(*sol.loss_set())
    assert a["ok"], a["line"]
    stages = {c.stage for c in cl.hidden_cases()}
    assert stages == set(cl.STAGES) - {"metrics"} and a["cases"] == len(cl.hidden_cases())


@pytest.mark.parametrize("mistake", sorted(sol.FIRST_STAGE))
def test_a_wrong_loss_fails_at_the_first_stage_that_sees_it(mistake):
    a = cl.grade_hidden(*sol.loss_set(mistake))
    assert not a["ok"] and a["stage"] == sol.FIRST_STAGE[mistake], a["line"]
    assert a["line"].startswith("(a) not yet") and cl.STAGES[a["stage"]] in a["line"]


def test_hidden_cases_exercise_what_their_stage_names():
    import torch

    cases = cl.hidden_cases()
    assert any(c.info.dp_size == 2 for c in cases) and any(c.info.batch_num_tokens for c in cases)
    assert any((c.t["response_mask"].sum(-1) == 0).any() for c in cases if c.stage == "mask")
    dual = [c for c in cases if c.stage == "dual clip"]
    assert all(((c.t["advantages"] < 0) & (torch.exp(c.t["log_prob"] - c.t["old_log_prob"]) > 1.5)).any()
               for c in dual)
    assert cl.hidden_cases()[0].t["log_prob"].equal(cases[0].t["log_prob"])  # the same hidden cases every call


def test_unanswered_and_wrong_forms_get_one_line():
    def empty(*args, **kwargs):
        ...

    g = cl.grade(empty, run="grpo_tiny", train=False)
    assert not g and "not answered yet" in repr(g) and "policy_loss" in repr(g)
    g = cl.grade(sol.make_policy_loss(), actor_loss=3.0, run="grpo_tiny", train=False)
    assert not g and "actor_loss is not a function" in repr(g)

    def raises(*args, **kwargs):
        raise RuntimeError("my bug")

    assert "raised RuntimeError: my bug" in cl.grade_hidden(raises)["line"]


def test_plug_in_replaces_a_learner_loss_but_never_a_builtin():
    first, second = sol.make_policy_loss(), sol.make_policy_loss()
    assert cl.plug_in(first, "learner_test") == "learner_test"
    cl.plug_in(second, "learner_test")  # a re-run cell
    assert POLICY_LOSS_REGISTRY["learner_test"] is second
    with pytest.raises(ValueError, match="one of ppolab's policy losses"):
        cl.plug_in(first, "vanilla")
    POLICY_LOSS_REGISTRY.pop("learner_test")


@pytest.mark.slow
def test_the_replayed_step_grades_the_gradient_the_worker_computes():
    b = cl.grade_replay(sol.make_policy_loss(), "ppo_fire_tiny")
    assert b["ok"] and b["rel"] <= cl.REPLAY_REL and b["tensors"] > 0, b["line"]
    wrong = cl.grade_replay(sol.make_policy_loss("sign"), "ppo_fire_tiny")
    assert not wrong["ok"] and wrong["rel"] > 1, wrong["line"]


@pytest.mark.slow
def test_the_short_run_passes_the_reference_and_refuses_a_wrong_loss(tmp_path):
    g = cl.grade(*sol.loss_set(), run="grpo_tiny")
    assert g and len(g.lines) == 3 and g.lines[2].startswith("(c) right"), repr(g)
    c = cl.grade_training(sol.make_policy_loss("sign"), root=tmp_path)
    assert not c["ok"] and "step 1 actor/pg_loss" in c["line"], c["line"]
