"""Exercise checks for the labs: the truth is computed at call time, never typed into a notebook.

A lab cell ships unanswered::

    answer = ...                      # your prediction: pg_clipfrac of step 1, optimizer step 3, at ε = 0.1
    check("04.2", answer, run=RUN)

``check`` computes the true value with ``ppolab.algos`` on the recorded run (or on the numbers the exercise
states), compares, and answers **right**, or **not yet** with a hint that grows with each wrong try: first a
nudge, then the formula. An unanswered exercise (``...``) is reported as such.

Accepted forms (:func:`matches`): every natural form of the right answer passes.

* A number or a bool may be given as a tensor or numpy array holding one element, of any shape (``()``, ``(1,)``,
  ``(1, 1)`` — what the worked examples' ``t(x) = torch.tensor([[x]])`` builds), or as a numpy scalar; numpy and
  torch bools count as bools. A bool never matches a number, nor a number a bool.
* Numbers match within the exercise's ``rel``/``abs`` tolerance; NaN matches only NaN.
* Strings match ignoring case and surrounding blanks, also inside sequences, sets and dicts (keys too). Where the
  truth is a KL estimator's name, verl's aliases are the same name: ``low_var_kl`` = ``k3``, ``kl`` = ``k1``,
  ``mse`` = ``k2``, each with its ``+`` form too (:func:`ppolab.algos.kl.canonical_kl_name`).
* A sequence may be a list, a tuple or a tensor/array (compared as its ``tolist``), element by element.
* A set may be a set, frozenset, list or tuple; members are compared one by one, not hashed, so members that are
  lists do not raise.

``check`` never raises on the learner's side: an answer of another form (None, a dict where a number is asked for, a
tensor of many elements, a function …) is a wrong try whose message says in one line which form was expected and
which was given. A truth that cannot be computed is one line naming the error as a ppolab bug.

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

Kinds: every exercise says what kind of work it asks for (``kind``, one of :data:`KINDS`). A ``lookup`` can be
answered without real work — a fact the lab or the chapter states, a value of the run's config or log, or one stated
formula applied to stated numbers; ``compute`` works on a run's tensors (often a counterfactual setting the log does
not hold) or through a derivation the lab does not print; ``predict`` asks for a prediction ("Predict, then verify")
that an explorer or a figure of the lab then reveals; ``code`` has the learner write code, graded on what it computes.
``tests/test_exercise_kinds.py`` keeps the lookups few and checks that the other kinds are what they claim.
"""
from __future__ import annotations

import importlib
import inspect
import json
import math
import pkgutil
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from ppolab.algos.kl import canonical_kl_name
from ppolab.i18n import get_language, set_language, tr
from ppolab.numbers.needs import NEEDS, RunLacks, require, run_label

__all__ = ["Exercise", "KINDS", "Verdict", "case", "check", "exercise", "hints", "matches", "prompt", "registry",
           "reset",
           "set_language", "truth", "UNANSWERED"]

#: The kinds of work an exercise can ask for (see the module docstring).
KINDS = ("lookup", "compute", "predict", "code")

#: What an unanswered exercise holds: ``answer = ...``.
UNANSWERED = Ellipsis


@dataclass(frozen=True)
class Exercise:
    """One checked exercise.

    ``compute(**context)`` returns the truth; ``rel``/``abs`` are the tolerances for numbers (a prediction
    read off a figure needs a looser one than a recomputation); ``hints`` are shown one more per wrong try.
    ``needs`` names what the run must have (:data:`ppolab.numbers.NEEDS`), ``case(run)`` the numbers that fill the
    prompt's and hints' ``{fields}``, and ``default_run`` the shipped run the exercise is written for (``run=None``).
    ``kind`` is one of :data:`KINDS` (None only for an exercise not yet tagged; the tests refuse it).
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
    kind: str | None = None

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
_TRIES_LOCK = threading.Lock()  # check() may run in several threads; each wrong try counts once
_LOADED = False


def exercise(id: str, prompt: str, hints: tuple[str, ...] | list[str], *, rel: float = 1e-6, abs: float = 1e-9,
             context: tuple[str, ...] = (), needs: tuple[str, ...] = (), case: Callable[..., dict] | None = None,
             default_run: str = "grpo_tiny", kind: str | None = None
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn(**context) -> truth`` as exercise ``id`` (``"NN.k"``). At least two hints:
    the first a nudge, the last the formula. ``needs``, ``case``, ``default_run``, ``kind``: see :class:`Exercise`."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"exercise {id}: kind {kind!r} is not one of {', '.join(KINDS)}")
    if len(hints) < 2:
        raise ValueError(f"exercise {id}: give at least two hints (a nudge, then the formula)")
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"exercise {id}: unknown needs {sorted(unknown)}; known: {', '.join(NEEDS)}")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if id in _REGISTRY and _REGISTRY[id].compute is not fn:
            raise ValueError(f"exercise {id!r} is registered twice")
        _REGISTRY[id] = Exercise(id, prompt, fn, tuple(hints), rel, abs, tuple(context), tuple(needs), case,
                                 default_run, kind)
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


def _size(x: Any) -> int | None:
    """How many elements ``x`` holds if it is a tensor or an array (a numpy scalar: 1); None for anything else."""
    if isinstance(x, (bool, int, float, str, bytes, list, tuple, dict, set, frozenset)) or x is None:
        return None
    numel = getattr(x, "numel", None)
    if callable(numel) and hasattr(x, "shape"):  # torch.Tensor
        return int(numel())
    size = getattr(x, "size", None)
    if isinstance(size, int) and hasattr(x, "shape") and hasattr(x, "item"):  # numpy array or scalar, pandas
        return size
    return None


def _scalar(x: Any) -> Any:
    """A one-element tensor or array of any shape ((), (1,), (1, 1)) or a numpy scalar as the Python number or bool
    it holds; anything else unchanged."""
    return x.item() if _size(x) == 1 else x


def _elements(x: Any, cap: int = 10**7) -> int:
    """How many numbers ``x`` holds — a tensor's or array's size, a container's items counted recursively (up to
    ``cap``) — without converting anything."""
    size = _size(x)
    if size is not None:
        return size
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple, set, frozenset)):
        total = 0
        for item in x:
            total += _elements(item, cap - total)
            if total >= cap:
                break
        return max(total, len(x))
    return 1


#: An answer may hold this many more numbers than the truth before it is refused unread (a 4·10⁷-element tensor
#: converted to lists for the comparison would cost gigabytes).
ANSWER_SLACK = 1000


def _oversized(answer: Any, expected: Any) -> str | None:
    """The one line for an answer far larger than anything the exercise asks for; None when its size is plausible."""
    limit = 10 * _elements(expected) + ANSWER_SLACK
    n = _elements(answer, cap=limit + 1)
    if n <= limit:
        return None
    return tr("  expected {expected}, got {n} or more numbers — far more than the answer holds; give the value the "
              "exercise asks for.").format(expected=_expected_form(_plain_expected(expected)), n=f"{n:,}")


def _listed(x: Any) -> Any:
    """A tensor or array as nested Python lists (``tolist``); anything else unchanged."""
    return x.tolist() if _size(x) is not None and hasattr(x, "tolist") else x


def _kind(x: Any) -> str:
    """The form of an expected value: bool, number, string, dict, set, sequence, or other."""
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, (int, float)):
        return "number"
    if isinstance(x, str):
        return "string"
    if isinstance(x, dict):
        return "dict"
    if isinstance(x, (set, frozenset)):
        return "set"
    if isinstance(x, (list, tuple)):
        return "sequence"
    return "other"


def _plain_expected(expected: Any) -> Any:
    """A truth held in a tensor or array, as a Python scalar (one element) or nested lists."""
    expected = _scalar(expected)
    return _listed(expected)


def _answer_for(answer: Any, kind: str) -> Any:
    """``answer`` in the form an expected value of ``kind`` is compared with: one-element tensors and numpy scalars
    as Python scalars where one value is expected, tensors and arrays as lists where a sequence or set is."""
    if kind in ("bool", "number", "string"):
        return _scalar(answer)
    if kind in ("sequence", "set"):
        return _listed(answer)
    return answer


_EXACT = (bool, int, float, str, type(None))


def _exact(x: Any) -> Any:
    """``x`` rebuilt from exact built-in types, read through the built-in types' own methods: a subclass of str,
    int, float, list, tuple, dict, set (or a numpy float64) becomes the plain value it holds, so none of its methods
    (``__eq__``, ``__iter__``, ``lower`` …) takes part in a verdict. Tensors, arrays and other objects are left as
    they are (:func:`_answer_for` turns tensors and arrays into Python values, then this runs again)."""
    t = type(x)
    if t in _EXACT:
        return x
    if isinstance(x, bool):  # unreachable (bool cannot be subclassed), kept for the order of the tests below
        return bool.__bool__(x)
    if isinstance(x, int):
        return int.__int__(x)  # an exact int, whatever the subclass defines
    if isinstance(x, float):
        return float.__float__(x)
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, (list, tuple)):
        base = list if isinstance(x, list) else tuple
        return base(_exact(item) for item in base.__iter__(x))
    if isinstance(x, dict):
        return {_exact(k): _exact(v) for k, v in dict.items(x)}
    if isinstance(x, (set, frozenset)):
        base = set if isinstance(x, set) else frozenset
        return base(_exact(m) for m in base.__iter__(x))
    return x


def _matches(answer: Any, expected: Any, rel: float, abs: float) -> bool:
    """:func:`matches` without the guard: may raise on an odd answer. Both sides are compared as exact built-in
    values (:func:`_exact`), the truth on the left of every ``==``."""
    expected = _exact(_plain_expected(expected))
    kind = _kind(expected)
    answer = _exact(_answer_for(_exact(answer), kind))
    if kind == "bool":
        return isinstance(answer, bool) and answer == expected
    if kind == "number":
        if isinstance(answer, bool) or not isinstance(answer, (int, float)):
            return False
        if math.isnan(expected) or math.isnan(answer):
            return math.isnan(expected) and math.isnan(answer)
        # an answer rounded to the decimals a prompt asks for is off by up to abs = half a unit; in floats that
        # half can land a hair over (round(0.0625, 3) = 0.062 is 0.0005000…004 away): a slack far below any unit
        return math.isclose(answer, expected, rel_tol=rel, abs_tol=abs + 1e-12 if abs else 0.0)
    if kind == "string":
        if not isinstance(answer, str):
            return False
        a, e = answer.strip().lower(), expected.strip().lower()
        kl = canonical_kl_name(e)  # verl's aliases of a KL estimator (low_var_kl = k3), and only of those
        return canonical_kl_name(a) == kl if kl is not None else a == e
    if kind == "dict":
        return isinstance(answer, dict) and len(answer) == len(expected) and not _dict_off(answer, expected, rel, abs)
    if kind == "sequence":
        return (isinstance(answer, (list, tuple)) and len(answer) == len(expected)
                and all(_matches(a, e, rel, abs) for a, e in zip(answer, expected)))
    if kind == "set":  # compared member by member, not hashed: members may be lists, strings compare loosely
        if not isinstance(answer, (set, frozenset, list, tuple)):
            return False
        members = list(answer)
        return (all(any(_matches(a, e, rel, abs) for e in expected) for a in members)
                and all(any(_matches(a, e, rel, abs) for a in members) for e in expected))
    # another kind of truth: equal only as an object of the truth's own type (an answer's subclass would get its
    # reflected __eq__ called first and could claim to equal anything)
    return type(answer) is type(expected) and bool(expected == answer)


def matches(answer: Any, expected: Any, rel: float = 1e-6, abs: float = 1e-9) -> bool:
    """Whether ``answer`` equals ``expected``; never raises (an answer it cannot compare does not match).

    Numbers within ``rel``/``abs``; bools exactly, and a bool never matches a number (``True`` is not an answer to
    "how many"); strings ignoring case and surrounding blanks, verl's aliases of a KL estimator equal to ppolab's
    names (:func:`ppolab.algos.kl.canonical_kl_name`); sequences element by element; dicts key by key (string keys
    loosely too); sets member by member (the answer may be a list or tuple; members may be lists). A tensor or array
    with one element (shape (), (1,), (1, 1) …) and a numpy scalar count as the number or bool they hold; a larger
    one as the list ``tolist`` gives."""
    try:
        return _matches(answer, expected, rel, abs)
    except Exception:  # noqa: BLE001 — whatever the learner passes, the verdict is "not yet", never a traceback
        return False


def _expected_form(expected: Any) -> str:
    """What form of answer ``expected`` asks for, in words."""
    expected = _plain_expected(expected)
    kind = _kind(expected)
    if kind == "bool":
        return tr("True or False")
    if kind == "number":
        return tr("a number")
    if kind == "string":
        return tr("a string")
    if kind == "sequence":  # a tuple's length is fixed by the prompt; a list's length is part of the answer
        return (tr("a sequence of length {n}").format(n=len(expected)) if isinstance(expected, tuple)
                else tr("a list"))
    if kind == "set":
        return tr("a set (or a list)")
    if kind == "dict":
        return tr("a dict")
    return tr("an object of type {type}").format(type=type(expected).__name__)


def _given_form(answer: Any) -> str:
    """What form ``answer`` has, in words (a tensor's shape, a sequence's length)."""
    if answer is None:
        return "None"
    if type(answer).__module__ == "numpy" and getattr(answer, "shape", None) == ():  # a numpy scalar
        answer = answer.item()
    if isinstance(answer, bool):
        return tr("the bool {value}").format(value=answer)
    if isinstance(answer, (int, float)):
        return tr("the number {value}").format(value=answer)
    if isinstance(answer, str):
        return tr("the string {value}").format(value=repr(answer if len(answer) <= 40 else answer[:40] + "…"))
    if _size(answer) is not None:
        shape = tuple(int(d) for d in answer.shape)
        if callable(getattr(answer, "numel", None)):
            return tr("a tensor of shape {shape}").format(shape=shape)
        return tr("an array of shape {shape}").format(shape=shape)
    if isinstance(answer, list):
        return tr("a list of length {n}").format(n=len(answer))
    if isinstance(answer, tuple):
        return tr("a tuple of length {n}").format(n=len(answer))
    if isinstance(answer, (set, frozenset)):
        return tr("a set of size {n}").format(n=len(answer))
    if isinstance(answer, dict):
        return tr("a dict of size {n}").format(n=len(answer))
    if hasattr(answer, "__next__"):
        return tr("a generator (pass a list or a tuple of its values)")
    if callable(answer):
        return tr("a function (pass the value it returns, not the function)")
    return tr("an object of type {type}").format(type=type(answer).__name__)


def _form_problem(answer: Any, expected: Any) -> str | None:
    """One phrase saying how the form of ``answer`` differs from the form ``expected`` asks for (for a sequence or
    dict: of which item), or None when the forms agree (the value itself is then what is wrong)."""
    expected = _exact(_plain_expected(expected))
    kind = _kind(expected)
    given = _exact(_answer_for(_exact(answer), kind))
    fits = {"bool": lambda: isinstance(given, bool),  # each test only for its own kind (len() of a number raises)
            "number": lambda: isinstance(given, (int, float)) and not isinstance(given, bool),
            "string": lambda: isinstance(given, str), "dict": lambda: isinstance(given, dict),
            "set": lambda: isinstance(given, (set, frozenset, list, tuple)),
            "sequence": lambda: isinstance(given, (list, tuple))
            and (len(given) == len(expected) or not isinstance(expected, tuple))}.get(kind, lambda: True)()
    if not fits:
        return tr("expected {expected}, got {given}").format(expected=_expected_form(expected),
                                                             given=_given_form(answer))
    if kind == "number" and isinstance(given, int) and abs(given).bit_length() > 1023:  # no float holds it
        return tr("expected {expected}, got an integer of about {digits} digits, beyond the range of a float"
                  ).format(expected=_expected_form(expected), digits=int(abs(given).bit_length() * math.log10(2)) + 1)
    if kind == "number" and isinstance(expected, float) and 0 <= expected <= 1 and 1 < given <= 100 \
            and math.isclose(given / 100, expected, rel_tol=0.02, abs_tol=5e-4):
        # a share given in per cent: say so, rather than a bare "not yet"
        return tr("expected a fraction between 0 and 1, got {given} — a percentage? Give it as {given} / 100"
                  ).format(given=f"{given:g}")
    if kind == "sequence" and len(given) == len(expected):
        for i, (a, e) in enumerate(zip(given, expected)):
            inner = _form_problem(a, e)
            if inner is not None:
                return tr("item {i}: {problem}").format(i=i + 1, problem=inner)
    return None


def _form_line(answer: Any, expected: Any, crashed: bool) -> str | None:
    """The line a wrong answer of the wrong form gets (always one when comparing it raised); never raises."""
    try:
        problem = _form_problem(answer, expected)
    except Exception:  # noqa: BLE001
        problem = None
    if problem is None and crashed:
        try:
            problem = tr("expected {expected}, got {given}").format(expected=_expected_form(expected),
                                                                    given=_given_form(answer))
        except Exception:  # noqa: BLE001
            problem = tr("expected {expected}, got {given}").format(
                expected=tr("another kind of answer"),
                given=tr("an object of type {type}").format(type=type(answer).__name__))
    return None if problem is None else tr("  {problem}.").format(problem=problem)


def _dict_off(answer: dict, expected: dict, rel: float, abs: float) -> list:
    """The keys of ``expected`` that ``answer`` misses (no key, or two, match it loosely) or gets the value of wrong."""
    off = []
    for key, value in expected.items():
        keys = [k for k in answer if _matches(k, key, rel, abs)]
        if len(keys) != 1 or not _matches(answer[keys[0]], value, rel, abs):
            off.append(key)
    return off


def _off_keys(answer: Any, expected: Any, rel: float, abs: float) -> tuple[list, int]:
    """(the keys of a dict truth whose value ``answer`` — a dict — misses or gets wrong, how many keys the truth
    has); nothing off for any other form."""
    try:
        expected, answer = _exact(_plain_expected(expected)), _exact(answer)
        if not (isinstance(expected, dict) and isinstance(answer, dict)):
            return [], 0
        return _dict_off(answer, expected, rel, abs), len(expected)
    except Exception:  # noqa: BLE001 — a courtesy line: the verdict stands without it
        return [], 0


def _one_line(error: BaseException) -> str:
    """``error`` as ``Type: message`` on one short line."""
    text = " ".join(str(error).split())
    text = text if len(text) <= 160 else text[:160] + "…"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _accepted(fn: Callable[..., Any], context: dict) -> dict:
    """The part of ``context`` that ``fn`` takes (a learner may pass ``run=RUN`` to an exercise that needs none)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return context
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return context
    return {k: v for k, v in context.items() if k in params}


def check(id: str, answer: Any, **context: Any) -> Verdict:
    """Check ``answer`` to exercise ``id`` against the truth computed now (``context``: e.g. ``run=RUN``).

    Returns a :class:`Verdict` (truthy when right) and never raises. Unanswered (``...``) is not a wrong try. An
    answer of another form than the one asked for (None, a tensor of many elements where a number is asked for …) is
    a wrong try whose message says which form was expected. A run that lacks what the exercise needs gets the one
    "lacks" line; a run that cannot be read, one line saying so; a truth that cannot be computed, one line naming
    the error as a ppolab bug to report (the solution tests see it as not right).
    """
    try:
        ex = _get(id)
    except KeyError:  # a typo in the id: say which ids exist
        return Verdict(str(id), False, False, tr("no exercise {id}; the labs' exercises are {ids}").format(
            id=repr(id), ids=", ".join(registry())))
    if answer is UNANSWERED:  # the cell that asks states the task, built from the run the lab is open on
        line = tr("{id}: not answered yet — replace `...` with your answer and run again.").format(id=id)
        try:
            task = prompt(id, context.get("run"))
        except Exception:  # noqa: BLE001 — the task line is a courtesy: the verdict stands without it
            task = ""
        return Verdict(id, False, False, line + ("\n\n" + tr("The task: {prompt}").format(prompt=task) if task else ""))
    try:
        if "run" in ex.context and not isinstance(context.get("run"), (tuple, list)):
            require(context.get("run"), *ex.needs, default=ex.default_run)
    except RunLacks as e:  # the run lacks the mechanism: not a wrong try, and not an error
        return Verdict(id, False, True, _lacks_message(ex, e))
    except Exception as e:  # noqa: BLE001 — a path that is no run, a torn file: say so in one line
        return Verdict(id, False, True, tr("{id}: could not read the run {run} ({error}).").format(
            id=id, run=context.get("run"), error=_one_line(e)))
    try:
        expected = ex.compute(**_accepted(ex.compute, context))
    except RunLacks as e:
        return Verdict(id, False, True, _lacks_message(ex, e))
    except Exception as e:  # noqa: BLE001 — ppolab's own bug: one line in the notebook, not-ok in the tests
        return Verdict(id, False, True, tr("{id}: ppolab could not compute the answer ({error}) — a bug in ppolab, "
                                           "please report it.").format(id=id, error=_one_line(e)))
    try:
        oversized = _oversized(answer, expected)
    except Exception:  # noqa: BLE001
        oversized = None
    try:
        ok, crashed = (False, False) if oversized else (_matches(answer, expected, ex.rel, ex.abs), False)
    except Exception:  # noqa: BLE001
        ok, crashed = False, True
    with _TRIES_LOCK:
        if ok:
            _TRIES.pop(id, None)
        else:
            tries = _TRIES.get(id, 0)
            _TRIES[id] = tries + 1
    if ok:
        return Verdict(id, True, True, tr("{id}: right.").format(id=id))
    try:
        all_hints = hints(id, context.get("run"))
    except Exception:  # noqa: BLE001 — a case finder that cannot read this run: the hints unfilled
        all_hints = ex.hints
    shown = all_hints[: min(tries + 1, len(all_hints))]
    lines = [tr("{id}: not yet.").format(id=id)]
    form = oversized or _form_line(answer, expected, crashed)
    if form is not None:
        lines.append(form)
    elif ex.kind == "predict" and not crashed:  # a prediction per knob gets a verdict per knob
        off, keys = _off_keys(answer, expected, ex.rel, ex.abs)
        if off:
            lines.append((tr("  off: {keys}; the others are right.") if len(off) < keys else
                          tr("  off: every one ({keys}).")).format(keys=", ".join(map(str, off))))
    lines += [tr("  hint {i}: {hint}").format(i=i + 1, hint=h) for i, h in enumerate(shown)]
    return Verdict(id, False, True, "\n".join(lines))
