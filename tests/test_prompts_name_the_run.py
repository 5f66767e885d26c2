"""Every prompt is generated from the run it is shown for: a step it names is one that run logged (a recorded step one
it recorded), an optimizer step one that step ran, and a setting it calls the run's (ε, ε_v, clip_ratio_c, the KL
estimator and controller, the temperature, the batch sizes …) is that run's own — on every shipped run (issue 35 §4;
the any-run matrix adds fresh runs of every preset through test_exercises_any_run)."""
from __future__ import annotations

import re
from typing import Any, Callable

import pytest

import ppolab
from ppolab import exercises
from ppolab.numbers.needs import RunLacks
from ppolab.widgets.common import SHIPPED_RUNS

REG = exercises.registry()
RECORDED = re.compile(r"recorded step (\d+)")
OPT = re.compile(r"(?:critic )?optimizer step (\d+) of (?:recorded )?step (\d+)")
STEP = re.compile(r"(?<!optimizer )(?<!recorded )\bstep (\d+)\b")


def step_problems(text: str, run) -> list[str]:
    """The steps ``text`` names that ``run`` does not have."""
    logged = set(int(s) for s in run.metrics.index)
    bad = [f"recorded step {s}" for s in map(int, RECORDED.findall(text)) if s not in run.steps]
    bad += [f"step {s}" for s in map(int, STEP.findall(text)) if s not in logged]
    for k, s in ((int(k), int(s)) for k, s in OPT.findall(text)):
        if s in run.steps and k >= run.step(s).tensors["actor_log_probs"].shape[0] and "critic" not in text:
            bad.append(f"optimizer step {k} of step {s}")
    return bad


def _actor(r):
    return r.ppo_config().actor_rollout_ref.actor


def _info(r, case: dict) -> dict:
    return r.step(case.get("step") if case.get("step") in r.steps else r.steps[0]).info


def _n_opt(r, case: dict) -> int:
    return int(r.step(case["step"]).tensors["actor_log_probs"].shape[0])


def _mini_rows(r) -> int:
    c = r.ppo_config()
    return c.actor_rollout_ref.actor.ppo_mini_batch_size * c.actor_rollout_ref.rollout.n


#: A prompt field that states one of the run's settings → that setting, read from the run's own config (or, for the
#: data-parallel size, from the recorded step). Keyed by field name, or by (exercise, field) where one name means
#: another setting in another exercise ("mini" is ppo_mini_batch_size in 10.2 but rows per mini-batch in 01.1).
SETTINGS: dict[Any, Callable[[Any, dict], Any]] = {
    "eps": lambda r, c: _actor(r).clip_ratio,
    "c": lambda r, c: _actor(r).clip_ratio_c,
    "eps_v": lambda r, c: r.ppo_config().critic.cliprange_value,
    "agg": lambda r, c: _actor(r).loss_agg_mode,
    "mode": lambda r, c: _actor(r).loss_agg_mode,
    "loss_mode": lambda r, c: _actor(r).policy_loss.loss_mode,
    "estimator": lambda r, c: r.ppo_config().algorithm.kl_penalty,
    "target_kl": lambda r, c: r.ppo_config().algorithm.kl_ctrl.target_kl,
    "horizon": lambda r, c: r.ppo_config().algorithm.kl_ctrl.horizon,
    "T": lambda r, c: r.ppo_config().actor_rollout_ref.rollout.temperature,
    "entropy_coeff": lambda r, c: _actor(r).entropy_coeff,
    "epochs": lambda r, c: _actor(r).ppo_epochs,
    "shuffle": lambda r, c: str(_actor(r).shuffle).lower(),
    "tb": lambda r, c: r.ppo_config().data.train_batch_size,
    "dp": lambda r, c: int(_info(r, c).get("dp_size", 1) or 1),
    "gbs": lambda r, c: _mini_rows(r),
    ("01.1", "mini"): lambda r, c: _mini_rows(r),
    ("01.1", "rows"): lambda r, c: int(r.step(c["step"]).tensors["responses"].shape[0]),
    ("01.1", "n_opt"): lambda r, c: _n_opt(r, c),
    ("01.1", "per_epoch"): lambda r, c: _n_opt(r, c) // _actor(r).ppo_epochs,
    ("01.3", "width"): lambda r, c: int(r.step(c["step"]).tensors["responses"].shape[1]),
    ("08.1", "other"): lambda r, c: None,  # another estimator than the run's: checked below
    ("10.2", "mini"): lambda r, c: _actor(r).ppo_mini_batch_size,
    ("10.2", "n"): lambda r, c: r.ppo_config().actor_rollout_ref.rollout.n,
    ("02.5", "run_threshold"): lambda r, c: r.ppo_config().algorithm.rollout_correction.rollout_is_threshold,
    ("10.3", "run_rs"): lambda r, c: r.ppo_config().algorithm.rollout_correction.rollout_rs,
    ("10.3", "run_threshold"): lambda r, c: r.ppo_config().algorithm.rollout_correction.rollout_rs_threshold,
}
#: Fields that name a place in the run (checked by :func:`step_problems`) or a number the exercise chose or counted
#: on the run's own tensors (a row, a token count, a counterfactual budget): not a setting of the run.
NOT_SETTINGS = {"step", "opt_step", "open", "code", "update", "last", "next", "row", "row_a", "row_b", "pos", "pos_a",
                "pos_b", "tok_a", "tok_b", "state_a", "name", "index", "numel", "what_if", "k", "n", "rows", "tokens",
                "micro", "small", "budget", "n_pad", "steps", "knobs", "knob", "width", "mini", "n_opt", "per_epoch",
                "other", "n_clipped", "threshold", "n_seeds", "sign", "acc"}
FIELD = re.compile(r"\{(\w+)\}")
#: "the run's ε = 0.07" written into a template: a value of one run shown for every run.
LITERAL_SETTING = re.compile(r"(?<!shipped )run's (?:own )?[^{}.;:]*?=\s*[-−]?\d")


def setting_problems(ex_id: str, run) -> list[str]:
    """The fields of ``ex_id``'s prompt that call a value the run's own while ``run``'s config says otherwise, and
    fields the test does not know (a new field must be classified here, not slip through)."""
    case = exercises.case(ex_id, run)
    bad = []
    for f in dict.fromkeys(FIELD.findall(REG[ex_id].prompt)):
        if f not in case:
            continue  # braces of a dict written in the prompt, not a field
        get = SETTINGS.get((ex_id, f), SETTINGS.get(f))
        if get is None:
            if f not in NOT_SETTINGS:
                bad.append(f"field {{{f}}} is neither a setting nor a place (classify it in this test)")
            continue
        want, got = get(run, case), case[f]
        if want is not None and got is not None and str(want) != str(got):
            bad.append(f"{{{f}}} = {got!r}, the run's is {want!r}")
    if "other" in case and "estimator" in case and case["other"] == case["estimator"]:
        bad.append("the other estimator is the run's own")
    return bad


def test_no_template_writes_a_run_setting_as_a_literal():
    """A value the prompt calls the run's comes from a field, never from the text (the run it was written on)."""
    bad = {i: LITERAL_SETTING.findall(e.prompt) for i, e in REG.items() if LITERAL_SETTING.search(e.prompt)}
    assert not bad, bad
    assert LITERAL_SETTING.search("narrower than the run's ε = 0.07")
    assert not LITERAL_SETTING.search("the run's ε = {eps}; not the shipped run's 8")


def test_the_setting_checker_sees_another_runs_value(monkeypatch):
    run = ppolab.load_run(SHIPPED_RUNS["ppo_fire_tiny"])  # ε = 0.07
    real = exercises.case
    monkeypatch.setattr(exercises, "case", lambda i, r: {**real(i, r), "eps": 0.2} if i == "04.2" else real(i, r))
    assert setting_problems("04.2", run) == ["{eps} = 0.2, the run's is 0.07"]
    assert not setting_problems("09.3", run)


def test_the_checker_sees_a_step_the_run_lacks():
    run = ppolab.load_run(SHIPPED_RUNS["grpo_temp_tiny"])  # 10 steps, recorded at 1, 5, 10
    assert step_problems("recorded step 24, optimizer step 9 of step 5", run) == ["recorded step 24",
                                                                                 "optimizer step 9 of step 5"]
    assert step_problems("step 18 of the run", run) == ["step 18"]
    assert not step_problems("recorded step 5; step 10; optimizer step 0 of step 1", run)


@pytest.mark.slow  # every exercise's case on every shipped run: ~30 s, in .ci/run's slow phase
@pytest.mark.parametrize("name", sorted(SHIPPED_RUNS))
def test_no_prompt_names_a_step_or_setting_its_run_does_not_have(name):
    run = ppolab.load_run(SHIPPED_RUNS[name])
    bad = {}
    for ex_id, ex in REG.items():
        if "run" not in ex.context:
            continue
        try:
            exercises.case(ex_id, run)
        except RunLacks:
            continue
        problems = step_problems(exercises.prompt(ex_id, run=run), run) + setting_problems(ex_id, run)
        if problems:
            bad[ex_id] = problems
    assert not bad, f"prompts on {name} name what it does not have: {bad}"
