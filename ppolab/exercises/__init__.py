"""Exercise checks for the labs: the truth is computed at call time, never typed into a notebook.

A lab cell ships unanswered::

    answer = ...                      # your prediction: pg_clipfrac of step 1, optimizer step 3, at ε = 0.1
    check("04.2", answer, run=RUN)

``check`` computes the true value with ``ppolab.algos`` on the recorded run (or on the numbers the exercise
states), compares, and answers **right**, or **not yet** with a hint that grows with each wrong try: first a
nudge, then the formula. An unanswered exercise (``...``) is reported as such; ``check`` never raises on it.

Each lab's exercises live in ``ppolab/exercises/labNN.py`` and register themselves with :func:`exercise`;
the solutions live outside the notebooks, in ``labs/solutions/NN.py`` (``SOLUTIONS`` and ``WRONG``), and
``tests/test_exercises.py`` asserts every solution is accepted and every plausible wrong answer is not.

In Chinese (``set_language("zh")``, the same function as :func:`ppolab.i18n.set_language`) the hints and
:func:`prompt` come from ``ppolab/exercises/zh/NN.json``, which ``tools/build_zh_labs.py`` writes from the labs'
translation files; the English text registered here stays the source.

Any run: an exercise declares what it ``needs`` from a run (names of :data:`ppolab.numbers.NEEDS`: a critic, the
reward-side KL, padding rows, …) and, when its prompt names a step or an optimizer step, the ``case`` finder that picks
them in the run at hand (``ppolab.numbers.cases``); the prompt is a template filled from that case
(``prompt("04.2", run=RUN)``). Given a run that lacks what the exercise needs, :func:`check` answers one line saying
what is missing and which shipped run has it.
"""
from __future__ import annotations

import importlib
import json
import math
import pkgutil
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from ppolab.i18n import get_language, set_language, tr
from ppolab.numbers.needs import NEEDS, RunLacks, require, run_label

__all__ = ["Exercise", "Verdict", "case", "check", "exercise", "hints", "prompt", "registry", "reset", "set_language",
           "truth", "UNANSWERED"]

#: What an unanswered exercise holds: ``answer = ...``.
UNANSWERED = Ellipsis


@dataclass(frozen=True)
class Exercise:
    """One checked exercise.

    ``compute(**context)`` returns the truth; ``rel``/``abs`` are the tolerances for numbers (a prediction
    read off a figure needs a looser one than a recomputation); ``hints`` are shown one more per wrong try.
    ``needs`` names what the run must have (:data:`ppolab.numbers.NEEDS`), ``case(run)`` the numbers that fill the
    prompt's and hints' ``{fields}``, and ``default_run`` the shipped run the exercise is written for (``run=None``).
    """
    id: str
    prompt: str
    compute: Callable[..., Any]
    hints: tuple[str, ...]
    rel: float = 1e-6
    abs: float = 1e-9
    context: tuple[str, ...] = field(default=())
    needs: tuple[str, ...] = field(default=())
    case: Callable[..., dict] | None = None
    default_run: str = "grpo_tiny"

    @property
    def lab(self) -> str:
        return self.id.split(".")[0]


@dataclass
class Verdict:
    """The answer of :func:`check`: truthy when right; shows as its message in a notebook."""
    id: str
    ok: bool
    answered: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return self.message

    def _repr_markdown_(self) -> str:
        return self.message


_REGISTRY: dict[str, Exercise] = {}
_TRIES: dict[str, int] = {}
_LOADED = False


def exercise(id: str, prompt: str, hints: tuple[str, ...] | list[str], *, rel: float = 1e-6, abs: float = 1e-9,
             context: tuple[str, ...] = (), needs: tuple[str, ...] = (), case: Callable[..., dict] | None = None,
             default_run: str = "grpo_tiny") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn(**context) -> truth`` as exercise ``id`` (``"NN.k"``). At least two hints:
    the first a nudge, the last the formula. ``needs``, ``case``, ``default_run``: see :class:`Exercise`."""
    if len(hints) < 2:
        raise ValueError(f"exercise {id}: give at least two hints (a nudge, then the formula)")
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"exercise {id}: unknown needs {sorted(unknown)}; known: {', '.join(NEEDS)}")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if id in _REGISTRY and _REGISTRY[id].compute is not fn:
            raise ValueError(f"exercise {id!r} is registered twice")
        _REGISTRY[id] = Exercise(id, prompt, fn, tuple(hints), rel, abs, tuple(context), tuple(needs), case,
                                 default_run)
        return fn
    return register


def _load_all() -> None:
    global _LOADED
    if not _LOADED:
        for mod in pkgutil.iter_modules(__path__):
            if mod.name.startswith("lab"):
                importlib.import_module(f"{__name__}.{mod.name}")
        _LOADED = True


def registry() -> dict[str, Exercise]:
    """Every registered exercise by id, sorted (all lab modules imported)."""
    _load_all()
    return dict(sorted(_REGISTRY.items(), key=lambda kv: tuple(int(p) for p in kv[0].split("."))))


def truth(id: str, **context: Any) -> Any:
    """The true answer of exercise ``id``, computed now (for tests and for the curious)."""
    return _get(id).compute(**context)


def reset(id: str | None = None) -> None:
    """Forget the wrong tries (of one exercise, or all): hints start again from the first."""
    if id is None:
        _TRIES.clear()
    else:
        _TRIES.pop(id, None)


def _get(id: str) -> Exercise:
    reg = registry()
    if id not in reg:
        raise KeyError(f"no exercise {id!r}; the labs' exercises are {', '.join(reg)}")
    return reg[id]


@lru_cache(maxsize=None)
def _zh(lab: str) -> dict[str, dict]:
    """The Chinese prompts and hints of one lab's exercises (empty if the lab has no translation file)."""
    path = Path(__file__).with_name("zh") / f"{lab}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def case(id: str, run: Any = None) -> dict:
    """The case exercise ``id`` picks in ``run`` (default: its own shipped run): the numbers its prompt names, e.g.
    ``{"step": 24, "opt_step": 8}``; ``{}`` for an exercise whose prompt names none. Raises
    :class:`~ppolab.numbers.RunLacks` when the run lacks what the exercise needs."""
    ex = _get(id)
    if "run" in ex.context and not isinstance(run, (tuple, list)):  # 14.1 may compare a pair of runs
        require(run, *ex.needs, default=ex.default_run)
    return dict(ex.case(run)) if ex.case is not None else {}


def _fill(text: str, fields: dict) -> str:
    """``text`` with every ``{name}`` of ``fields`` replaced; other braces (a dict in a prompt) stay as they are."""
    return re.sub(r"\{(\w+)\}", lambda m: str(fields[m.group(1)]) if m.group(1) in fields else m.group(0), text)


def _case_or_default(ex: Exercise, run: Any) -> dict:
    """The case of ``run``, or of the exercise's own run when ``run`` lacks it (the template must still read)."""
    try:
        return case(ex.id, run)
    except RunLacks:
        return case(ex.id, None)


def prompt(id: str, run: Any = None) -> str:
    """The prompt of exercise ``id`` in the current language, its step and optimizer step those of the case it
    picks in ``run`` (default: its own shipped run). For a run that lacks what it needs: the lacks line after it."""
    ex = _get(id)
    text = _zh(ex.lab).get(id, {}).get("prompt", ex.prompt) if get_language() == "zh" else ex.prompt
    if ex.case is None and not ex.needs:
        return text
    try:
        return _fill(text, case(id, run))
    except RunLacks as e:
        return _fill(text, case(id, None)) + "\n" + _lacks_message(ex, e)


def hints(id: str, run: Any = None) -> tuple[str, ...]:
    """The hints of exercise ``id`` in the current language (English where a translation is missing or stale:
    a Chinese list of another length than the English one is not used), filled from the case of ``run``."""
    ex = _get(id)
    out = ex.hints
    if get_language() == "zh":
        zh = tuple(_zh(ex.lab).get(id, {}).get("hints", ()))
        if len(zh) == len(ex.hints):
            out = zh
    if ex.case is None:
        return out
    fields = _case_or_default(ex, run)
    return tuple(_fill(h, fields) for h in out)


def _lacks_message(ex: Exercise, lacks: RunLacks) -> str:
    """One line: what this run lacks, and the shipped run (the exercise's own) that has it."""
    line = tr("{id}: this run ({run}) lacks {what}; the shipped run {name} has it").format(
        id=ex.id, run=tr("this run") if lacks.run is None else run_label(lacks.run), what=tr(lacks.what),
        name=ex.default_run)
    return line + f' — check(…, run="{ex.default_run}")'  # code: the same in every language


def matches(answer: Any, expected: Any, rel: float = 1e-6, abs: float = 1e-9) -> bool:
    """Whether ``answer`` equals ``expected``: numbers within ``rel``/``abs``, bools and strings exactly
    (strings ignoring case and surrounding blanks), sequences and dicts element by element. A bool never
    matches a number (``True`` is not an answer to "how many")."""
    if isinstance(expected, bool) or isinstance(answer, bool):
        return isinstance(answer, bool) and isinstance(expected, bool) and answer == expected
    if hasattr(answer, "item") and getattr(answer, "ndim", 1) == 0:
        answer = answer.item()
    if hasattr(expected, "item") and getattr(expected, "ndim", 1) == 0:
        expected = expected.item()
    if isinstance(expected, (int, float)):
        if not isinstance(answer, (int, float)):
            return False
        if math.isnan(expected) or math.isnan(answer):
            return math.isnan(expected) and math.isnan(answer)
        return math.isclose(answer, expected, rel_tol=rel, abs_tol=abs)
    if isinstance(expected, str):
        return isinstance(answer, str) and answer.strip().lower() == expected.strip().lower()
    if isinstance(expected, dict):
        return (isinstance(answer, dict) and set(answer) == set(expected)
                and all(matches(answer[k], expected[k], rel, abs) for k in expected))
    if isinstance(expected, (list, tuple)):
        if hasattr(answer, "tolist"):
            answer = answer.tolist()
        return (isinstance(answer, (list, tuple)) and len(answer) == len(expected)
                and all(matches(a, e, rel, abs) for a, e in zip(answer, expected)))
    if isinstance(expected, (set, frozenset)):
        return isinstance(answer, (set, frozenset, list, tuple)) and set(answer) == set(expected)
    return answer == expected


def check(id: str, answer: Any, **context: Any) -> Verdict:
    """Check ``answer`` to exercise ``id`` against the truth computed now (``context``: e.g. ``run=RUN``).

    Returns a :class:`Verdict` (truthy when right). Unanswered (``...``) is not a wrong try and never raises.
    """
    ex = _get(id)
    if answer is UNANSWERED:
        return Verdict(id, False, False,
                       tr("{id}: not answered yet — replace `...` with your answer and run again.").format(id=id))
    try:
        if "run" in ex.context and not isinstance(context.get("run"), (tuple, list)):
            require(context.get("run"), *ex.needs, default=ex.default_run)
        expected = ex.compute(**context)
    except RunLacks as e:  # the run lacks the mechanism: not a wrong try, and not an error
        return Verdict(id, False, True, _lacks_message(ex, e))
    if matches(answer, expected, ex.rel, ex.abs):
        _TRIES.pop(id, None)
        return Verdict(id, True, True, tr("{id}: right.").format(id=id))
    tries = _TRIES.get(id, 0)
    _TRIES[id] = tries + 1
    shown = hints(id, context.get("run"))[: min(tries + 1, len(ex.hints))]
    text = "\n".join(tr("  hint {i}: {hint}").format(i=i + 1, hint=h) for i, h in enumerate(shown))
    return Verdict(id, False, True, tr("{id}: not yet.").format(id=id) + "\n" + text)
