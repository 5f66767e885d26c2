"""Grade the work, not the log: no exercise that asks for a quantity accepts a number its run logged or its lab shows.

For every exercise whose truth is a number (or holds numbers: a pair, a dict), on the run the exercise is written
for, the check is offered as an answer

* every value in that run's ``metrics.jsonl`` — at the recorded step the prompt names and the step after it (where
  the log writes what a step left: the next β), or at every step when the prompt names none; the wall-clock columns
  (``timing_s/*``, ``perf/time*``, ``perf/throughput``) and the step counters (``training/*``) are left out: they
  differ on every machine, so no check could be written against them;
* every number the lab's notebook shows: its stored outputs and its markdown.

None may be accepted (a dict answer, checked as a whole, only as a whole). Integers are not offered: a count
(4 mini-batches, 20 rows) appears in any text that speaks about the run, and copying it teaches nothing a count could
be checked against. ``COINCIDENCES`` lists, with the
reason, the few places where a printed number of *another* quantity lies within an exercise's tolerance.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from ppolab.exercises import _kind, case, matches, registry, truth
from ppolab.run.reader import resolve_run

pytestmark = pytest.mark.slow  # every exercise's truth on its own run: ~30 s, in .ci/run's slow phase

LABS = Path(__file__).resolve().parents[1] / "labs"
NOTEBOOKS = {p.name[:2]: p for p in sorted(LABS.glob("[0-9][0-9]_*.ipynb"))}
REG = registry()
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
NOT_ANSWERS = ("timing_s/", "perf/time", "perf/throughput", "training/")

#: (exercise, shown number) → why that number is another quantity that happens to lie within the tolerance.
COINCIDENCES = {
    ("11.2", 0.75): "§10.6's worked example (cell 5): B's share of the weight, 6 of 8 tokens",
    ("11.4", 0.25): "§10.6's worked example (cell 5): A's share of the weight, 2 of 8 tokens",
    ("15.1", 0.5): "a doctored run's late median pg_clipfrac in the warning-sign demo",
    ("09.3", 0.76): "the pooled vf_clipfrac of critic update 13 at the run's own ε_v, in the list of every update",
}
#: Predictions of a rough size (a tolerance of 10 % or more): any number inside the band passes by design, so a
#: number shown elsewhere may too. None at present: lab 15's predictions were ratios of curve means and are now
#: verdicts ("up" / "down" / "flat", tests/test_ablations.py), which hold no number to copy.
PREDICTIONS = {i for i, ex in REG.items() if ex.rel >= 0.1}


def shown_numbers(lab: str) -> set[float]:
    nb = json.loads(NOTEBOOKS[lab].read_text(encoding="utf-8"))
    found = set()
    for cell in nb["cells"]:
        text = "".join(cell["source"]) if cell["cell_type"] == "markdown" else ""
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            text += "".join(out.get("text", "")) + "".join(data.get("text/plain", "")) + \
                "".join(data.get("text/markdown", "")) + "".join(data.get("text/html", ""))
        found.update(float(m) for m in NUMBER.findall(text))
    return found


def logged_numbers(run, steps: set[int] | None) -> dict[float, str]:
    found = {}
    for col in run.metrics.columns:
        if col.startswith(NOT_ANSWERS):
            continue
        for step, v in run.metrics[col].items():
            if (steps is None or step in steps) and isinstance(v, (int, float)) and math.isfinite(v):
                found.setdefault(float(v), f"{col} at step {step}")
    return found


def numbers_in(t) -> list[float]:
    kind = _kind(t)
    if kind == "number":
        return [float(t)]
    if kind == "sequence":
        return [v for x in t for v in numbers_in(x)]
    if kind == "dict":
        return [v for x in t.values() for v in numbers_in(x)]
    return []


@pytest.mark.parametrize("ex_id", [i for i in REG if REG[i].lab in NOTEBOOKS])
def test_no_logged_or_shown_number_is_accepted(ex_id):
    if ex_id in PREDICTIONS:
        pytest.skip(f"{ex_id} asks for a rough size: a band, not a number to copy")
    ex = REG[ex_id]
    values = [v for v in numbers_in(truth(ex_id)) if abs(v - round(v)) > 1e-6]
    if not values:
        pytest.skip(f"{ex_id}'s answer holds no non-integer number")
    where = case(ex_id)
    steps = {where["step"], where["step"] + 1} if "step" in where else None
    offered = {**{v: "shown in its lab" for v in shown_numbers(ex.lab)}, **logged_numbers(resolve_run(ex.default_run),
                                                                                          steps)}
    accepted = {v: [f"{c} ({src}) for {v}" for c, src in offered.items()
                    if (ex_id, c) not in COINCIDENCES and matches(c, v, ex.rel, ex.abs)] for v in values}
    if _kind(truth(ex_id)) == "dict":
        # a dict is checked as a whole (every key right, or not yet): it can be copied only when every one of its
        # values can — lab 17's what-ifs keep the terms a setting does not move (ppo_kl under another ε)
        assert not all(accepted.values()), f"{ex_id}: every value of its dict can be copied: {accepted}"
        return
    found = [a for v in values for a in accepted[v]]
    assert not found, f"{ex_id} accepts a number it should make the learner compute: {found[:3]}"
