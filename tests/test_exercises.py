"""The labs' exercises: every lab has at least three, they ship unanswered, every solution is accepted and
every plausible wrong answer is refused (a check that accepts anything fails here)."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from ppolab import exercises
from ppolab.exercises import check, registry

LABS = Path(__file__).resolve().parents[1] / "labs"
NOTEBOOKS = {p.name[:2]: p for p in sorted(LABS.glob("[0-9][0-9]_*.ipynb"))}
REG = registry()


def solutions(lab: str):
    path = LABS / "solutions" / f"{lab}.py"
    spec = importlib.util.spec_from_file_location(f"solutions_{lab}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def value(answer):
    return answer() if callable(answer) else answer


def code_cells(lab: str) -> list[str]:
    nb = json.loads(NOTEBOOKS[lab].read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("lab", sorted(NOTEBOOKS))
def test_every_lab_has_three_exercises_checked_in_its_notebook_and_shipped_unanswered(lab):
    ids = [i for i in REG if REG[i].lab == lab]
    assert len(ids) >= 3, f"lab {lab} has {len(ids)} exercises: {ids}"
    cells = code_cells(lab)
    for i in ids:
        calls = [c for c in cells if re.search(rf"check\(\s*[\"']{re.escape(i)}[\"']", c)]
        assert calls, f"lab {lab}'s notebook never checks exercise {i}"
    answer_cells = [c for c in cells if "check(" in c or re.search(r"#\s*EXERCISE", c)]
    assert all("..." in c for c in answer_cells if "check(" in c and "EXERCISE" in c), lab
    # an answer left open: `x = ...`, or a function the learner writes whose body returns `...` (lab 17)
    unanswered = re.compile(r"=\s*\.\.\.|^\s*return\b[^#\n]*\.\.\.", re.M)
    assert sum(bool(unanswered.search(c)) for c in cells) >= len(ids), f"lab {lab}: answers not left `...`"


@pytest.mark.parametrize("ex_id", sorted(REG))
def test_solution_is_right(ex_id):
    sol = solutions(REG[ex_id].lab)
    assert ex_id in sol.SOLUTIONS, f"no solution for {ex_id} in labs/solutions/{REG[ex_id].lab}.py"
    exercises.reset(ex_id)
    verdict = check(ex_id, value(sol.SOLUTIONS[ex_id]))
    assert verdict.ok and verdict.answered, verdict.message


@pytest.mark.parametrize("ex_id", sorted(REG))
def test_wrong_answers_are_not_yet(ex_id):
    sol = solutions(REG[ex_id].lab)
    wrong = sol.WRONG.get(ex_id, [])
    assert wrong, f"labs/solutions/{REG[ex_id].lab}.py gives no wrong answer for {ex_id}"
    exercises.reset(ex_id)
    for w in wrong:
        verdict = check(ex_id, value(w))
        assert not verdict.ok and "not yet" in verdict.message, (ex_id, w)


def test_unanswered_never_raises_and_hints_grow():
    ex_id = next(iter(REG))
    exercises.reset()
    v = check(ex_id, ...)
    assert not v.ok and not v.answered and "not answered" in v.message
    wrong = solutions(REG[ex_id].lab).WRONG[ex_id][0]
    first, second = check(ex_id, value(wrong)), check(ex_id, value(wrong))
    assert first.message.count("hint") == 1 and second.message.count("hint") == 2
    assert check(ex_id, value(solutions(REG[ex_id].lab).SOLUTIONS[ex_id])).ok


def test_matches_is_strict_about_kinds():
    from ppolab.exercises import matches

    assert matches(3, 3.0) and not matches(True, 1) and not matches(1, True) and not matches("3", 3)
    assert matches((1.0, True), (1.0 + 1e-12, True)) and not matches((1.0, True), (1.0, False))
    assert not matches(float("nan"), 0.0) and matches(" Token-Mean ", "token-mean")


def _default_truth(ex_id: str):
    """Exercise ``ex_id``'s truth on its own shipped run (``run=None``), as the notebook's first check sees it."""
    return exercises.truth(ex_id, **({"run": None} if "run" in REG[ex_id].context else {}))


@pytest.mark.parametrize("lab", sorted({ex.lab for ex in REG.values()}))
def test_no_truth_repeats_an_earlier_exercise_in_the_same_lab(lab):
    """Resubmitting an earlier cell's answer must not pass a later exercise of the same lab: each exercise's truth
    (on its default run) is compared, with the later exercise's tolerance, with every earlier truth of the lab.
    Only numbers, strings, sequences, sets and dicts count; a bool truth equal to an earlier bool is allowed (a
    yes/no question has two answers, so repeats are unavoidable), and a bool never matches a number."""
    from ppolab.exercises import matches

    ids = [i for i in REG if REG[i].lab == lab]
    truths = {i: _default_truth(i) for i in ids}
    repeats = []
    for k, later in enumerate(ids):
        if isinstance(truths[later], bool):
            continue
        for earlier in ids[:k]:
            if not isinstance(truths[earlier], bool) and matches(truths[earlier], truths[later], REG[later].rel,
                                                                 REG[later].abs):
                repeats.append(f"{later} = {earlier} ({truths[later]!r})")
    assert not repeats, f"lab {lab}: an earlier answer passes a later exercise: {'; '.join(repeats)}"


@pytest.mark.parametrize("lab", sorted(NOTEBOOKS))
def test_exercises_are_numbered_in_cell_order(lab):
    """The notebook checks its own exercises ``check("NN.k", …)`` in increasing k, cell by cell (first occurrence)."""
    order: list[int] = []
    for cell in code_cells(lab):
        for k in re.findall(rf"check\(\s*[\"']{lab}\.(\d+)[\"']", cell):
            if int(k) not in order:
                order.append(int(k))
    assert order == sorted(order), f"lab {lab}: exercises checked in the order {[f'{lab}.{k}' for k in order]}"


def test_14_2_reads_the_trainers_switches_from_its_source():
    """14.2's truth parses ppolab/trainer.py (ast): each optional stage and the key it writes, under its switch."""
    import warnings

    from ppolab.exercises.lab14 import skipped_stages
    from ppolab.train import resolve_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on = resolve_config("ppo_gae_tiny")
        no_kl = resolve_config("ppo_gae_tiny", ["algorithm.use_kl_in_reward=false"])
        no_critic = resolve_config("ppo_gae_tiny", ["critic.enable=false", "algorithm.adv_estimator=grpo",
                                                    "actor_rollout_ref.rollout.n=4"])
    assert skipped_stages(on, no_kl) == [("compute_ref_log_prob", "ref_log_prob")]
    assert skipped_stages(on, no_critic) == [("compute_values", "values")]
    assert skipped_stages(on, on) == [] and skipped_stages(no_kl, on) == []
