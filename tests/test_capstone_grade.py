"""Lab 17 part II: the learner's losses graded by what they do (ppolab.experiments.capstone_grade).

The reference solution (labs/solutions/17_loss.py, plain torch) passes all three grades; each of twelve plausible wrong
losses fails at the first grade that can see it — (a)'s stage named in FIRST_STAGE — with a line naming the part."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ppolab.algos.policy_loss import POLICY_LOSS_REGISTRY
from ppolab.experiments import capstone_grade as cl

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
    """(c) and (d) pass the reference losses — (d): ppo_gae_tiny's critic trained by the learner's value loss through
    ppolab.train(value_loss=…), the same critic as verl's — and refuse wrong ones; the curves are drawn."""
    g = cl.grade(*sol.loss_set(), run="grpo_tiny")
    assert g and len(g.lines) == 4 and g.lines[2].startswith("(c) right"), repr(g)
    assert g.lines[3].startswith("(d) right"), repr(g)  # the critic trained with the learner's value loss
    d = g.results["d"]
    assert d["first"]["critic/vf_clipfrac"][1] > 0.1  # the value clip binds from step 1 on: (d) can see it
    c = cl.grade_training(sol.make_policy_loss("sign"), root=tmp_path)
    assert not c["ok"] and "step 1 actor/pg_loss" in c["line"], c["line"]
    # (d) against a value clip centred on the return, and a value loss that exits: one line each (the process then
    # trains on, as the right loss's (d) above did)
    wrong = cl.grade_critic_training(sol.make_value_loss("value_clip"), root=tmp_path)
    assert not wrong["ok"] and "step 1 critic/vf_clipfrac: yours 0" in wrong["line"], wrong["line"]

    def exits(vpreds, *args, **kwargs):
        raise SystemExit(3)

    out = cl.grade_critic_training(exits, root=tmp_path)
    assert not out["ok"] and "SystemExit" in out["line"], out["line"]
    from ppolab.widgets import capstone_curves

    fig = capstone_curves(g).figures["curves"]
    assert {t.name for t in fig.data} == {"vanilla", "verl's value loss", "your run"}
    assert len(fig.data) == 2 * (len(g.results["c"]["curves"]) + len(cl.CRITIC_CURVES))


def test_train_takes_a_value_loss_only_where_it_can_stand(tmp_path):
    """ppolab.train(value_loss=…) is checked before any model loads: a function, a config with a critic, a run that
    records no step — each refusal one line naming what to pass."""
    from ppolab.train import train

    loss = sol.make_value_loss()
    base = ["trainer.total_training_steps=1", f"trainer.run_dir={tmp_path / 'r'}"]
    with pytest.raises(TypeError, match="value_loss=3"):
        train("ppo_gae_tiny", [*base, "trainer.record_freq=-1"], value_loss=3, progress=False)
    with pytest.raises(ValueError, match="trains no critic"):
        train("grpo_tiny", [*base, "trainer.record_freq=-1"], value_loss=loss, progress=False)
    with pytest.raises(ValueError, match="trainer.record_freq=-1"):
        train("ppo_gae_tiny", base, value_loss=loss, progress=False)
    assert not (tmp_path / "r").exists()
    from ppolab.widgets import capstone_curves

    with pytest.raises(TypeError, match="capstone_grade.grade"):
        capstone_curves(None)
    assert capstone_curves(cl.Grade(False, [], {})).figures == {}


# ------------------------------------------------------------------------------- the work graded is the learner's
def _dual_clip_everywhere(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                          rollout_is_weights=None, *, global_batch_info=None):
    """The dual clip's min(·, −A·c) applied to every token, A > 0 included."""
    import torch

    from ppolab.algos.aggregation import GlobalBatchInfo

    a, d = advantages, torch.clamp(log_prob - old_log_prob, -20, 20)
    r = torch.exp(d)
    l1, l2 = -a * r, -a * torch.clamp(r, 1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
    clipped = torch.maximum(l1, l2)
    loss = torch.minimum(clipped, -a * config.clip_ratio_c)
    mean = lambda x: float(sol._mmean(x.to(a.dtype), response_mask))  # noqa: E731
    return (sol.aggregate(loss, response_mask, loss_agg_mode, global_batch_info or GlobalBatchInfo()),
            {"actor/pg_clipfrac": mean(l2 > l1), "actor/ppo_kl": mean(-d.detach()),
             "actor/pg_clipfrac_lower": mean((clipped > -a * config.clip_ratio_c) & (a < 0))})


def test_a_fault_is_named_by_the_tokens_it_touches():
    a = cl.grade_hidden(_dual_clip_everywhere, *sol.loss_set()[1:])
    assert not a["ok"] and "as if the dual clip's min" in a["line"] and cl.STAGES["dual clip"] in a["line"], a["line"]
    b = cl.grade_hidden(*sol.loss_set("clip_bounds"))
    assert "clip_ratio_high sets its upper end" in b["line"], b["line"]
    c = cl.grade_hidden(*sol.loss_set("kl_placement"))
    assert "a term each token carries" in c["line"], c["line"]


def _through_registry(*args, **kwargs):
    return POLICY_LOSS_REGISTRY["vanilla"](*args, **kwargs)


def _through_algos(*args, **kwargs):
    from ppolab import algos

    return algos.compute_policy_loss_vanilla(*args, **kwargs)


def _through_a_copy(*args, **kwargs):
    from ppolab.experiments.grader_guard import REF

    return REF.vanilla(*args, **kwargs)


def _value_through_algos(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode="token-mean", *,
                         global_batch_info=None):
    from ppolab import algos

    return algos.compute_value_loss(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode,
                                    **global_batch_info.as_kwargs())


@pytest.mark.parametrize("which", ["registry", "algos", "copy", "value"])
def test_a_loss_that_calls_the_reference_is_named_and_not_right(which):
    policy, actor, value = sol.loss_set()
    if which == "value":
        value = _value_through_algos
    else:
        policy = {"registry": _through_registry, "algos": _through_algos, "copy": _through_a_copy}[which]
    a = cl.grade_hidden(policy, actor, value)
    assert not a["ok"] and "calls ppolab's own" in a["line"] and "Look at" not in a["line"], a["line"]
    assert "compute_value_loss" in a["line"] if which == "value" else "compute_policy_loss_vanilla" in a["line"]


def test_every_function_is_required_for_a_right_verdict():
    policy, actor, _ = sol.loss_set()
    try:
        g = cl.grade(policy, actor, None, run="grpo_tiny", train=False)
    finally:  # (b) plugged the loss in: the registry holds verl's names again for the tests after this one
        POLICY_LOSS_REGISTRY.pop(cl.LEARNER, None)
    assert not g and "value_loss not given" in repr(g), repr(g)
    a = cl.grade_hidden(policy)
    assert "not graded: no actor_loss and value_loss" in a["line"], a["line"]


def test_hidden_cases_reach_the_clamps():
    import torch

    cases = cl.hidden_cases()
    ratio = [c for c in cases if c.stage == "ratio clamp"]
    assert ratio and all(((c.t["log_prob"] - c.t["old_log_prob"]).abs() * c.t["response_mask"] > 20).any()
                         for c in ratio)
    k3 = [c for c in cases if c.stage == "kl clamp"]
    x = [torch.clamp(c.t["ref_log_prob"] - c.t["log_prob"], -20, 20) for c in k3]
    assert k3 and all(((torch.exp(v) - v - 1) * c.t["response_mask"] > 10).any() for v, c in zip(x, k3))
