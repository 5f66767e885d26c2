"""What kind of work each exercise asks for (``Exercise.kind``): few lookups, and no tag that claims more work than
the exercise asks for.

A lookup can be answered without real work: a fact the lab or the chapter states, a value of the run's config or log,
one stated formula applied to stated numbers. The course keeps at most :data:`MAX_LOOKUPS` of them; every other
exercise must show, in how it is registered, why it is more: it computes on a run (``run`` in its context), it asks
for a prediction that the lab then reveals (its prompt starts with "Predict"), or the learner writes code (its prompt
starts with "Write code"). The few that are none of these but still real derivations are listed in
:data:`DERIVATIONS`, each with the reason.
"""
from __future__ import annotations

import pytest

from ppolab.exercises import KINDS, registry

REG = registry()
#: The most lookups the whole course may hold (the issue: "Lookups ≤ 8 in the whole course").
MAX_LOOKUPS = 8
#: Exercises on stated numbers (no run) that are not lookups, and why: each needs several steps the lab does not
#: print. Keep this list short; an exercise that fits none of the reasons is a lookup.
DERIVATIONS = {
    "06.4": "runs the gradient of every registered loss mode on toy_batch() and compares it with vanilla's — a "
            "search over the registry that no cell of lab 06 prints",
    "06.5": "works out, mode by mode, where each loss's gradient weight vanishes for one token (clip, dual clip, "
            "DRO's β, the sequence-level modes) — a case analysis the lab does not print",
    "15.2": "GRPO's group normalisation by hand: the group mean, torch's unbiased std, then the division — three "
            "steps on numbers the lab does not work through (the lab prints distributions of the shipped run only)",
    "15.3": "applies warning_signs' rules (late medians against THRESHOLDS) to a frame of made-up numbers: the "
            "learner computes the medians of each metric and compares them, no warning line is printed for it",
}
@pytest.mark.parametrize("ex_id", list(REG))
def test_every_exercise_has_a_kind(ex_id):
    assert REG[ex_id].kind in KINDS, f"{ex_id}: kind {REG[ex_id].kind!r}, not one of {KINDS}"


def test_few_lookups():
    lookups = [i for i, ex in REG.items() if ex.kind == "lookup"]
    assert len(lookups) <= MAX_LOOKUPS, f"{len(lookups)} lookups (at most {MAX_LOOKUPS}): {lookups}"


@pytest.mark.parametrize("ex_id", [i for i in REG if REG[i].kind not in (None, "lookup")])
def test_a_kind_other_than_lookup_is_earned(ex_id):
    ex = REG[ex_id]
    if ex.kind == "predict":
        assert ex.prompt.startswith("Predict"), f"{ex_id}: a predict exercise whose prompt does not ask to predict"
    if ex.kind == "code":
        assert ex.prompt.startswith("Write code"), f"{ex_id}: a code exercise whose prompt does not ask for code"
    on_a_run = "run" in ex.context
    assert on_a_run or ex.kind in ("predict", "code") or ex_id in DERIVATIONS, (
        f"{ex_id} ({ex.kind}) works on stated numbers only: tag it lookup, make it work on a run, or justify it in "
        "DERIVATIONS")


def test_derivations_are_neither_stale_nor_on_a_run():
    for ex_id in DERIVATIONS:
        assert ex_id in REG, f"DERIVATIONS lists {ex_id}, which no longer exists"
        ex = REG[ex_id]
        assert ex.kind == "compute" and "run" not in ex.context and not ex.prompt.startswith("Predict"), (
            f"{ex_id} needs no entry in DERIVATIONS")
