"""Lab 17, the capstone: its plain-torch solution imports no ``ppolab.algos``, rebuilds the logged metrics of the
shipped runs, and the bookkeeping it stands on (``ppolab.numbers.capstone``) is the trainer's."""
from __future__ import annotations

import ast
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ppolab.numbers import capstone
from ppolab.run.reader import SHIPPED_RUNS

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "labs" / "solutions" / "17.py"


def solution():
    spec = importlib.util.spec_from_file_location("solutions_17", SOLUTION)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_solution_imports_no_ppolab_algos():
    names = []
    for node in ast.walk(ast.parse(SOLUTION.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            names += [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    # `import ppolab.algos`, `from ppolab.algos import …` and `from ppolab import algos` all name ppolab.algos
    assert names and not [n for n in names if n == "ppolab.algos" or n.startswith("ppolab.algos.")], names


def test_the_default_step_is_where_the_mechanisms_fire():
    s = capstone.capstone_step("ppo_fire_tiny")
    log = capstone.logged("ppo_fire_tiny", s)
    assert s == 21 and log["actor/pg_clipfrac_lower"] > 0 and log["rollout_corr/rollout_rs_masked_fraction"] > 0
    t = __import__("ppolab").load_run(SHIPPED_RUNS["ppo_fire_tiny"]).step(s).tensors
    assert t["is_pad"].bool().sum() == 4 and capstone.dp_size("ppo_fire_tiny", s) == 2
    case = capstone.actor_case("ppo_fire_tiny")
    assert capstone.rebuild_actor_step("ppo_fire_tiny", s, case["opt_step"])["actor/pg_clipfrac_lower"] > 0


@pytest.mark.parametrize("name", sorted(SHIPPED_RUNS))
def test_the_algos_rebuild_of_every_optimizer_step_reduces_to_the_logged_metrics(name):
    # the plan (ranks, mini-batches, micro-batches) is the one the worker ran: a wrong split would move the
    # plain means of the fractions, a wrong rank split the global token counts
    s = capstone.capstone_step(name)
    steps = [capstone.rebuild_actor_step(name, s, k) for k in range(len(capstone.micro_batch_rows(name, s)))]
    log = capstone.logged(name, s)
    for key in steps[0]:
        assert math.isclose(np.mean([m[key] for m in steps]), log[key], rel_tol=1e-5, abs_tol=1e-8), key
    a = __import__("ppolab").load_run(SHIPPED_RUNS[name]).ppo_config().actor_rollout_ref.actor
    if name in ("ppo_fire_tiny", "grpo_temp_tiny"):  # recorded with π_θ's entropy: entropy_loss is rebuilt too
        assert a.entropy_coeff != 0 and "actor/entropy_loss" in steps[0]


def test_the_update_entropy_is_recorded_exactly_when_the_loss_computes_it():
    for name, path in SHIPPED_RUNS.items():
        r = __import__("ppolab").load_run(path)
        a = r.ppo_config().actor_rollout_ref.actor
        t = r.step(r.steps[0]).tensors
        if "actor_entropy" in t:
            assert a.entropy_coeff != 0 or a.calculate_entropy, name
            assert t["actor_entropy"].shape == t["actor_log_probs"].shape, name
            # NaN exactly where the log-probs are (rows outside that optimizer step's mini-batch)
            assert torch.equal(t["actor_entropy"].isnan(), t["actor_log_probs"].isnan()), name
        elif name in ("ppo_fire_tiny", "grpo_temp_tiny"):
            raise AssertionError(f"{name} computes π_θ's entropy in its loss but did not record actor_entropy")


@pytest.mark.parametrize("name", sorted(SHIPPED_RUNS))
def test_the_plain_torch_solution_matches_the_log_wherever_the_run_has_the_mechanism(name):
    S = solution()
    parts = {"17.4", "17.5", "17.7"}
    cfg = __import__("ppolab").load_run(SHIPPED_RUNS[name]).ppo_config()
    if cfg.algorithm.use_kl_in_reward:
        parts.add("17.1")
    if cfg.algorithm.rollout_correction.rollout_rs:
        parts.add("17.2")
    if cfg.algorithm.adv_estimator == "gae":
        parts |= {"17.3", "17.6"}
    for part in sorted(parts):
        if part == "17.4":
            truth = capstone.rebuild_actor_step(name, None, capstone.actor_case(name)["opt_step"])
        else:
            truth = capstone.part_truth(part, name)
        mine = S.AT_RUN_SETTINGS[part](name)
        lines = capstone.compare_to_logged(mine, name, opt_step=capstone.actor_case(name)["opt_step"]
                                           if part == "17.4" else None)
        assert lines and all(": match" in ln for ln in lines), (part, lines)
        assert set(mine) == {k for k in truth if k in capstone.PART_METRICS[part]}, part


def test_the_rejection_mask_is_the_recorded_response_mask():
    S = solution()
    run = __import__("ppolab").load_run(SHIPPED_RUNS["ppo_fire_tiny"])
    corr = run.ppo_config().algorithm.rollout_correction
    for s in run.steps:
        t = run.step(s).tensors
        keep = S.rejection_keep(t, corr.rollout_rs, corr.rollout_rs_threshold)
        assert torch.equal(t["loss_mask"] * keep, t["response_mask"]), s


def test_the_report_names_the_usual_mistake():
    S = solution()
    wrong = S.AT_RUN_SETTINGS["17.5"](mistake="no_dp_size")
    lines = capstone.compare_to_logged(wrong, "ppo_fire_tiny")
    pg = next(ln for ln in lines if "actor/pg_loss" in ln)
    assert "differs" in pg and "dp_size = 2" in pg, lines
    assert any("actor/pg_clipfrac:" in ln and "match" in ln for ln in lines), lines
    assert "this run does not log it" in capstone.compare_to_logged({"actor/nonsense": 1.0}, "ppo_fire_tiny")[0]


def test_the_report_takes_any_array_like_and_names_a_non_number(capsys):
    """A value of several numbers (a numpy array, a tensor, a list) is "not a number yet", never a traceback; an
    array or tensor of one element counts as its number."""
    logged = capstone.logged(capstone.SHIPPED, capstone.capstone_step(capstone.SHIPPED))
    key = next(k for k in logged if k.startswith("actor/"))
    for several in (np.array([1.0, 2.0]), torch.tensor([1.0, 2.0]), [1.0, 2.0], np.zeros((2, 2))):
        capstone.report({key: several})
        assert f"{key}: not a number yet" in capsys.readouterr().out
    for one in (np.array([logged[key]]), torch.tensor(logged[key]), np.float32(logged[key])):
        capstone.report({key: one})
        assert f"{key}: match" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(SHIPPED_RUNS))
def test_the_graded_what_ifs_are_settings_the_run_did_not_train_with(name):
    """Part I is graded at other settings: on every shipped run each part's what-if differs from the run's own
    config, its truth from the logged metrics, and the plain-torch solution at those settings finds that truth."""
    from ppolab.exercises import check, registry
    from ppolab.numbers import capstone_what_if
    from ppolab.numbers.needs import RunLacks, require

    S = solution()
    for part in ("17.1", "17.2", "17.3", "17.4", "17.5", "17.6", "17.7"):
        try:
            require(name, *registry()[part].needs)
        except RunLacks:  # the part says so in one line (tests/test_exercises.py)
            continue
        want = capstone_what_if.truth(part, name)
        log = capstone.logged(name)
        moved = [k for k, v in want.items() if k in log and not math.isclose(v, log[k], rel_tol=1e-4, abs_tol=1e-6)]
        if part != "17.4":  # an optimizer step's values are not logged at all
            assert moved, (part, want)
        assert check(part, S.SOLUTIONS[part](name), run=name), (name, part)
