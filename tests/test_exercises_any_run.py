"""Every exercise works on any run ``ppolab.train`` writes: on a run that has what it needs, ``check`` finds its case
there and answers right or not yet; on one that lacks it, one line naming a shipped run that has it. Never an
exception. The numbers layer the checks stand on imports neither ipywidgets nor plotly.

The default selection trains two 3-step runs (GRPO and PPO + GAE) and checks every exercise on them with its
solution, unanswered and with a wrong answer; ``-m anyrun`` adds the same on every shipped run."""
from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ppolab
from ppolab import exercises
from ppolab.exercises import check, registry
from ppolab.numbers import RunLacks
from ppolab.run.reader import SHIPPED_RUNS, resolve_run

from helpers import FRESH
from test_prompts_name_the_run import setting_problems, step_problems

ROOT = Path(__file__).resolve().parents[1]
REG = registry()
#: A small shape for the fresh runs (as tests/test_failures.py): 2 prompts × n 2, one mini-batch, 3 recorded steps.
TINY = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.ppo_epochs=1",
        "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=4", "data.val_max_samples=4",
        "trainer.total_training_steps=3", "trainer.record_freq=1"]
#: Where a solution written as code is only approximately the truth, and why (the check itself still answers).
APPROXIMATE = {("13.2", "grpo_tiny_vllm_bf16"): "a bf16 trainer: the ratio of step 1 is 1 only to bf16 rounding"}
LACKS = re.compile(r'^(\d\d\.\d+): this run \((.+)\) lacks (.+); the shipped run (\w+) has it — '
                   r'check\(…, run="(\w+)"\)$')


def solutions(lab: str):
    spec = importlib.util.spec_from_file_location(f"solutions_{lab}", ROOT / "labs" / "solutions" / f"{lab}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def value(answer, run):
    """A solution or wrong answer as the learner would compute it on ``run``."""
    if not callable(answer):
        return answer
    return answer(run=run) if "run" in inspect.signature(answer).parameters else answer()


def assert_lacks_line(ex_id: str, message: str) -> None:
    m = LACKS.match(message)
    assert m and "\n" not in message, f"{ex_id}: not a one-line lacks verdict: {message!r}"
    assert m.group(1) == ex_id and m.group(4) == m.group(5) == REG[ex_id].default_run in SHIPPED_RUNS, message


class _Sentinel:
    """An answer no exercise accepts: probes the check without computing a solution first."""


def probe(ex_id: str, run) -> exercises.Verdict:
    """check with an answer that is never right: a lacks line, or "not yet" (never an exception)."""
    kw = {"run": run} if "run" in REG[ex_id].context else {}
    exercises.reset(ex_id)
    v = check(ex_id, _Sentinel(), **kw)
    assert v.answered and not v.ok, (ex_id, v.message)
    if "lacks" in v.message:
        assert_lacks_line(ex_id, v.message)
    else:
        assert "not yet" in v.message, (ex_id, v.message)
    return v


def full_protocol(ex_id: str, run) -> str:
    """Unanswered, solution and the first wrong answer on ``run``: "lacks", "right" or "not yet"."""
    ex = REG[ex_id]
    kw = {"run": run} if "run" in ex.context else {}
    assert not check(ex_id, ..., **kw).answered
    if "lacks" in probe(ex_id, run).message:
        return "lacks"
    if "run" in ex.context and not isinstance(run, (tuple, list)):  # the prompt names only what this run has
        text = exercises.prompt(ex_id, run=run)
        assert not step_problems(text, resolve_run(run)), (ex_id, run, text)
        assert not setting_problems(ex_id, resolve_run(run)), (ex_id, run, setting_problems(ex_id, resolve_run(run)))
    sol = solutions(ex.lab)
    exercises.reset(ex_id)
    right = check(ex_id, value(sol.SOLUTIONS[ex_id], run), **kw)
    check(ex_id, value(sol.WRONG[ex_id][0], run), **kw)  # must not raise; on a tiny run it may even be right
    if callable(sol.SOLUTIONS[ex_id]) and not right.ok and (ex_id, run) not in APPROXIMATE:
        # a solution written as code computes on the chosen case: it must be right wherever the check has a case
        pytest.fail(f"{ex_id} on {run}: the solution's code is not right: {right.message}")
    return "right" if right.ok else "not yet"


@pytest.mark.slow  # with the any-run matrix in .ci/run: the README command stays within its 10 minutes
@pytest.mark.spread
@pytest.mark.parametrize("preset", ["grpo_tiny", "ppo_gae_tiny"])
def test_every_exercise_on_a_fresh_run(trained_run, preset):
    # a run trained here (3 steps, TINY): the case finders cannot have been typed for it; each case trains only its
    # own preset, so the two cases on two workers do not wait for each other
    outcome = {ex_id: full_protocol(ex_id, trained_run(preset, TINY)) for ex_id in REG}
    assert "right" in outcome.values() and "lacks" in outcome.values(), outcome
    exercises.reset()


#: Fresh runs of the other presets and of another loss (the anyrun matrix): what a case finder or a solution written
#: for the presets above could still miss — step 1 as the case (no previous β), rejection after stage 4, a token
#: budget, tool observations, a sequence-level loss under seq-mean-token-mean.
OTHER_FRESH = {
    "ppo_fire_tiny": ("ppo_fire_tiny", []),
    "grpo_tool_tiny": ("grpo_tool_tiny", []),
    "grpo_temp_tiny": ("grpo_temp_tiny", []),
    "gspo_seq_mean": ("grpo_tiny", ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                                    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"]),
    # a random Llama (tests/trained.py::build_random_llama; the model path is this session's): another family, no
    # learning signal — no check may find a case it does not have, nor name a step or value of another run
    "random_llama": ("grpo_tiny", []),
}


@pytest.mark.anyrun
@pytest.mark.spread
@pytest.mark.parametrize("name", sorted(OTHER_FRESH))
def test_every_exercise_on_a_fresh_run_of_another_preset(name, request, trained_run):
    if "anyrun" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("fresh runs of the other presets (about 5 min): select it with -m anyrun")
    preset, extra = OTHER_FRESH[name]
    # the any-run lab matrix reads the same runs
    run = (request.getfixturevalue("fresh_llama_run") if name == "random_llama"
           else trained_run(preset, [*FRESH, *extra]))
    outcome = {ex_id: full_protocol(ex_id, run) for ex_id in REG}
    assert "right" in outcome.values(), outcome
    exercises.reset()


@pytest.mark.anyrun
@pytest.mark.spread
@pytest.mark.parametrize("name", sorted(SHIPPED_RUNS))
def test_every_exercise_on_every_shipped_run(name, request):
    if "anyrun" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the full matrix on the shipped runs (about 2 min): select it with -m anyrun")
    outcome = {ex_id: full_protocol(ex_id, name) for ex_id in REG}
    own = {i for i in REG if REG[i].default_run == name and "run" in REG[i].context}
    assert all(outcome[i] == "right" for i in own), {i: outcome[i] for i in own}
    exercises.reset()


def test_a_lacking_run_gets_one_line_and_a_shipped_run_that_has_it():
    v = check("09.2", 0.5, run="grpo_tiny")
    assert not v.ok and v.answered
    assert v.message == ('09.2: this run (grpo_tiny) lacks a critic (critic_vpreds: algorithm.adv_estimator=gae); '
                         'the shipped run ppo_fire_tiny has it — check(…, run="ppo_fire_tiny")')
    assert_lacks_line("09.2", check("16.5", 0.5, run="grpo_tiny").message.replace("16.5", "09.2", 1)
                      .replace("ppo_fire_tiny", REG["09.2"].default_run))


def test_prompts_name_the_case_chosen_in_the_run():
    # the lab's own run keeps the lab's case; another run gets one found in it, and the prompt says which
    assert "recorded step 3, optimizer step 4" in exercises.prompt("04.2")
    assert "recorded step 3, optimizer step 4" in exercises.prompt("04.2", run="ppo_fire_tiny")
    other = exercises.case("04.2", run="grpo_tiny")
    assert other["step"] in ppolab.load_run(SHIPPED_RUNS["grpo_tiny"]).steps and other["opt_step"] >= 1
    assert f"recorded step {other['step']}, optimizer step {other['opt_step']}" in exercises.prompt("04.2",
                                                                                                   run="grpo_tiny")
    assert "lacks" in exercises.prompt("09.2", run="grpo_tiny").splitlines()[-1]
    with pytest.raises(RunLacks):
        exercises.case("16.5", run="grpo_tiny")


def test_numbers_layer_and_exercises_import_no_widget_library():
    mods = sorted(f"ppolab.numbers.{p.stem}" for p in (ROOT / "ppolab" / "numbers").glob("*.py")
                  if p.stem != "__init__")
    code = ("import sys, ppolab.numbers, ppolab.exercises\n"
            + "".join(f"import {m}\n" for m in mods)
            + "ppolab.exercises.registry()\n"  # imports every ppolab/exercises/labNN.py
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ipywidgets', 'plotly')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_exercises_import_no_widget_module():
    """The checks read runs through the numbers layer only (ppolab/exercises/*.py, every import, nested ones too)."""
    for path in sorted((ROOT / "ppolab" / "exercises").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n == "ppolab.widgets" or n.startswith("ppolab.widgets.") for n in names), \
                f"{path.name}:{node.lineno} imports {names}"


def test_lab_run_reads_the_environment(monkeypatch):
    from ppolab.numbers import lab_run

    monkeypatch.delenv("PPOLAB_RUN", raising=False)
    assert lab_run("ppo_fire_tiny") == "ppo_fire_tiny"
    monkeypatch.setenv("PPOLAB_RUN", "grpo_tiny")
    assert lab_run("ppo_fire_tiny") == "grpo_tiny"
