"""Every prompt is generated from the run it is shown for: a step it names is one that run logged (a recorded step one
it recorded), and an optimizer step one that step ran — on every shipped run (issue 35 §4; the any-run matrix adds
fresh runs of every preset through test_exercises_any_run)."""
from __future__ import annotations

import re

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


def test_the_checker_sees_a_step_the_run_lacks():
    run = ppolab.load_run(SHIPPED_RUNS["grpo_temp_tiny"])  # 10 steps, recorded at 1, 5, 10
    assert step_problems("recorded step 24, optimizer step 9 of step 5", run) == ["recorded step 24",
                                                                                 "optimizer step 9 of step 5"]
    assert step_problems("step 18 of the run", run) == ["step 18"]
    assert not step_problems("recorded step 5; step 10; optimizer step 0 of step 1", run)


@pytest.mark.slow  # every exercise's case on every shipped run: ~30 s, in .ci/run's slow phase
@pytest.mark.parametrize("name", sorted(SHIPPED_RUNS))
def test_no_prompt_names_a_step_its_run_does_not_have(name):
    run = ppolab.load_run(SHIPPED_RUNS[name])
    bad = {}
    for ex_id, ex in REG.items():
        if "run" not in ex.context:
            continue
        try:
            exercises.case(ex_id, run)
        except RunLacks:
            continue
        problems = step_problems(exercises.prompt(ex_id, run=run), run)
        if problems:
            bad[ex_id] = problems
    assert not bad, f"prompts on {name} name what it does not have: {bad}"
