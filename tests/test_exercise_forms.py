"""The check machinery accepts every natural form of a right answer and never raises, whatever the learner passes.

``matches`` is tested form by form (right forms accepted, wrong values refused, a bool never a number); ``check`` is
fed a battery of odd answers on every registered exercise (each must be a "not yet", answered, never a traceback),
and each solution that is a number or a bool is given again as a (1, 1) tensor, a numpy scalar, a torch bool ….
Each exercise's truth is computed once and reused, so the file stays fast."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ppolab import exercises
from ppolab.algos.kl import KL_ALIASES, canonical_kl_name
from ppolab.exercises import Verdict, check, matches, registry
from ppolab.vocab import KL_PENALTY_TYPES

LABS = Path(__file__).resolve().parents[1] / "labs"
REG = registry()


@functools.lru_cache(maxsize=None)
def solutions(lab: str):
    spec = importlib.util.spec_from_file_location(f"solutions_{lab}", LABS / "solutions" / f"{lab}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def value(answer):
    """As tests/test_exercises.py: a solution written as code is called (on the exercise's own run)."""
    return answer() if callable(answer) else answer


def _context(ex_id: str) -> dict:
    return {"run": None} if "run" in REG[ex_id].context else {}


@functools.lru_cache(maxsize=None)
def truth_of(ex_id: str):
    return exercises.truth(ex_id, **_context(ex_id))


@functools.lru_cache(maxsize=None)
def solution_of(ex_id: str):
    return value(solutions(REG[ex_id].lab).SOLUTIONS[ex_id])


@functools.lru_cache(maxsize=None)
def _require(run, *names, default):
    return _REAL_REQUIRE(run, *names, default=default)


@functools.lru_cache(maxsize=None)
def case_of(ex_id: str) -> dict:
    return dict(REG[ex_id].case(None))


_REAL_REQUIRE = exercises.require


@pytest.fixture
def cached_truth(monkeypatch):
    """Make ``check`` reuse each exercise's truth, its case and what its run has, each computed once on the shipped
    run (the same values ``check`` computes, only faster: reading a run's config costs about 0.1 s each time)."""
    monkeypatch.setattr(exercises, "require", _require)

    def use(ex_id: str) -> None:
        ex = REG[ex_id]
        truth = truth_of(ex_id)

        @functools.wraps(ex.compute)  # keeps the signature: check passes the context the exercise takes
        def compute(*args, **kwargs):
            return truth

        def case(run=None):
            return case_of(ex_id) if run is None else ex.case(run)

        monkeypatch.setitem(exercises._REGISTRY, ex_id, dataclasses.replace(
            ex, compute=compute, case=None if ex.case is None else case))
        exercises.reset(ex_id)
    yield use
    exercises.reset()


# --------------------------------------------------------------------------------------------- matches, form by form
ONE_ELEMENT = [torch.tensor(0.25), torch.tensor([0.25]), torch.tensor([[0.25]]), torch.tensor([[0.25]]).double(),
               np.float64(0.25), np.float32(0.25), np.array(0.25), np.array([[0.25]])]


@pytest.mark.parametrize("form", ONE_ELEMENT, ids=lambda f: f"{type(f).__name__}{tuple(np.shape(f))}")
def test_a_one_element_tensor_or_array_is_a_number(form):
    assert matches(form, 0.25)
    assert not matches(form, 0.5)
    assert not matches(form, True) and not matches(form, "0.25")


def test_integers_and_numpy_integers():
    for form in (7, 7.0, np.int64(7), np.int32(7), torch.tensor([[7]]), np.array([7]),
                 torch.tensor(7, dtype=torch.int8)):
        assert matches(form, 7), form
        assert not matches(form, 8), form
    assert matches(7, torch.tensor(7)) and matches(7, np.int64(7))  # a truth held in a tensor or numpy scalar


@pytest.mark.parametrize("form", [True, np.bool_(True), torch.tensor(True), torch.tensor([[True]]), np.array([True])],
                         ids=lambda f: f"{type(f).__name__}{tuple(np.shape(f))}")
def test_numpy_and_torch_bools_are_bools(form):
    assert matches(form, True) and not matches(form, False)
    assert not matches(form, 1) and not matches(form, 1.0)  # a bool never answers "how many"


def test_a_number_never_matches_a_bool():
    for form in (1, 1.0, np.int64(1), np.float64(1.0), torch.tensor(1.0), torch.tensor([[1]])):
        assert not matches(form, True), form
    assert not matches(0, False) and not matches(torch.tensor(0.0), False)


def test_nan_and_infinities():
    assert matches(float("nan"), float("nan")) and matches(torch.tensor([[float("nan")]]), float("nan"))
    assert not matches(float("nan"), 0.0) and not matches(0.0, float("nan"))
    assert matches(float("inf"), float("inf")) and not matches(float("inf"), 1e300)


def test_tolerances_are_the_exercise_s():
    assert matches(1.0 + 1e-8, 1.0) and not matches(1.001, 1.0)
    assert matches(1.001, 1.0, rel=1e-2) and matches(1e-10, 0.0) and not matches(1e-3, 0.0)


def test_multi_element_tensors_compare_as_sequences():
    assert matches(torch.tensor([4, 64]), (4, 64)) and matches(np.array([4, 64]), [4, 64])
    assert matches(torch.tensor([[128, 4], [64, 4]]), ((128, 4), (64, 4)))
    assert matches(torch.Size([4, 64]), (4, 64))
    assert not matches(torch.tensor([4, 65]), (4, 64)) and not matches(torch.tensor([4, 64, 1]), (4, 64))
    assert matches((torch.tensor([[-0.7]]), torch.tensor(True)), (-0.7, True))
    assert not matches((torch.tensor([[-0.7]]), torch.tensor(1.0)), (-0.7, True))  # strict inside sequences too
    assert not matches(torch.zeros(3, 4), 0.0) and not matches(torch.tensor([0.25]), (0.25, 0.25))
    assert matches(torch.tensor([0.25]), [0.25])  # one element where a list of one is asked for


def test_strings_ignore_case_and_blanks_everywhere():
    assert matches(" Token-Mean ", "token-mean") and not matches("token-sum", "token-mean")
    assert matches((" VANILLA", "Gpg "), ("vanilla", "gpg")) and matches([" A "], ["a"])
    assert matches({"Vanilla ", " GPG"}, {"vanilla", "gpg"}) and matches(["GPG", "vanilla"], {"vanilla", "gpg"})
    assert matches({"Reward-Side ": " OLD_LOG_PROBS"}, {"reward-side": "old_log_probs"})
    assert not matches({"reward-side": "log_prob"}, {"reward-side": "old_log_probs"})
    assert not matches({"a": 1, "A": 1}, {"a": 1, "b": 1})  # two keys that read the same do not fill two
    assert not matches("3", 3) and not matches(3, "3")


def test_kl_aliases_are_verl_s_table():
    assert KL_ALIASES == {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
    pairs = [("low_var_kl", "k3"), ("kl", "k1"), ("mse", "k2"), ("abs", "abs"), ("full", "full")]
    for alias, name in pairs:
        assert canonical_kl_name(alias) == name and canonical_kl_name(alias + "+") == name + "+"
        assert canonical_kl_name(f" {alias.upper()} ") == name
        assert matches(alias, name) and matches(name, alias) and matches(alias + "+", name + "+")
        assert not matches(alias, name + "+") and not matches(alias + "+", name)  # '+' is another estimator
    assert all(canonical_kl_name(n) is not None for n in KL_PENALTY_TYPES)
    assert not matches("k1", "k3") and not matches("low_var_kl", "k2") and not matches("mse", "kl")
    assert canonical_kl_name("kl_coef") is None and canonical_kl_name("vanilla") is None
    assert canonical_kl_name(3) is None
    assert not matches("kl", "kl_coef") and not matches("k3", "low_var")  # only estimator names alias


def test_kl_aliases_inside_sequences_and_sets():
    assert matches(("low_var_kl", "kl"), ("k3", "k1")) and not matches(("kl", "low_var_kl"), ("k3", "k1"))
    assert matches(["low_var_kl+", "kl+", "ABS+", "mse", "mse+"], {"k3+", "k1+", "abs+", "k2", "k2+"})
    assert matches({"Low_Var_KL"}, {"k3"}) and not matches({"low_var_kl"}, {"k3+"})


def test_set_valued_expectations():
    expected = {"gpg", "vanilla"}
    for form in ({"gpg", "vanilla"}, frozenset(expected), ["vanilla", "gpg"], ("gpg", "vanilla"),
                 ["gpg", "vanilla", "gpg"]):
        assert matches(form, expected), form
    for form in ({"gpg"}, ["gpg", "vanilla", "dro"], "gpg vanilla", [["gpg"], ["vanilla"]], [[1, 2]], {"gpg": 1}):
        assert not matches(form, expected), form
    assert matches([[1, 2], [3, [4]]], {(1, 2), (3, (4,))})  # lists inside a set: no "unhashable type"
    assert not matches([[1, 2]], {(1, 3)}) and matches(set(), set()) and not matches([], {"gpg"})


def test_matches_never_raises():
    class Nasty:
        def __getattr__(self, name):
            raise RuntimeError("no attributes here")

        def __eq__(self, other):
            raise RuntimeError("no comparison")

        __hash__ = None

    def gen():
        yield 1

    for expected in (0.5, 3, True, "k3", (1, 2), [1, 2], {"a", "b"}, {"a": 1}, None):
        for answer in (Nasty(), gen(), lambda: 1 / 0, None, object(), b"k3", 1 + 2j, torch.zeros(3, 4),
                       np.zeros((2, 0)), [[1, 2]], {1: [2]}, [{"a": [1]}]):
            assert matches(answer, expected) in (True, False)


# ---------------------------------------------------------------------------------------------- check never raises
class _Nasty:
    """An answer that raises on every attribute lookup and comparison."""

    def __getattr__(self, name):
        raise RuntimeError("no attributes here")

    def __eq__(self, other):
        raise RuntimeError("no comparison")

    __hash__ = None


def _raises():
    raise ZeroDivisionError("a learner's function that raises")


def _odd_answers() -> list:
    return [None, "abc", "", [[1, 2]], {"a": 1}, {1, 2}, set(), [], (), torch.zeros(3, 4), torch.zeros(0),
            np.zeros(2), np.array(["x"]), _raises, lambda: 1.0, (x for x in range(3)), float("nan"), float("inf"),
            torch.tensor([[float("nan")]]), object(), b"k3", 1 + 2j, _Nasty(), [{"a": [1]}], {"k3": [1]},
            [None, None], torch.zeros(2, requires_grad=True)]


@pytest.mark.parametrize("ex_id", sorted(REG))
def test_check_never_raises_on_odd_answers(ex_id, cached_truth):
    cached_truth(ex_id)
    truth, ex = truth_of(ex_id), REG[ex_id]
    scalar = isinstance(truth, (bool, int, float, str))
    wrong_tries = 0
    for answer in _odd_answers():
        v = check(ex_id, answer)
        assert isinstance(v, Verdict) and v.answered, (ex_id, answer, v.message)
        if matches(answer, truth, ex.rel, ex.abs):  # an odd answer that happens to be right (none is today)
            continue
        wrong_tries += 1
        first, *rest = v.message.split("\n")
        assert not v.ok and first == f"{ex_id}: not yet.", (ex_id, answer, v.message)
        # a form line, or for a prediction per key the keys that are off (tests/test_ablations.py)
        assert len(rest) == min(wrong_tries, len(ex.hints)) + rest[0].startswith(("  expected", "  item", "  off")), \
            v.message
        if answer is None:
            assert rest[0].startswith("  expected ") and rest[0].endswith(", got None."), v.message
        if scalar and isinstance(answer, torch.Tensor) and answer.shape == (3, 4):
            assert rest[0].endswith("got a tensor of shape (3, 4)."), v.message
    assert wrong_tries >= len(_odd_answers()) - 2, ex_id


def test_the_form_line_says_what_was_expected_and_what_was_given(cached_truth):
    cached_truth("15.2")  # a number
    assert check("15.2", torch.zeros(3, 4)).message.split("\n")[1] == \
        "  expected a number, got a tensor of shape (3, 4)."
    assert check("15.2", {"a": 1}).message.split("\n")[1] == "  expected a number, got a dict of size 1."
    assert check("15.2", "0.6").message.split("\n")[1] == "  expected a number, got the string '0.6'."
    assert check("15.2", True).message.split("\n")[1] == "  expected a number, got the bool True."
    assert "got a function (pass the value it returns" in check("15.2", _raises).message
    assert "got a generator" in check("15.2", (x for x in [1])).message
    assert "got an object of type _Nasty" in check("15.2", _Nasty()).message
    v = check("15.2", 0.5)  # the right form, a wrong value: only the hints
    assert not v.ok and "expected" not in v.message
    cached_truth("12.2")  # a pair of counts
    assert check("12.2", (8, True)).message.split("\n")[1] == "  item 2: expected a number, got the bool True."
    assert check("12.2", [1, 2, 3]).message.split("\n")[1] == \
        "  expected a sequence of length 2, got a list of length 3."


def test_a_list_for_a_number_and_a_percentage_for_a_fraction_get_their_lines(cached_truth):
    """A list where a number is expected is named (the form test of a sequence once ran for every expected form and
    raised on a number, so the line was lost); a share given in per cent is told to divide by 100 — and only a
    share that would be right as a fraction, so a wrong value is not told it is merely in per cent."""
    from ppolab.exercises import _form_line

    cached_truth("15.2")
    assert check("15.2", [0.1, 0.2]).message.split("\n")[1] == "  expected a number, got a list of length 2."
    assert _form_line([1, 2], 0.25, False) == "  expected a number, got a list of length 2."
    assert _form_line(25.0, 0.25, False) == ("  expected a fraction between 0 and 1, got 25 — a percentage? "
                                             "Give it as 25 / 100.")
    assert _form_line(25, 0.25, False) is not None
    assert _form_line(37.0, 0.25, False) is None  # wrong either way: only the hints
    assert _form_line(0.3, 0.25, False) is None
    assert _form_line(25.0, 25.0, False) is None  # a count of 25 is no percentage


def test_check_speaks_chinese_about_forms(cached_truth):
    import re

    from ppolab.i18n import set_language
    cached_truth("15.2")
    set_language("zh")
    try:
        line = check("15.2", torch.zeros(3, 4)).message.split("\n")[1]
    finally:
        set_language("en")
    assert re.search(r"[\u4e00-\u9fff]", line) and "(3, 4)" in line and "expected" not in line, line


def test_a_truth_that_raises_is_one_line_naming_a_ppolab_bug(monkeypatch):
    def broken():
        raise ValueError("a bug in the exercise")

    ex = dataclasses.replace(REG["15.2"], id="99.1", compute=broken)
    monkeypatch.setitem(exercises._REGISTRY, "99.1", ex)
    v = check("99.1", 0.5)
    assert not v.ok and v.answered and "\n" not in v.message, v.message
    assert v.message.startswith("99.1: ") and "ValueError: a bug in the exercise" in v.message
    assert "bug in ppolab" in v.message and "report" in v.message
    assert "99.1" not in exercises._TRIES  # not the learner's wrong try


def test_run_lacks_stays_the_lacks_line():
    v = check("09.2", None, run="grpo_tiny")
    assert not v.ok and v.answered and "\n" not in v.message
    assert v.message.startswith("09.2: this run (grpo_tiny) lacks ")


def test_a_path_that_is_no_run_is_one_line(tmp_path):
    v = check("09.2", 0.5, run=str(tmp_path / "nothing"))
    assert not v.ok and "\n" not in v.message and "could not read the run" in v.message


def test_an_unknown_id_and_an_extra_run_never_raise():
    v = check("99.9", 1.0)
    assert not v.ok and not v.answered and "99.9" in v.message and "15.2" in v.message
    sol = solution_of("15.2")
    assert check("15.2", sol, run="ppo_fire_tiny").ok  # run=RUN given to an exercise that takes none


def test_odd_answers_are_wrong_tries_and_hints_grow(cached_truth):
    cached_truth("15.2")
    counts = [check("15.2", a).message.count("hint") for a in (None, torch.zeros(3, 4), "abc")]
    assert counts == [1, 2, min(3, len(REG["15.2"].hints))]
    assert check("15.2", ...).message.startswith("15.2: not answered")


# --------------------------------------------------------------------------- each solution in its natural forms
def _forms(v) -> list:
    """Other natural forms of a solution value ``v``: tensors and numpy scalars for numbers and bools, element by
    element for a sequence, a whole tensor/array for a sequence of numbers."""
    if isinstance(v, bool):
        return [torch.tensor(v), torch.tensor([[v]]), np.bool_(v), np.array(v)]
    if isinstance(v, int):
        return [torch.tensor([[v]]), torch.tensor(v), np.int64(v), np.float64(v), np.array([v])]
    if isinstance(v, float):
        return [torch.tensor([[v]]), torch.tensor(v), np.float64(v), np.float32(v), np.array([[v]])]
    if isinstance(v, (tuple, list)) and v and all(isinstance(e, (bool, int, float)) for e in v):
        out = [type(v)(_forms(e)[0] for e in v)]
        if all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in v):
            out += [np.array(v), torch.tensor(v, dtype=torch.float64)]
        return out
    return []


@pytest.mark.parametrize("ex_id", sorted(REG))
def test_a_solution_in_another_natural_form_is_right(ex_id, cached_truth):
    sol = solution_of(ex_id)
    forms = _forms(sol)
    if not forms:
        pytest.skip(f"{ex_id}'s solution is a {type(sol).__name__}: no tensor form")
    cached_truth(ex_id)
    if not check(ex_id, sol).ok:
        pytest.skip(f"{ex_id}: the solution itself is not right (tests/test_exercises.py reports it)")
    for form in forms:
        v = check(ex_id, form)
        assert v.ok, (ex_id, form, v.message)
    if isinstance(sol, (int, float)) and not isinstance(sol, bool) and not math.isnan(sol):
        assert not check(ex_id, torch.tensor([[sol, sol]])).ok  # two elements are not one number
