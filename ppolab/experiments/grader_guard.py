"""The capstone grader's isolation from the code it grades (lab 17 part II, :mod:`ppolab.experiments.capstone_grade`).

* :data:`REF` — the reference functions the grader's truth runs, captured at import as function objects from the
  modules that define them: a learner who later rebinds ``ppolab.algos.compute_value_loss`` or the registry's
  ``vanilla`` does not change the truth; :func:`tampered` names, in one line, a rebinding that would still reach it
  (a global those functions read, or ppolab's own entries of the policy-loss registry the trainer runs by name).
* :func:`guarded` — torch's process-wide settings (grad mode, default dtype and device, threads, RNG state,
  deterministic algorithms, anomaly mode) saved before a call into the learner's code and put back after it; what
  the learner's code changed comes back as lines.
* :class:`LearnerError` — the learner's failure (any exception but KeyboardInterrupt, ``sys.exit()`` included, a
  changed setting, a result of the wrong kind) as one line, an ``Exception`` the trainer lets through.
* :func:`call` — one call into the learner's code under :func:`guarded`, which also watches for a call into
  ppolab's own losses, truths or replays (:data:`REFERENCE_PLACES`): a function that hands the work to the reference
  is named as such, never graded as the learner's.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch._tensor_str
import torch.nn.functional

from ppolab.algos import aggregation, kl, losses, policy_loss, value
from ppolab.i18n import tr
from ppolab.vocab import POLICY_LOSS_MODES


class LearnerError(Exception):
    """The learner's code failed; ``str()`` is the one line that says how."""


def _own(fn: Callable, module: types.ModuleType) -> Callable:
    """``fn`` if ``module`` defines it (an import after a learner's rebinding would capture the learner's)."""
    if getattr(fn, "__module__", None) != module.__name__:
        raise ImportError(f"{module.__name__}.{getattr(fn, '__name__', fn)} is not ppolab's own function any more; "
                          "restart the Python process (the kernel) and import ppolab.experiments.capstone_grade again")
    return fn


@dataclass(frozen=True)
class _Ref:
    vanilla: Callable
    compute_value_loss: Callable
    ppo_loss_terms: Callable
    agg_loss: Callable
    kl_penalty: Callable
    ppo_clip_terms: Callable
    value_clip_terms: Callable


REF = _Ref(vanilla=_own(policy_loss.compute_policy_loss_vanilla, policy_loss),
           compute_value_loss=_own(value.compute_value_loss, value),
           ppo_loss_terms=_own(losses.ppo_loss_terms, losses),
           agg_loss=_own(aggregation.agg_loss, aggregation), kl_penalty=_own(kl.kl_penalty, kl),
           ppo_clip_terms=_own(policy_loss.ppo_clip_terms, policy_loss),
           value_clip_terms=_own(value.value_clip_terms, value))

def _is_ppolabs(fn: Any) -> bool:
    return isinstance(fn, types.FunctionType) and str(getattr(fn, "__module__", "")).startswith("ppolab.algos.")


#: ppolab's own policy losses — the registry's entries that ppolab.algos defines, as registered at import: the
#: trainer runs the reference by name. An entry rebound before this import is not captured: :func:`tampered` names it.
OWN_LOSSES: dict[str, Callable] = {n: f for n, f in policy_loss.POLICY_LOSS_REGISTRY.items() if _is_ppolabs(f)}

#: The names :func:`ppolab.experiments.capstone_grade.plug_in` registered a learner's function under.
PLUGGED: set[str] = set()


def _names(code: types.CodeType) -> set[str]:
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def _reads(fns: list[Callable]) -> dict[tuple[str, str], Any]:
    """Every (module, global) the functions read, transitively through ppolab.algos functions, with its value now."""
    seen: dict[tuple[str, str], Any] = {}
    todo = list(fns)
    while todo:
        fn = todo.pop()
        g = fn.__globals__
        for name in sorted(_names(fn.__code__)):
            if name not in g or (g["__name__"], name) in seen:
                continue
            obj = g[name]
            seen[(g["__name__"], name)] = obj
            if isinstance(obj, types.FunctionType) and obj.__module__.startswith("ppolab.algos"):
                todo.append(obj)
    return seen


_READS = _reads([REF.vanilla, REF.compute_value_loss, REF.ppo_loss_terms, REF.agg_loss, REF.kl_penalty])

#: Where the reference's torch calls are looked up at call time: ``torch.min = lambda a, b: b`` in a learner's cell
#: or function would change the truth without touching ppolab. Public module attributes, and every method of
#: ``torch.Tensor`` (operators included: ``-A * r`` looks up ``Tensor.__mul__``).
_API_OWNERS = {"torch": torch, "torch.nn.functional": torch.nn.functional, "torch.Tensor": torch.Tensor,
               "torch.linalg": torch.linalg, "torch.special": torch.special, "torch.autograd": torch.autograd}


def _api() -> dict[tuple[str, str], Any]:
    return {(owner, k): v for owner, obj in _API_OWNERS.items() for k, v in list(vars(obj).items())
            if not k.startswith("_") or (owner == "torch.Tensor" and k.startswith("__"))}


def _foreign(v: Any) -> bool:
    """A Python function defined outside torch where torch keeps its own (typing's helpers excepted)."""
    return isinstance(v, types.FunctionType) and not str(v.__module__).startswith(("torch", "typing"))


_API = {k: v for k, v in _api().items() if not _foreign(v)}


#: torch's own Python files: a wrapper defined there is torch's (importing peft wraps ``torch.manual_seed`` in
#: ``torch/_compile.py``'s dynamo guard), adopted as the name's new value rather than called a rebinding.
_TORCH_FILES = str(Path(torch.__file__).resolve().parent)


def _torch_own(v: Any) -> bool:
    code = getattr(v, "__code__", None)
    return isinstance(v, types.FunctionType) and code is not None and \
        str(Path(code.co_filename).resolve()).startswith(_TORCH_FILES)


def _api_changed() -> list[str]:
    """torch's names the reference may call that are not torch's own objects any more (rebound or deleted); a
    name torch itself re-wrapped since (:func:`_torch_own`) is adopted into :data:`_API` on the way."""
    now = _api()
    out = []
    for key, v in _API.items():
        new = now.get(key)
        if new is v:
            continue
        if _torch_own(new):
            _API[key] = new
        else:
            out.append(".".join(key))
    return out + [".".join(key) for key, v in now.items() if key not in _API and _foreign(v)]


def _api_put_back() -> None:
    now = _api()
    for (o, k), v in _API.items():
        if now.get((o, k)) is not v:
            setattr(_API_OWNERS[o], k, v)
    for (o, k), v in now.items():
        if (o, k) not in _API and _foreign(v):
            delattr(_API_OWNERS[o], k)


def tampered() -> str | None:
    """One line naming a rebinding that reaches the grader's reference (None when there is none)."""
    registry = policy_loss.POLICY_LOSS_REGISTRY
    # the reference run trains with loss_mode=vanilla; ppolab's names must stay bound to ppolab's functions
    rebound = ["vanilla"] if registry.get("vanilla") is not REF.vanilla else []
    rebound += [name for name, fn in OWN_LOSSES.items() if registry.get(name) is not fn]
    rebound += [name for name, fn in registry.items() if name in POLICY_LOSS_MODES and not _is_ppolabs(fn)]
    what = f"POLICY_LOSS_REGISTRY[{rebound[0]!r}]" if rebound else None
    if what is None:
        for (mod, name), obj in _READS.items():
            if getattr(sys.modules.get(mod), name, None) is not obj:
                what = f"{mod}.{name}"
                break
    torch_names = _api_changed() if what is None else []
    if torch_names:
        what = torch_names[0]
    if what is None:
        return None
    return tr("the grader will not grade: {what} is not ppolab's or torch's any more (rebound in this kernel), so the "
              "reference your loss is compared with would be yours — restart the kernel, and plug your loss in with "
              "plug_in(fn) under its own name").format(what=what)


# ------------------------------------------------------------------------------------------ torch's global settings
#: Guards entered by :func:`_put_back` to turn off an inference mode a learner's call left on (kept: leaving one
#: would restore the learner's mode).
_KEPT_GUARDS: list[Any] = []


def _state() -> dict[str, Any]:
    s = {"inference": torch.is_inference_mode_enabled(), "grad": torch.is_grad_enabled(),
         "dtype": torch.get_default_dtype(), "threads": torch.get_num_threads(),
         "rng": torch.random.get_rng_state(),
         "deterministic": (torch.are_deterministic_algorithms_enabled(),
                           torch.is_deterministic_algorithms_warn_only_enabled()),
         "anomaly": (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
         "device": torch.get_default_device()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        s["cuda_rng"] = torch.cuda.get_rng_state_all()
    s.update(_more_state())
    return s


def _flushes_denormals() -> bool:
    # torch.set_flush_denormal has no getter: a subnormal double that survives a multiplication says it is off
    return float(torch.tensor([1e-310], dtype=torch.float64) * 1.0) == 0.0


def _more_state() -> dict[str, Any]:
    """The rest of what a call can leave behind for every later computation of the process: torch's function and
    dispatch modes and saved-tensor hooks left open, its numeric switches, print options, and Python's own (warning
    filters, recursion limit, working directory, trace and profile functions)."""
    return {"function_modes": torch._C._len_torch_function_stack(),
            "dispatch_modes": torch._C._len_torch_dispatch_stack(),
            "saved_hooks": torch._C._autograd._top_saved_tensors_default_hooks(True),
            "switches": (torch.autograd.is_multithreading_enabled(), torch.get_float32_matmul_precision(),
                         torch._C._get_mkldnn_enabled(), _flushes_denormals()),
            "print": dict(vars(torch._tensor_str.PRINT_OPTS)), "warnings": list(warnings.filters),
            "recursion": sys.getrecursionlimit(), "cwd": _cwd(), "trace": sys.gettrace()}


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # a working directory removed under the process
        return None


def _put_back_more(s: dict[str, Any], now: dict[str, Any]) -> list[str]:
    changed = []
    if now["saved_hooks"] != s["saved_hooks"]:
        for _ in range(64):  # pop what the call pushed, down to the hooks it found
            if torch._C._autograd._top_saved_tensors_default_hooks(True) == s["saved_hooks"]:
                break
            torch._C._autograd._pop_saved_tensors_default_hooks()
        changed.append(tr("it left {what} open").format(what="torch.autograd.graph.saved_tensors_hooks"))
    if now["switches"] != s["switches"]:
        threads, precision, mkldnn, flush = s["switches"]
        torch._C._set_multithreading_enabled(threads)
        torch.set_float32_matmul_precision(precision)
        torch._C._set_mkldnn_enabled(mkldnn)
        torch.set_flush_denormal(flush)
        names = ("torch.autograd.set_multithreading_enabled", "torch.set_float32_matmul_precision",
                 "torch.backends.mkldnn.enabled", "torch.set_flush_denormal")
        changed += [tr("it changed {what}").format(what=n) for n, a, b in zip(names, now["switches"], s["switches"])
                    if a != b]
    if now["print"] != s["print"]:
        torch.set_printoptions(**s["print"])
        changed.append(tr("it changed {what}").format(what="torch.set_printoptions"))
    if now["warnings"] != s["warnings"]:
        warnings.filters[:] = s["warnings"]
        warnings._filters_mutated()
        changed.append(tr("it changed {what}").format(what="warnings.simplefilter / filterwarnings"))
    if now["recursion"] != s["recursion"]:
        sys.setrecursionlimit(s["recursion"])
        changed.append(tr("it changed {what}").format(what="sys.setrecursionlimit"))
    if now["cwd"] != s["cwd"] and s["cwd"] is not None:
        os.chdir(s["cwd"])
        changed.append(tr("it changed {what}").format(what="os.chdir"))
    if now["trace"] is not s["trace"]:
        sys.settrace(s["trace"])
        changed.append(tr("it changed {what}").format(what="sys.settrace"))
    return changed


def _put_back(s: dict[str, Any]) -> list[str]:
    """Restore ``s``; the lines naming what had changed."""
    lines = []
    # modes first: every torch call below (reading the RNG state …) would otherwise run through the learner's mode
    for key, count, pop, what in (
            ("function_modes", torch._C._len_torch_function_stack, torch._C._pop_torch_function_stack,
             "a torch function mode"),
            ("dispatch_modes", torch._C._len_torch_dispatch_stack, torch._C._pop_torch_dispatch_stack,
             "a torch dispatch mode")):
        if count() > s[key]:
            while count() > s[key]:
                pop()
            lines.append(tr("it left {what} open").format(what=tr(what)))
    now = _state()
    if now["inference"] and not s["inference"]:
        # a torch.inference_mode() entered and never left: its guard is the learner's object, out of reach, so an
        # opposite guard is entered and kept for the thread's life (what `with torch.inference_mode(False)` does for
        # its body). It also puts grad mode back on, hence before the grad check.
        off = torch._C._InferenceMode(False)
        off.__enter__()
        _KEPT_GUARDS.append(off)
        lines.append(tr("it left torch.inference_mode on (every tensor made after it would be an inference tensor "
                        "no backward can reach)"))
        now = _state()
    if now["grad"] != s["grad"]:
        torch.set_grad_enabled(s["grad"])
        lines.append(tr("it switched autograd off (torch.set_grad_enabled(False))") if s["grad"]
                     else tr("it switched autograd on (torch.set_grad_enabled(True))"))
    if now["dtype"] != s["dtype"]:
        torch.set_default_dtype(s["dtype"])
        lines.append(tr("it changed torch's default dtype to {v} (torch.set_default_dtype)").format(v=now["dtype"]))
    if now["threads"] != s["threads"]:
        torch.set_num_threads(s["threads"])
        lines.append(tr("it changed torch's number of threads to {v} (torch.set_num_threads)").format(v=now["threads"]))
    if not torch.equal(now["rng"], s["rng"]) or any(
            not torch.equal(a, b) for a, b in zip(now.get("cuda_rng", ()), s.get("cuda_rng", ()))):
        torch.random.set_rng_state(s["rng"])
        if "cuda_rng" in s:
            torch.cuda.set_rng_state_all(s["cuda_rng"])
        lines.append(tr("it moved torch's random number generator (torch.manual_seed or a random draw): a loss "
                        "draws no random numbers"))
    if now["deterministic"] != s["deterministic"]:
        torch.use_deterministic_algorithms(s["deterministic"][0], warn_only=s["deterministic"][1])
        lines.append(tr("it changed torch.use_deterministic_algorithms"))
    if now["anomaly"] != s["anomaly"]:
        torch.set_anomaly_enabled(*s["anomaly"])
        lines.append(tr("it changed torch's anomaly mode (torch.autograd.set_detect_anomaly)"))
    if now["device"] != s["device"]:
        torch.set_default_device(None if s["device"] == torch.device("cpu") else s["device"])
        lines.append(tr("it changed torch's default device to {v} (torch.set_default_device)").format(v=now["device"]))
    lines += _put_back_more(s, now)
    rebound = _api_changed()
    if rebound:
        _api_put_back()
        lines.append(tr("it rebound {what}").format(what=", ".join(rebound[:3]) + (" …" if len(rebound) > 3 else "")))
    return lines


@contextlib.contextmanager
def guarded() -> Iterator[list[str]]:
    """Run the body (a call into the learner's code) with torch's global settings put back afterwards, even when it
    raises; the list it yields holds, after the body, one line per setting the body had changed."""
    saved, changed = _state(), []
    try:
        yield changed
    finally:
        changed.extend(_put_back(saved))


#: Where ppolab's own losses, the lab's truths and the replays live: a learner's function that enters any of them
#: while it is graded hands its work to the reference. What it is given stays usable: ``config.get`` (ppolab.config)
#: and the :class:`~ppolab.algos.GlobalBatchInfo` it receives (:data:`INPUT_CLASSES`).
PACKAGE = Path(__file__).resolve().parents[1]
REFERENCE_PLACES = tuple(str(PACKAGE / part) for part in ("algos", "numbers", "experiments", "exercises", "replay.py",
                                                          "worker.py", "trainer.py", "roles.py", "models.py"))
INPUT_CLASSES = ("GlobalBatchInfo.",)


def _watch_reference(entered: list[str]) -> Callable:
    """A profile function that notes (once) the first of ppolab's functions in :data:`REFERENCE_PLACES` entered."""
    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call" and not entered:
            code = frame.f_code
            if not code.co_filename.startswith(REFERENCE_PLACES):
                return
            qualname = getattr(code, "co_qualname", code.co_name)  # Python 3.10 has no co_qualname
            owner = type(frame.f_locals.get("self")).__name__ + "."
            if not (qualname.startswith(INPUT_CLASSES) or owner in INPUT_CLASSES):
                where = Path(code.co_filename).relative_to(PACKAGE.parent).as_posix()
                entered.append(f"{qualname} ({where})")
    return profile


def call(fn: Callable, name: str, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` for the learner's function ``name``: any exception but KeyboardInterrupt
    (``SystemExit`` included), or a changed torch setting (put back), becomes a :class:`LearnerError`; so does a
    call into ppolab's own losses, truths or replays (:data:`REFERENCE_PLACES`) — through ``ppolab.algos``, the
    registry, a truth function or :data:`REF` alike: the work graded must be the learner's."""
    entered: list[str] = []
    earlier, earlier_threads = sys.getprofile(), threading.getprofile()
    watch = _watch_reference(entered)
    with guarded() as changed:
        # threads the function starts are watched too (threading.setprofile reaches threads started after it)
        sys.setprofile(watch)
        threading.setprofile(watch)
        try:
            out = fn(*args, **kwargs)
            unwatched = sys.getprofile() is not watch or threading.getprofile() is not watch
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 — sys.exit() in the learner's code is the learner's failure
            if entered:
                raise _calls_reference(name, entered[0]) from None
            raise LearnerError(tr("your {name} raised {error}").format(name=name, error=_error_line(e))) from None
        finally:
            sys.setprofile(earlier)
            threading.setprofile(earlier_threads)
    if entered:
        raise _calls_reference(name, entered[0])
    if unwatched:  # what it called after that is out of sight: its work cannot be told from the reference's
        raise LearnerError(tr("your {name} switched off the grader's watch on the calls it makes (sys.setprofile or "
                              "threading.setprofile): a loss leaves the profiler alone").format(name=name))
    if changed:
        raise _changed_state(name, changed)
    return out


def _error_line(e: BaseException) -> str:
    try:
        text = (str(e).splitlines() or [""])[0][:120]
    except BaseException:  # noqa: BLE001 — an exception whose str() raises is still the learner's
        text = ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


@contextlib.contextmanager
def contained(name: str, passes: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """The grader reading what the learner's ``name`` returned — its numbers (``float()``), its tensors
    (``detach()``), the backward through its graph — which may run the learner's code again (a ``__float__``, an
    autograd Function's backward): any exception but KeyboardInterrupt (and the grader's own ``passes``) is the
    learner's failure, one line, and torch's settings are put back."""
    with guarded() as changed:
        try:
            yield
        except (KeyboardInterrupt, LearnerError, *passes):
            raise
        except BaseException as e:  # noqa: BLE001 — a SystemExit from the learner's object is the learner's
            raise LearnerError(tr("reading what your {name} returned raised {error}").format(
                name=name, error=_error_line(e))) from None
    if changed:
        raise _changed_state(name, changed)


def _changed_state(name: str, changed: list[str]) -> LearnerError:
    return LearnerError(tr("your {name} changed torch's global state — {what}; it is put back, and a loss must "
                           "leave it as it found it").format(name=name, what="; ".join(changed)))


def plain(out: tuple, name: str) -> tuple:
    """A checked ``(loss, second)`` as the trainer may read it without running the learner's code again: the loss a
    plain ``torch.Tensor`` on the same graph (a subclass's methods are the learner's), a metrics dict of plain
    tensors and floats, a second tensor plain too — read under :func:`contained`."""
    def one(v: Any) -> Any:
        return v.as_subclass(torch.Tensor) if isinstance(v, torch.Tensor) else float(v)

    with contained(name):
        loss, second = out
        second = ({str(k): one(v) for k, v in second.items()} if isinstance(second, dict) else one(second))
        return one(loss), second


class CallsReference(LearnerError):
    """The learner's function called ppolab's own loss, truth or replay: the line says which; no part to look at."""


def _calls_reference(name: str, what: str) -> LearnerError:
    return CallsReference(tr("your {name} calls ppolab's own {what}: a loss that hands its work to the reference is "
                           "the reference, not yours — write it in plain torch").format(name=name, what=what))


# ------------------------------------------------------------------------------------------ what the functions return
def _tensor_line(x: Any, what: str, like: torch.Tensor | None) -> str | None:
    if not isinstance(x, torch.Tensor):
        return tr("{what} is a {type}; expected a scalar tensor").format(what=what, type=type(x).__name__)
    if x.dim() != 0:
        return tr("{what} has shape {shape}; expected a scalar").format(what=what, shape=tuple(x.shape))
    if not x.is_floating_point():
        return tr("{what} is a {dtype} tensor; expected a floating-point one").format(what=what, dtype=x.dtype)
    if like is not None and x.dtype != like.dtype:
        return tr("{what} is {dtype} but the inputs are {want}: keep the inputs' dtype").format(
            what=what, dtype=x.dtype, want=like.dtype)
    if x.grad_fn is None and torch.is_grad_enabled() and (like is None or like.requires_grad):
        return tr("{what} has no grad_fn — it does not depend on {on} (a .detach(), .item() or torch.no_grad?)"
                  ).format(what=what, on="vpreds" if what == "vf_loss" else "log_prob")
    return None


def check_returned(out: Any, name: str, like: torch.Tensor | None = None) -> None:
    """Raise :class:`LearnerError` describing ``out`` when it is not what the learner's function ``name``
    (policy_loss, actor_loss, value_loss) must return; ``like``: the input whose dtype the loss keeps."""
    if name == "actor_loss":
        line = _tensor_line(out, "loss", like)
    else:
        first, second = ("pg_loss", "metrics dict") if name == "policy_loss" else ("vf_loss", "vf_clipfrac")
        if not isinstance(out, tuple) or len(out) != 2:
            line = (tr("returned a tuple of length {n}; expected a ({first} tensor, {second}) tuple").format(
                n=len(out), first=first, second=second) if isinstance(out, tuple)
                else tr("returned a {type}; expected a ({first} tensor, {second}) tuple").format(
                type=type(out).__name__, first=first, second=second))
        else:
            line = _tensor_line(out[0], first, like)
            if line is None and name == "policy_loss" and not isinstance(out[1], dict):
                line = tr("metrics is a {type}; expected a dict").format(type=type(out[1]).__name__)
    if line is not None:
        raise LearnerError(tr("your {name} {line}").format(name=name, line=line))


def signature_line(fn: Any, arg: str = "fn") -> str | None:
    """One line when ``fn`` cannot be a policy loss verl's registry calls; None when it can."""
    if fn is None or not callable(fn):
        return tr("plug_in({arg}): {arg} must be your policy-loss function, got {given}").format(
            arg=arg, given=repr(fn)[:60])
    if inspect.isclass(fn):
        return tr("plug_in({arg}): {arg} must be a function, got the class {name}").format(arg=arg, name=fn.__name__)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return tr("plug_in({arg}): the signature of {given} cannot be read; pass a function defined with def").format(
            arg=arg, given=repr(fn)[:60])
    try:  # how the trainer and the grader call it (ppolab.algos.losses.ppo_loss_terms)
        sig.bind(*range(7), global_batch_info=None)
    except TypeError:
        return tr("plug_in({arg}): {name}{sig} does not take verl's policy-loss arguments — it must accept "
                  "(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None, "
                  "*, global_batch_info=None)").format(arg=arg, name=getattr(fn, "__name__", "fn"), sig=sig)
    return None
