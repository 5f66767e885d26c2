"""Rule rewards with verl's custom-reward signature.

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

``gsm8k`` follows ``verl/utils/reward_score/gsm8k.py``: ``strict`` takes the last ``#### <number>``
(commas and ``$`` stripped), ``flexible`` the last number anywhere; a found but wrong answer earns
``format_score``, no answer earns 0. ``arith`` is the strict rule, comparing integers; ``arith_tool`` (the
calculator agent task) the same rule on the text after the last tool response. A user's
function is loaded the way verl reads ``custom_reward_function.path`` / ``.name``.
"""

from __future__ import annotations

import _thread
import copy
import functools
import hashlib
import importlib.util
import inspect
import math
import numbers
import os
import queue
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ppolab.i18n import Sign

RewardFn = Callable[..., Any]  # returns a float or a dict with a "score" key

_CLIP_CHARS = 300  # verl only searches the last 300 characters (answers come last; long regexes are slow)
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def gsm8k_extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string, or None when there is none."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    text = solution_str[-_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    for candidate in reversed(_NUMBER.findall(text)):
        if candidate not in ("", "."):
            return candidate
    return None


def gsm8k_compute_score(
    solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` if the extracted answer equals ``ground_truth``, ``format_score`` if wrong, 0 if none."""
    answer = gsm8k_extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == ground_truth else format_score


def arith_compute_score(
    solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0
) -> float:
    """The strict ``#### <number>`` rule; ``#### 085`` and ``#### 85`` both match ``"85"``."""
    answer = gsm8k_extract_solution(solution_str, "strict")
    if answer is None:
        return 0.0
    try:
        correct = int(answer) == int(ground_truth)
    except ValueError:  # "8.5", "1.2.3", "-" are answers, just not integers
        correct = answer == ground_truth
    return score if correct else format_score


_TOOL_RESPONSE_END = "<|/tool_response|>"


def arith_tool_compute_score(
    solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0
) -> float:
    """``arith`` on the final answer of a tool-agent trajectory: only the text after the last
    ``<|/tool_response|>`` counts when the markers are there (decoded with special tokens); the trainer decodes
    without them, where the call and observation digits come first and the last ``#### <number>`` still wins."""
    final = solution_str.rsplit(_TOOL_RESPONSE_END, 1)[-1]
    return arith_compute_score(final, ground_truth, format_score, score)


def arith_score_components(
    solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0, tool: bool = False
) -> dict[str, float]:
    """The ``arith`` rule as verl's dict return: ``score`` (what the trainer optimises) plus two components a
    multi-reward estimator (``gdpo``) can use — ``acc`` (1 if the ``####`` answer is right) and ``format`` (1 if
    there is a ``#### <number>`` answer at all)."""
    text = solution_str.rsplit(_TOOL_RESPONSE_END, 1)[-1] if tool else solution_str
    value = arith_compute_score(text, ground_truth, format_score, score)
    has_answer = gsm8k_extract_solution(text, "strict") is not None
    correct = has_answer and arith_compute_score(text, ground_truth, 0.0, 1.0) == 1.0
    return {"score": value, "acc": float(correct), "format": float(has_answer)}


# Namespaces so callers can write ``rewards.gsm8k.compute_score`` like verl's module layout.
gsm8k = SimpleNamespace(extract_solution=gsm8k_extract_solution, compute_score=gsm8k_compute_score)
arith = SimpleNamespace(compute_score=arith_compute_score)
arith_tool = SimpleNamespace(compute_score=arith_tool_compute_score)

_BY_SOURCE: dict[str, Callable[..., float | dict[str, float]]] = {
    "arith": arith_score_components,
    "arith_tool": functools.partial(arith_score_components, tool=True),
    "openai/gsm8k": gsm8k_compute_score,
    "gsm8k": gsm8k_compute_score,
}


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs: Any
) -> float | dict[str, float]:
    """The default reward: picks the rule by ``data_source``; ``kwargs`` go to the rule. The arithmetic tasks
    return verl's dict form (``score`` plus the components ``acc`` and ``format``), GSM8K a float, as verl."""
    fn = _BY_SOURCE.get(data_source)
    if fn is None:
        raise NotImplementedError(
            f"no built-in reward for data_source={data_source!r} (known: {sorted(_BY_SOURCE)}); "
            "set custom_reward_function.path to a file defining compute_score"
        )
    return fn(solution_str, ground_truth, **kwargs)


def load_custom_reward_fn(path: str | os.PathLike, name: str = "compute_score") -> RewardFn:
    """Load function ``name`` from the Python file at ``path`` (verl's custom_reward_function)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"custom_reward_function.path: reward function file '{path}' not found")
    # One module name per file, so two custom files never replace each other in sys.modules.
    module_name = "ppolab_custom_reward_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"custom_reward_function.path: cannot import '{path}' as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # a syntax error, a failing import, even sys.exit() at import time: name the file
        from ppolab.errors import RewardError

        sys.modules.pop(module_name, None)
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        raise RewardError(f"custom_reward_function.path: importing '{path}'{where} raised {type(e).__name__}: {e}; "
                          "fix the file") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"custom_reward_function.name: reward function '{name}' not found in '{path}'")
    return fn


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def get_reward_fn(custom_reward_function: Any = None) -> RewardFn:
    """The callable for a ``custom_reward_function`` config (dict, OmegaConf node or object).

    No config or an empty ``path`` gives the built-in ``compute_score``; otherwise the user's
    function, called with ``reward_kwargs`` added as verl does.
    """
    path = _cfg_get(custom_reward_function, "path") if custom_reward_function is not None else None
    if not path:
        return compute_score
    fn = load_custom_reward_fn(path, _cfg_get(custom_reward_function, "name") or "compute_score")
    reward_kwargs = dict(_cfg_get(custom_reward_function, "reward_kwargs") or {})
    if not reward_kwargs:
        return fn

    @functools.wraps(fn)  # __wrapped__: errors name the user's function, not this wrapper
    def with_kwargs(*args: Any, **kwargs: Any) -> float | dict[str, Any]:
        return fn(*args, **kwargs, **reward_kwargs)

    return with_kwargs


# ----------------------------------------------------------------------------- checked calls and warning signs
def describe_reward_fn(fn: Any) -> str:
    """``'compute_score' in /path/to/file.py``: the function a reward error is about (wrappers unwrapped)."""
    fn = inspect.unwrap(fn)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    try:
        where = inspect.getsourcefile(fn) or inspect.getfile(fn)
    except TypeError:  # a builtin or a callable object without source
        where = getattr(type(fn), "__module__", "?")
    return f"{name!r} in {where}"


def _short(text: Any, limit: int = 120) -> str:
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 5] + "…" + r[-4:]


def checked_score(result: Any) -> float:
    """The score of one reward call, or ValueError saying what is wrong with ``result``: a finite number, or a
    dict whose ``"score"`` is one (verl's two return types); NaN/inf, None, strings and other dicts are refused."""
    value = result
    if isinstance(result, Mapping):
        if "score" not in result:
            raise ValueError(f"returned a dict without a 'score' key ({_short(dict(result))})")
        value = result["score"]
    as_score = " as 'score'" if value is not result else ""
    if not isinstance(value, numbers.Real) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # a 0-d numpy array or torch tensor
    if not isinstance(value, numbers.Real):
        what = "None" if value is None else f"a {type(value).__name__} ({_short(value)})"
        raise ValueError(f"returned {what}{as_score}, not a number")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"returned {value}{as_score}, not a finite number")
    return value


class _Watchdog:
    """One daemon thread that watches the reward calls in progress (one per thread that scores): it prints a line
    naming a slow call after ``warn_s`` and, past ``timeout_s``, interrupts a call made on the main thread
    (``_thread.interrupt_main``), which :func:`call_reward_with_info` turns into a
    :class:`ppolab.errors.RewardError`. On the main thread nothing runs in another thread but the watching: rewards
    that use signals themselves (``signal.alarm`` timeouts) keep working. A call stuck inside C code that never
    returns to Python cannot be interrupted; the line still names it. A call made on another thread (a
    ``train_in_background`` training) is timed by :func:`_call_abandonable` instead; here it is only named."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[int, dict[str, Any]] = {}  # token → the call in progress (one per scoring thread)
        self.fired: set[int] = set()  # calls whose timeout interrupted the main thread
        self.late: set[int] = set()  # of those, the ones already ended (their interrupt may land a moment later)
        self.counter = 0
        self.thread: threading.Thread | None = None

    def begin(self, what: str, timeout_s: float | None) -> int:
        """Start watching a call; only a call on the main thread is interrupted from here."""
        with self.lock:
            self.counter += 1
            warn = min(SLOW_REWARD_WARN_S, timeout_s / 2) if timeout_s else SLOW_REWARD_WARN_S
            main = threading.current_thread() is threading.main_thread()
            self.calls[self.counter] = {"token": self.counter, "what": what, "start": time.monotonic(),
                                        "warn": warn, "timeout": timeout_s, "interrupt": main, "warned": False}
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._watch, name="ppolab-reward-watchdog", daemon=True)
                self.thread.start()
            return self.counter

    def end(self, token: int) -> bool:
        """Close call ``token``; True when its timeout fired."""
        with self.lock:
            self.calls.pop(token, None)
            fired = token in self.fired
            if fired:
                self.fired.discard(token)
                self.late.add(token)
            return fired

    def _watch(self) -> None:
        while True:
            time.sleep(0.05)
            with self.lock:
                for call in list(self.calls.values()):
                    elapsed = time.monotonic() - call["start"]
                    if not call["warned"] and elapsed >= call["warn"]:
                        call["warned"] = True
                        limit = (f"it is stopped after {call['timeout']:g} s" if call["timeout"] else
                                 "no time limit is set")
                        print(f"ppolab: the reward function {call['what']} has been running for {elapsed:.0f} s "
                              f"({limit}: custom_reward_function.timeout_s)", file=sys.stderr, flush=True)
                    if call["interrupt"] and call["timeout"] and elapsed >= call["timeout"] \
                            and call["token"] not in self.fired:
                        self.fired.add(call["token"])
                        _interrupt_main_thread()


class _Abandoned(Exception):
    """A reward call off the main thread ran past its ``timeout_s`` and was left running (:func:`_call_abandonable`)."""


class _RewardWorker:
    """A daemon thread that makes the reward calls of one scoring thread, one at a time (kept for the next call: a
    thread per call costs ~20x the built-in rule itself)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.owner = threading.current_thread()
        threading.Thread(target=self._serve, name="ppolab-reward-call", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                fn, args, out, done = self.jobs.get(timeout=5.0)
            except queue.Empty:
                if not self.owner.is_alive():  # its training ended: no call will come
                    return
                continue
            try:
                out["result"] = fn(*args)
            except BaseException as e:  # SystemExit, KeyboardInterrupt too: the caller names them
                out["error"] = e
            finally:
                done.set()
            del fn, args, out, done  # hold nothing of a finished call while waiting for the next


_WORKERS = threading.local()  # the worker of each scoring thread


def _call_abandonable(fn: RewardFn, args: tuple, timeout_s: float) -> Any:
    """``fn(*args)`` made on a daemon worker thread that the calling thread waits for at most ``timeout_s`` s.

    Off the main thread a hung call cannot be interrupted (a signal reaches the main thread only, and an exception
    set into a thread is seen only when it runs Python again — never inside ``Event.wait()`` or a socket read), and
    a Python thread cannot be killed. So the call runs on a worker, and past its limit it is abandoned: that worker
    stays blocked (a daemon: it never holds up the interpreter's exit) and is replaced, while the caller raises
    :class:`_Abandoned` and goes on. Whatever ``fn`` raises is raised in the caller, as if called there."""
    worker = getattr(_WORKERS, "worker", None) or _RewardWorker()
    _WORKERS.worker = worker
    done, out = threading.Event(), {}
    worker.jobs.put((fn, args, out, done))
    if not done.wait(timeout_s):
        _WORKERS.worker = None  # left to its hung call
        raise _Abandoned
    if "error" in out:
        raise out.pop("error")
    return out["result"]


def _interrupt_main_thread() -> None:
    """A real SIGINT to the main thread: it also wakes a blocking call (``time.sleep``, a socket read), which
    ``_thread.interrupt_main``'s simulated one does not."""
    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    else:
        _thread.interrupt_main()


_WATCHDOG = _Watchdog()
#: Seconds after which a reward call still running is named on stderr (sooner when timeout_s / 2 is shorter).
SLOW_REWARD_WARN_S = 10.0
#: ``custom_reward_function.timeout_s``'s default: generous for a rule, enough for a slow judge model.
DEFAULT_REWARD_TIMEOUT_S = 300.0


class _SigintSeen:
    """While scoring on the main thread: remember whether a real SIGINT (Ctrl-C, a notebook's interrupt) arrived,
    so a KeyboardInterrupt the reward raised itself, or the watchdog's, is told apart from the user's."""

    def __init__(self) -> None:
        self.seen, self.previous, self.active = False, None, False

    def __enter__(self) -> _SigintSeen:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handler)
            self.active = True
        return self

    def _handler(self, signum: int, frame: Any) -> None:
        if not _WATCHDOG.fired:
            self.seen = True
        raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            signal.signal(signal.SIGINT, self.previous)


def call_reward_with_info(fn: RewardFn, data_source: str, solution_str: str, ground_truth: str,
                          extra_info: dict | None = None, timeout_s: float | None = DEFAULT_REWARD_TIMEOUT_S,
                          _sigint: _SigintSeen | None = None) -> tuple[float, dict[str, Any]]:
    """``fn(data_source, solution_str, ground_truth, extra_info)`` as (checked float score, extra info).

    The call is isolated: ``fn`` gets its own deep copy of ``extra_info`` (a change never reaches the dataset, the
    other samples of the prompt or a later validation). Everything that goes wrong becomes a
    :class:`ppolab.errors.RewardError` naming the function (file and name), the offending value and the response
    it scored: an exception, a bad return value, ``sys.exit()`` or a ``KeyboardInterrupt`` raised by the function
    itself (never a clean exit of the run), and a call longer than ``timeout_s`` seconds (None: no limit) —
    interrupted on the main thread, abandoned on any other (:func:`_call_abandonable`: a training in a background
    thread ends with the same error instead of hanging). A real Ctrl-C still interrupts the run as usual."""
    from ppolab.errors import RewardError

    context = f"on the response {_short(solution_str)} (data_source {data_source!r}, ground_truth {ground_truth!r})"
    todo = "" if inspect.unwrap(fn) is compute_score else "; fix the function (custom_reward_function.path)"
    too_slow = (f"reward function {describe_reward_fn(fn)} took more than {timeout_s or 0:g} s {context} and was "
                "stopped; make it faster, or raise custom_reward_function.timeout_s (null: no limit)")
    token = _WATCHDOG.begin(f"{describe_reward_fn(fn)} {context}", timeout_s)
    late = False
    try:
        args = (data_source, solution_str, ground_truth, copy.deepcopy(extra_info))
        # the main thread is interrupted by the watchdog past timeout_s; any other thread cannot be, so there the
        # call is made abandonable — the same limit and the same error either way
        on_main = threading.current_thread() is threading.main_thread()
        result = fn(*args) if on_main or not timeout_s else _call_abandonable(fn, args, timeout_s)
        late = _WATCHDOG.end(token)
        if late:  # it returned as its time ran out: the interrupt is due; let it land here, not in the trainer
            time.sleep(1.0)
    except _Abandoned:
        _WATCHDOG.end(token)
        raise RewardError(too_slow) from None
    except KeyboardInterrupt:
        if _WATCHDOG.end(token) or token in _WATCHDOG.late:
            raise RewardError(too_slow) from None
        if _sigint is None or _sigint.seen:
            raise  # the user's Ctrl-C: the trainer stops cleanly
        raise RewardError(f"reward function {describe_reward_fn(fn)} raised KeyboardInterrupt itself {context}; a "
                          f"reward must return a score{todo}") from None
    except SystemExit as e:
        _WATCHDOG.end(token)
        raise RewardError(f"reward function {describe_reward_fn(fn)} called sys.exit({e.code!r}) {context}: that would "
                          f"end the training without a word; a reward must return a score{todo}") from None
    except Exception as e:
        _WATCHDOG.end(token)
        raise RewardError(f"reward function {describe_reward_fn(fn)} raised {type(e).__name__} {context}: "
                          f"{e}{todo}") from e
    except BaseException as e:  # GeneratorExit and other non-errors: still never a way out of the run
        _WATCHDOG.end(token)
        raise RewardError(f"reward function {describe_reward_fn(fn)} raised {type(e).__name__} {context}; a reward "
                          f"must return a score{todo}") from None
    if late:
        raise RewardError(too_slow)
    try:
        score = checked_score(result)
    except ValueError as e:
        raise RewardError(f"reward function {describe_reward_fn(fn)} {e}, {context}; it must return a finite "
                          "float or a dict with a finite 'score'") from None
    # verl's reward_extra_info: every other key of a dict return (the components gdpo combines)
    extras = {k: v for k, v in result.items() if k != "score"} if isinstance(result, Mapping) else {}
    return score, extras


def score_responses(fn: RewardFn, items: Sequence[Mapping[str, Any]], texts: Sequence[str],
                    timeout_s: float | None = DEFAULT_REWARD_TIMEOUT_S) -> tuple[list[float], list[dict[str, Any]]]:
    """Score every decoded response with verl's reward signature: ``items[i]`` holds the ``data_source``,
    ``ground_truth`` and ``extra_info`` of ``texts[i]``. Returns (checked scores, the extra keys of each dict
    return). The one scoring loop of ppolab: training rewards, ReMax baselines, validation and ``ppolab.eval``;
    each call isolated and timed (:func:`call_reward_with_info`)."""
    scores, extras = [], []
    with _SigintSeen() as sigint:
        for item, text in zip(items, texts, strict=True):  # a NaN, None or crash stops here, naming fn and response
            score, extra = call_reward_with_info(fn, item["data_source"], text, item["ground_truth"],
                                                 item["extra_info"], timeout_s, sigint)
            scores.append(score)
            extras.append(extra)
    return scores, extras


def reward_components(extras: Sequence[Mapping[str, Any]] | None) -> dict[str, list[Any]]:
    """The keys every row's reward returned besides ``score``, as columns (verl's ``non_tensor_batch`` reward keys:
    the components ``gdpo`` combines)."""
    if not extras:
        return {}
    shared = set.intersection(*(set(e) for e in extras))
    return {k: [e[k] for e in extras] for k in sorted(shared)}


#: data sources whose built-in rule compares numbers: a ground truth that is not one can never be matched.
NUMERIC_SOURCES = ("arith", "arith_tool", "gsm8k", "openai/gsm8k")


def reward_warning_signs(metrics: Any) -> list[str]:
    """Warning signs of the score columns of a run's metrics (a DataFrame indexed by step, training steps only):
    non-finite scores (logged as null) and scores that were the same for every response at every step.
    A pure function for :func:`ppolab.widgets.metrics.warning_signs`."""
    out: list[str] = []
    cols = ("critic/score/mean", "critic/score/min", "critic/score/max")
    if any(c not in metrics for c in cols) or len(metrics) == 0:
        return out
    mean = metrics["critic/score/mean"].astype(float)
    bad = mean[~mean.apply(math.isfinite)]
    if len(bad):
        out.append(Sign("critic/score is not finite (NaN/inf) at {n} step(s), first at step {first}: the reward "
                        "function returned NaN/inf and poisoned those batches", n=len(bad), first=bad.index[0]))
    lo, hi = metrics["critic/score/min"].astype(float), metrics["critic/score/max"].astype(float)
    good = lo.apply(math.isfinite) & hi.apply(math.isfinite)
    if good.any() and (lo[good] == hi[good]).all():
        values = sorted(set(lo[good]))
        tail = (" at all {n} step(s): no response scored differently from the others, so there is no learning "
                "signal — check the reward function and the ground truths")
        out.append(Sign("critic/score is always {value:g}" + tail, value=values[0], n=int(good.sum()))
                   if len(values) == 1 else Sign("critic/score is the same for every response of each step" + tail,
                                                 n=int(good.sum())))
    return out
