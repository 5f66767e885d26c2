"""Issue 50 part C: the lab-17 grader is isolated from the code it grades, and check() is thread-safe.

A learner's loss that exits, raises a BaseException or changes torch's global settings is graded as a failure in one
line naming it, with torch's settings put back; rebinding the registry's ``vanilla`` or ``algos.compute_value_loss``
never makes a wrong loss right; plug_in refuses what verl's registry could not call; an answer claiming to equal
everything is judged by its value; model-loading checks agree whatever the threads."""
from __future__ import annotations

import concurrent.futures as cf
import subprocess
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import ppolab.algos
from ppolab.algos.policy_loss import POLICY_LOSS_REGISTRY
from ppolab.exercises import check, matches
from ppolab.experiments import capstone_grade as cl
from ppolab.experiments import grader_guard

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("solutions_17_loss_iso", ROOT / "labs" / "solutions" / "17_loss.py")
sol = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sol)


def _settings():
    return (torch.is_inference_mode_enabled(), torch.is_grad_enabled(), torch.get_default_dtype(),
            torch.get_num_threads(), torch.random.get_rng_state().clone(), torch.are_deterministic_algorithms_enabled(),
            torch.is_anomaly_enabled(), torch.get_default_device())


def _same(a, b):
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


def _wrapping(act):
    good = sol.make_policy_loss()

    def loss(*args, **kwargs):
        act()
        return good(*args, **kwargs)
    return loss


class Boom(BaseException):
    pass


def _raise_boom():
    raise Boom("out of the grader")


_HELD: list = []  # what a learner's module might keep alive
MISDEEDS = {
    "sys.exit": (lambda: sys.exit(3), "SystemExit: 3"),
    "BaseException": (_raise_boom, "Boom: out of the grader"),
    "grad off": (lambda: torch.set_grad_enabled(False), "switched autograd off"),
    # entered and kept (a guard object that died would put the mode back itself)
    "inference mode": (lambda: _HELD.append(torch.inference_mode()) or _HELD[-1].__enter__(),
                       "left torch.inference_mode on"),
    "float64": (lambda: torch.set_default_dtype(torch.float64), "default dtype to torch.float64"),
    "threads": (lambda: torch.set_num_threads(1 if torch.get_num_threads() != 1 else 2), "number of threads"),
    "seed": (lambda: torch.manual_seed(0), "random number generator"),
}


@pytest.mark.parametrize("misdeed", sorted(MISDEEDS))
def test_a_loss_that_exits_or_changes_torch_fails_in_one_line_and_torch_is_put_back(misdeed):
    act, words = MISDEEDS[misdeed]
    before = _settings()
    a = cl.grade_hidden(_wrapping(act))
    assert not a["ok"] and a["case"] == 0 and words in a["line"] and "\n" not in a["line"], a["line"]
    assert _same(_settings(), before)
    assert cl.grade_hidden(*sol.loss_set())["ok"]  # the kernel still grades


class _Passing(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _enter(cm):
    _HELD.append(cm)
    cm.__enter__()


#: What a loss can leave behind for every later computation of the kernel, beyond torch's settings above: (do it,
#: is it still so, words of the verdict). Each is graded a failure and put back (issue 50's hidden list).
LEFT_BEHIND = {
    "torch.min rebound": (lambda: setattr(torch, "min", lambda a, b: b), lambda: torch.min.__module__ != "torch",
                          "it rebound torch.min"),
    "Tensor.__mul__ rebound": (lambda: setattr(torch.Tensor, "__mul__", lambda a, b: a),
                               lambda: "__mul__" in torch.Tensor.__dict__, "it rebound torch.Tensor.__mul__"),
    "a function mode left open": (lambda: _enter(_Passing()), lambda: torch._C._len_torch_function_stack() > 0,
                                  "left"),
    "saved-tensor hooks left open": (
        lambda: _enter(torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)),
        lambda: torch._C._autograd._top_saved_tensors_default_hooks(True) is not None, "saved_tensors_hooks"),
    "warnings as errors": (lambda: __import__("warnings").simplefilter("error"),
                           lambda: __import__("warnings").filters[0][0] == "error", "warnings.simplefilter"),
    "recursion limit": (lambda: sys.setrecursionlimit(180), lambda: sys.getrecursionlimit() == 180,
                        "sys.setrecursionlimit"),
    "working directory": (lambda: __import__("os").chdir("/"), lambda: __import__("os").getcwd() == "/", "os.chdir"),
    "matmul precision": (lambda: torch.set_float32_matmul_precision("medium"),
                         lambda: torch.get_float32_matmul_precision() == "medium",
                         "torch.set_float32_matmul_precision"),
    "flush denormals": (lambda: torch.set_flush_denormal(True),
                        lambda: float(torch.tensor([1e-310], dtype=torch.float64) * 1.0) == 0.0,
                        "torch.set_flush_denormal"),
    "print options": (lambda: torch.set_printoptions(precision=1),
                      lambda: torch._tensor_str.PRINT_OPTS.precision == 1, "torch.set_printoptions"),
    "mkldnn off": (lambda: setattr(torch.backends.mkldnn, "enabled", False),
                   lambda: not torch.backends.mkldnn.enabled, "torch.backends.mkldnn.enabled"),
    "autograd multithreading off": (lambda: torch.autograd.set_multithreading_enabled(False),
                                    lambda: not torch.autograd.is_multithreading_enabled(),
                                    "set_multithreading_enabled"),
}


@pytest.mark.parametrize("what", sorted(LEFT_BEHIND))
def test_a_loss_that_leaves_anything_behind_fails_and_it_is_put_back(what):
    act, still, words = LEFT_BEHIND[what]
    cwd = __import__("os").getcwd()
    done = []

    def once():  # the first case only: a kernel whose loss did it once is already changed for good
        if not done:
            done.append(1)
            act()
    a = cl.grade_hidden(_wrapping(once))
    assert not a["ok"] and a["case"] == 0 and words in a["line"] and "\n" not in a["line"], a["line"]
    assert not still(), f"{what} was not put back"
    assert __import__("os").getcwd() == cwd
    assert cl.grade_hidden(*sol.loss_set())["ok"]  # the kernel still grades, with the truth unchanged


def test_a_loss_that_hides_its_call_to_the_reference_is_named():
    """Switching the profiler off before calling ppolab's loss, or calling it from a thread, is seen."""
    import threading

    good = sol.make_policy_loss()

    def unwatched(*args, **kwargs):
        sys.setprofile(None)
        return ppolab.algos.compute_policy_loss_vanilla(*args, **kwargs)

    def threaded(*args, **kwargs):
        out = []
        t = threading.Thread(target=lambda: out.append(ppolab.algos.compute_policy_loss_vanilla(*args, **kwargs)))
        t.start()
        t.join()
        return out[0]
    for fn, words in ((unwatched, "switched off the grader's watch"), (threaded, "calls ppolab's own")):
        a = cl.grade_hidden(fn)
        assert not a["ok"] and words in a["line"], a["line"]
    assert cl.grade_hidden(good)["ok"]


def test_no_frame_holds_the_truth_while_the_learners_code_runs():
    """The reference is computed after the learner's function returned: walking the stack finds no answer."""
    good = sol.make_policy_loss()
    seen = []

    def peeking(*args, **kwargs):
        f = sys._getframe(1)
        while f is not None:
            seen.extend(k for k in ("want", "truth", "reference") if isinstance(f.f_locals.get(k), dict))
            f = f.f_back
        return good(*args, **kwargs)
    assert cl.grade_hidden(peeking)["ok"] and not seen, seen


class _Exiting(float):
    def __float__(self):
        sys.exit(7)


class _ExitingTensor(torch.Tensor):
    def detach(self):
        raise SystemExit(8)


def test_what_the_loss_returns_cannot_exit_the_grader():
    """A metrics value whose __float__ exits, a tensor subclass whose detach exits: the learner's failure."""
    good = sol.make_policy_loss()

    def exiting_metric(*args, **kwargs):
        pg, m = good(*args, **kwargs)
        return pg, {**m, "actor/pg_clipfrac": _Exiting(0.0)}

    def exiting_tensor(*args, **kwargs):
        pg, m = good(*args, **kwargs)
        return pg.as_subclass(_ExitingTensor), m
    for fn in (exiting_metric, exiting_tensor):
        a = cl.grade_hidden(fn)
        assert not a["ok"] and "SystemExit" in a["line"] and "\n" not in a["line"], a["line"]


@pytest.mark.parametrize("name", [" vanilla", "vanilla\n", "null", "True", "[a]", "${oc.env:HOME}", "a,b", "~x"])
def test_plug_in_refuses_a_name_the_config_would_read_as_something_else(name):
    before = dict(POLICY_LOSS_REGISTRY)
    with pytest.raises(ValueError, match="a loss_mode name is letters"):
        cl.plug_in(sol.make_policy_loss(), name)
    assert POLICY_LOSS_REGISTRY == before


@pytest.mark.slow  # two replays of grpo_tiny's step 1: about a minute on 2 cores
def test_a_loss_that_exits_inside_the_worker_fails_the_replay_and_the_process_still_replays():
    from ppolab.replay import replay_actor_update

    b = cl.grade_replay(_wrapping(lambda: sys.exit(2)), "grpo_tiny", name="learner_iso")
    assert not b["ok"] and b["line"].startswith("(b) not yet") and "SystemExit: 2" in b["line"], b["line"]
    assert POLICY_LOSS_REGISTRY["learner_iso"] is not None and torch.is_grad_enabled()
    assert replay_actor_update("grpo_tiny")["grads"]
    POLICY_LOSS_REGISTRY.pop("learner_iso")


@pytest.mark.slow  # three one-step trainings of grpo_tiny: about 10 s, kept out of the README command's budget
def test_a_loss_that_exits_inside_training_fails_part_c_and_the_process_still_trains(tmp_path):
    c = cl.grade_training(_wrapping(lambda: sys.exit(4)), name="learner_iso_c", steps=1, root=tmp_path)
    assert not c["ok"] and c["line"].startswith("(c) not yet") and "SystemExit: 4" in c["line"], c["line"]
    assert "\n" not in c["line"] and torch.is_grad_enabled()
    assert POLICY_LOSS_REGISTRY["learner_iso_c"] is not None  # the learner's own function, not the guard
    assert cl.grade_training(sol.make_policy_loss(), name="learner_iso_c", steps=1, root=tmp_path)["ok"]
    POLICY_LOSS_REGISTRY.pop("learner_iso_c")


@pytest.fixture
def restore_rebinding():
    vanilla, value = POLICY_LOSS_REGISTRY["vanilla"], ppolab.algos.compute_value_loss
    yield
    POLICY_LOSS_REGISTRY["vanilla"], ppolab.algos.compute_value_loss = vanilla, value


def test_a_rebound_vanilla_never_makes_a_doubled_loss_right(restore_rebinding):
    good = sol.make_policy_loss()

    def double(*args, **kwargs):
        pg, metrics = good(*args, **kwargs)
        return 2 * pg, metrics
    POLICY_LOSS_REGISTRY["vanilla"] = double
    a = cl.grade_hidden(double)
    assert not a["ok"] and "POLICY_LOSS_REGISTRY['vanilla']" in a["line"] and "restart the kernel" in a["line"]
    b = cl.grade_replay(double, "grpo_tiny", name="learner_iso")
    assert not b["ok"] and "POLICY_LOSS_REGISTRY['vanilla']" in b["line"]
    POLICY_LOSS_REGISTRY.pop("learner_iso", None)


def test_a_rebound_compute_value_loss_never_makes_a_doubled_value_loss_right(restore_rebinding):
    *_, value = sol.loss_set()
    policy, actor, _ = sol.loss_set()

    def double(*args, **kwargs):
        loss, frac = value(*args, **kwargs)
        return 2 * loss, frac
    reference = ppolab.algos.compute_value_loss
    ppolab.algos.compute_value_loss = lambda *a, **k: (lambda out: (2 * out[0], out[1]))(reference(*a, **k))
    a = cl.grade_hidden(policy, actor, double)
    assert not a["ok"] and a["stage"] == "value clip" and "×2" in a["line"], a["line"]


@pytest.mark.parametrize("rebind", ["POLICY_LOSS_REGISTRY['vanilla'] = mine", "POLICY_LOSS_REGISTRY['gspo'] = mine"])
def test_a_registry_rebound_before_the_grader_is_imported_is_named(rebind):
    """A learner's cell may run before anything imports the grader: the reference is still ppolab's own function, and
    a rebound name of ppolab's is refused in one line (a new name of the learner's is not)."""
    code = f"""
from ppolab.algos.policy_loss import POLICY_LOSS_REGISTRY, compute_policy_loss_vanilla
def mine(*a, **k):
    pg, m = compute_policy_loss_vanilla(*a, **k)
    return 2 * pg, m
POLICY_LOSS_REGISTRY['learner_own_name'] = mine
{rebind}
from ppolab.experiments import grader_guard
assert grader_guard.REF.vanilla is compute_policy_loss_vanilla
print(grader_guard.tampered())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("the grader will not grade: POLICY_LOSS_REGISTRY["), line
    assert rebind.split("]")[0].split("[")[1] in line and "learner_own_name" not in line


def test_a_learners_own_registry_name_is_not_tampering():
    code = """
from ppolab.algos.policy_loss import POLICY_LOSS_REGISTRY, compute_policy_loss_vanilla
POLICY_LOSS_REGISTRY['learner_own_name'] = lambda *a, **k: compute_policy_loss_vanilla(*a, **k)
from ppolab.experiments import grader_guard
print(grader_guard.tampered())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "None", (out.stdout, out.stderr)


@pytest.mark.parametrize("fn", [None, 42, int, lambda x: x], ids=["None", "42", "int", "one-arg lambda"])
def test_plug_in_refuses_what_the_registry_could_not_call(fn):
    before = dict(POLICY_LOSS_REGISTRY)
    with pytest.raises(TypeError) as e:
        cl.plug_in(fn, "learner_iso")
    line = str(e.value)
    assert line.startswith("plug_in(fn): ") and "\n" not in line, line
    assert POLICY_LOSS_REGISTRY == before


def test_plug_in_never_replaces_a_ppolab_loss():
    with pytest.raises(ValueError, match="one of ppolab's policy losses"):
        cl.plug_in(sol.make_policy_loss(), "gspo")
    assert POLICY_LOSS_REGISTRY["gspo"] is grader_guard.OWN_LOSSES["gspo"]


def _returning(value):
    def loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None, *,
             global_batch_info=None):
        return value(log_prob)
    return loss


@pytest.mark.parametrize("value, words", [
    (lambda lp: 1.5, "returned a float; expected a (pg_loss tensor, metrics dict) tuple"),
    (lambda lp: (lp.sum(), {}, 3), "returned a tuple of length 3; expected a (pg_loss tensor, metrics dict) tuple"),
    (lambda lp: (lp.sum(-1), {}), "pg_loss has shape ("),
    (lambda lp: (lp.sum().long(), {}), "pg_loss is a torch.int64 tensor"),
    (lambda lp: (lp.sum().detach(), {}), "pg_loss has no grad_fn — it does not depend on log_prob"),
    (lambda lp: (lp.sum(), [1]), "metrics is a list; expected a dict"),
], ids=["float", "3-tuple", "shape", "dtype", "no grad", "metrics"])
def test_a_wrong_return_is_described(value, words):
    a = cl.grade_hidden(_returning(value))
    assert not a["ok"] and words in a["line"] and "raised" not in a["line"], a["line"]


class S(str):
    __eq__ = lambda s, o: True  # noqa: E731
    __hash__ = str.__hash__
    lower = strip = lambda s: s  # noqa: E731


class T(tuple):
    __eq__ = lambda s, o: True  # noqa: E731
    __hash__ = tuple.__hash__


class F(float):
    __eq__ = lambda s, o: True  # noqa: E731
    __hash__ = float.__hash__


class I(int):  # noqa: E742
    __eq__ = lambda s, o: True  # noqa: E731
    __hash__ = int.__hash__


@pytest.mark.parametrize("id, answer", [
    ("15.3", S("nonsense")), ("14.2", T(("a", "b"))), ("14.2", (S("a"), S("b"))), ("12.2", T((0, 0))),
    ("12.2", (I(0), I(0))), ("16.4", (F(0.5), F(0.5), F(0.5))), ("10.1", {S("x"), S("y"), S("z")}),
    ("08.4", {S("reward-side"): S("x"), S("loss-side"): S("y")}),
])
def test_an_answer_that_claims_to_equal_everything_is_judged_by_its_value(id, answer):
    assert not check(id, answer)


def test_a_number_that_claims_to_equal_everything_is_judged_by_its_value():
    assert not matches(F(0.0), 0.37) and not matches(I(0), 5) and matches(F(0.37), 0.37) and matches(I(5), 5)


def test_models_load_in_threads_and_a_load_afterwards_works():
    from ppolab.models import SHIPPED_MODEL, load_tokenizer_and_model

    with cf.ThreadPoolExecutor(4) as pool:
        models = list(pool.map(lambda _: load_tokenizer_and_model(SHIPPED_MODEL)[1], range(4)))
    _, alone = load_tokenizer_and_model(SHIPPED_MODEL)
    for m in models:
        assert not any(p.is_meta for p in m.parameters())
        assert all(torch.equal(p, q) for p, q in zip(m.parameters(), alone.parameters()))


def test_checks_that_load_a_model_agree_in_threads_and_a_replay_works_afterwards():
    from ppolab.exercises import lab07, reset, truth
    from ppolab.replay import replay_actor_update

    right = truth("07.3", run="grpo_tiny")
    lab07._model.cache_clear()  # so that the threads load the model, not a cached one
    answers = [right, 0.0, right, 0.0]
    with cf.ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda a: check("07.3", a, run="grpo_tiny"), answers))
    reset("07.3")
    assert [bool(v) for v in verdicts] == [True, False, True, False], [v.message for v in verdicts]
    assert all("bug in ppolab" not in v.message for v in verdicts)
    assert replay_actor_update("grpo_tiny")["grads"]
