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
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

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


def tampered() -> str | None:
    """One line naming a rebinding that reaches the grader's reference (None when there is none)."""
    import sys

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
    if what is None:
        return None
    return tr("the grader will not grade: {what} is not ppolab's any more (rebound in this kernel), so the reference "
              "your loss is compared with would be yours — restart the kernel, and plug your loss in with "
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
    return s


def _put_back(s: dict[str, Any]) -> list[str]:
    """Restore ``s``; the lines naming what had changed."""
    now, lines = _state(), []
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
    earlier = sys.getprofile()
    with guarded() as changed:
        sys.setprofile(_watch_reference(entered))
        try:
            out = fn(*args, **kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 — sys.exit() in the learner's code is the learner's failure
            if entered:
                raise _calls_reference(name, entered[0]) from None
            text = (str(e).splitlines() or [""])[0][:120]
            error = f"{type(e).__name__}: {text}" if text else type(e).__name__
            raise LearnerError(tr("your {name} raised {error}").format(name=name, error=error)) from None
        finally:
            sys.setprofile(earlier)
    if entered:
        raise _calls_reference(name, entered[0])
    if changed:
        raise LearnerError(tr("your {name} changed torch's global state — {what}; it is put back, and a loss must "
                              "leave it as it found it").format(name=name, what="; ".join(changed)))
    return out


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
