"""The update plan is one value (chapter §11–§13): the worker computes it once, executes exactly it, the recorder keeps
it, and every reader reads it — nothing else in the package cuts mini-batches or micro-batches or counts a global
mini-batch."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ppolab
from ppolab.update_plan import (InferBatching, RankRows, UpdatePlan, micro_batches, plan_update, recorded_plan,
                                recorded_rank_rows)
from ppolab.widgets.common import SHIPPED_RUNS

from helpers import NO_VAL
from test_distributed import torchrun

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ppolab"

# ---------------------------------------------------------------------------------------------- only the planner
#: What cuts an update into mini-batches and micro-batches, or counts a global mini-batch: the planner's own parts.
PLANNING = {"mini_batch_indices", "fixed_micro_batches", "plan_dynamic_micro_batches_dp", "GlobalBatchInfo",
            "DataLoader"}
#: Where they may be called: the planner, and the module that defines the partitioners (its own internals).
PLANNER = {"ppolab/update_plan.py", "ppolab/batching.py"}
#: Modules that build counts of no real update (so nothing to read from a plan), each with the reason.
SYNTHETIC = {"ppolab/experiments/capstone_grade.py": "lab 17 part II's hidden grading cases: made-up global counts"}
WORKER_CLASSES = {"Worker", "ActorWorker", "CriticWorker", "ReferenceWorker"}


def planning_calls(source: str) -> list[str]:
    """``name (line)`` of every call in ``source`` that builds a plan: a planning function called by name or
    attribute, or a worker method called on its class (``Worker.global_batch_info(stand_in, …)``: a worker method
    run on a stand-in)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        on_class = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in WORKER_CLASSES
        if name in PLANNING or (on_class and name != "__init__"):
            found.append(f"{name} (line {node.lineno})")
    return found


def test_the_checker_sees_a_plan_built_elsewhere():
    # the shapes the readers used before the plan was one value
    assert planning_calls("from ppolab.batching import mini_batch_indices\nx = mini_batch_indices(8, 4, 1)")
    assert planning_calls("info = GlobalBatchInfo(dp_size=1, batch_num_tokens=3.0)")
    assert planning_calls("b = CriticWorker.engine_batching(SimpleNamespace(config=c))")
    assert planning_calls("i = Worker.global_batch_info(stand_in, {'loss_mask': m})")
    assert not planning_calls("plan = recorded_plan(rec, cfg, 'actor')\nparts = micro_batches(b, 2, None)")


def test_no_module_but_the_planner_builds_a_plan():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in PLANNER or rel in SYNTHETIC:
            continue
        calls = planning_calls(path.read_text(encoding="utf-8"))
        if calls:
            offenders[rel] = calls
    assert not offenders, f"only ppolab/update_plan.py plans an update; read its plan instead: {offenders}"


# ------------------------------------------------------------------------------- readers ask the step for its plan
#: Where a step's plan is read from the record or planned for it: the planner, the record's ``StepRecord.plan``,
#: and the trainer and recorder that write it.
PLAN_OWNERS = {"ppolab/update_plan.py", "ppolab/batching.py", "ppolab/run/step.py", "ppolab/train.py",
               "ppolab/trainer.py"}
#: Facts of an optimizer step a record's JSON holds, which only the plan may read.
PLAN_KEYS = {"update_plans", "optimizer_steps_per_epoch", "local_mini_batch"}


def rederivations(source: str) -> list[str]:
    """``what (line)`` of every place in ``source`` that rebuilds a recorded step's plan instead of asking the step
    (``rec.plan(role)``, ``rec.opt_step(k, role)``): ``recorded_plan`` called for the step's own plan (a what-if passes
    ``batching=`` or ``config=``), an optimizer step's rows read off the NaN pattern of a history
    (``isnan(…).all(…)``), or a plan fact read from the step's JSON."""
    found, lines, tree = [], source.splitlines(), ast.parse(source)
    assigned = assignments(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name == "recorded_plan" and not {k.arg for k in node.keywords} & {"batching", "config"}:
                found.append(f"recorded_plan (line {node.lineno})")
            if name == "all" and isinstance(f, ast.Attribute) and isinstance(f.value, (ast.Call, ast.UnaryOp)):
                inner = f.value.operand if isinstance(f.value, ast.UnaryOp) else f.value
                g = inner.func if isinstance(inner, ast.Call) else None
                if g is not None and (getattr(g, "attr", None) or getattr(g, "id", None)) == "isnan":
                    found.append(f"isnan(…).all (line {node.lineno})")
            first = node.args[0] if node.args else None
            if name == "get" and isinstance(first, ast.Constant) and first.value in PLAN_KEYS:
                found.append(f".get({node.args[0].value!r}) (line {node.lineno})")
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in PLAN_KEYS:
            found.append(f"[{node.slice.value!r}] (line {node.lineno})")
        if isinstance(node, ast.Call):
            for k in node.keywords:
                if k.arg not in COUNT_ARGS:
                    continue
                # the value, or what the module assigned to the name passed (``tokens = m.sum(); …(batch_num_tokens=
                # tokens)``): a count computed on the spot, unless its line says it is a what-if
                sources = [(k.value, node.lineno)] + (assigned.get(k.value.id, []) if isinstance(k.value, ast.Name)
                                                      else [])
                for value, line in sources:
                    said = {line, value.lineno, value.end_lineno or value.lineno}  # the call's line, or the value's
                    if hand_made(value) and not any("what-if" in lines[n - 1] for n in said):
                        found.append(f"{k.arg}={ast.unparse(value)} (line {line})")
    return found


def assignments(tree: ast.AST) -> dict[str, list[tuple[ast.expr, int]]]:
    """name → (value, line) of every plain assignment to it in a module."""
    out: dict[str, list[tuple[ast.expr, int]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out.setdefault(target.id, []).append((node.value, node.lineno))
    return out


#: The global counts a loss is normalised by (§13): a reader takes them from ``rec.opt_step(k, role).step.info()``.
COUNT_ARGS = {"batch_num_tokens", "global_batch_size"}


def hand_made(value: ast.expr) -> bool:
    """Whether a count passed to a loss is computed on the spot — a sum, a length, arithmetic or a number — rather
    than read from the plan. A deliberate what-if (another denominator than the worker's) says so on its line."""
    for n in ast.walk(value):
        if isinstance(n, ast.BinOp) or isinstance(n, ast.Constant) and type(n.value) in (int, float):
            return True
        if isinstance(n, ast.Call):
            f = n.func
            if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "") in (
                    "sum", "len", "numel", "count_nonzero"):
                return True
    return False


def test_the_checker_sees_a_plan_rebuilt_by_a_reader():
    for planted in ('rows = ~torch.isnan(t["actor_log_probs"][k]).all(-1)',
                    "rows = (~torch.isnan(lp).all(dim=-1)).nonzero()",
                    'plan = recorded_plan(r.step(s), r.ppo_config(), "actor")',
                    'per = rec.info["batch_plan"]["optimizer_steps_per_epoch"]',
                    'mini = rec.info.get("batch_plan", {}).get("local_mini_batch")',
                    'plans = rec.info["update_plans"]["critic"]',
                    'loss = agg_loss(x, m, "token-mean", batch_num_tokens=b["loss_mask"].sum())',
                    'loss = agg_loss(x, m, "seq-mean-token-mean", global_batch_size=len(rows) * dp)',
                    'vf, frac = compute_value_loss(vp, g, v, m, 0.2, global_batch_size=16)',
                    'tokens = b["loss_mask"].sum()\nloss = agg_loss(x, m, "token-mean", batch_num_tokens=tokens)'):
        assert rederivations(planted), planted
    assert not rederivations('plan = rec.plan("actor")\nrows = rec.opt_step(k, "critic").rows()\n'
                             'what_if = recorded_plan(rec, cfg, "critic", batching=b)\n'
                             'info = rec.opt_step(k).step.info()\n'
                             'loss = agg_loss(x, m, "token-mean", batch_num_tokens=info.batch_num_tokens)\n'
                             'other = agg_loss(x, m, "token-mean",\n'
                             '                 batch_num_tokens=m.sum())  # what-if: response_mask\n'
                             'valid = ~torch.isnan(vp)  # a token-level mask, not an optimizer step\'s rows')


def test_readers_ask_the_step_for_its_plan():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in PLAN_OWNERS or rel in SYNTHETIC or rel.startswith("ppolab/algos/"):
            continue
        found = rederivations(path.read_text(encoding="utf-8"))
        if found:
            offenders[rel] = found
    assert not offenders, f"read a step's plan with rec.plan(role) / rec.opt_step(k, role): {offenders}"


# ---------------------------------------------------------------------------------------------- the planner itself
def _ranks(lengths: list[list[int]], tokens: list[list[float]]) -> list[RankRows]:
    out, start = [], 0
    for lens, toks in zip(lengths, tokens):
        out.append(RankRows(list(range(start, start + len(lens))), [1] * len(lens), [n - 1 for n in lens], toks))
        start += len(lens)
    return out


class _Cfg:
    ppo_mini_batch_size, ppo_epochs, shuffle, data_loader_seed, loss_scale_factor = 2, 2, True, 7, None


def test_the_plan_covers_every_row_once_per_epoch_with_the_global_counts():
    lengths = [[5, 9, 3, 7, 4, 6, 8, 2], [6, 6, 6, 2, 9, 3, 5, 4]]
    tokens = [[float(n - 2) for n in lens] for lens in lengths]
    plan = plan_update(_ranks(lengths, tokens), _Cfg(), InferBatching(None, 16), role="actor", rollout_n=4)
    assert plan.local_mini_batch == 4 and len(plan.steps) == 2 * 2  # (8 rows / 4) mini-batches × 2 epochs
    for epoch in range(2):
        steps = [o for o in plan.steps if o.epoch == epoch]
        assert sorted(r for o in steps for r in o.rows()) == list(range(16))
    all_tokens = [t for toks in tokens for t in toks]
    for o in plan.steps:
        assert o.batch_num_tokens == sum(all_tokens[r] for r in o.rows()) and o.global_batch_size == 8
        for rank in range(2):  # the micro-batches hold exactly the rank's share, each within the budget
            assert sorted(r for mb in o.micro_batches[rank] for r in mb) == sorted(o.shares[rank])
            assert all(sum(lengths[rank][r - 8 * rank] for r in mb) <= 16 for mb in o.micro_batches[rank])
        assert len(o.micro_batches[0]) == len(o.micro_batches[1])  # the count agreed over the ranks
    assert UpdatePlan.from_dict(json.loads(json.dumps(plan.as_dict()))).as_dict() == plan.as_dict()


def test_micro_batches_fixed_and_dynamic():
    assert micro_batches(range(5), 2, None) == [[0, 1], [2, 3], [4]]

    class Rows:
        def __len__(self):
            return 4

        def lengths(self):
            return [1, 1, 1, 1], [9, 2, 2, 9]

    assert sorted(len(mb) for mb in micro_batches(Rows(), None, 12)) == [1, 1, 2]


# ---------------------------------------------------------------------------------------------- recorded runs
@pytest.mark.parametrize("name", sorted(SHIPPED_RUNS))
def test_a_plan_computed_for_an_old_run_matches_what_it_recorded(name):
    """Most shipped runs were recorded before plans were kept: the planner, on their recorded batch, gives the rows
    each optimizer step computed (the recorded histories) and the counts its logged losses used. A run recorded since
    (ppo_fire_tiny) reads its own plan, which must agree with the same histories and counts."""
    run = ppolab.load_run(SHIPPED_RUNS[name])
    for s in run.steps[:2]:
        rec = run.step(s)
        for role, history in (("actor", "actor_log_probs"), ("critic", "critic_vpreds")):
            if history not in rec.tensors:
                continue
            plan = recorded_plan(rec, run.ppo_config(), role)
            if "update_plans" in rec.info:
                assert plan.recorded, (name, s, role)
            else:
                assert not plan.recorded and "recorded before plans were kept" in plan.note()
            seen = rec.tensors[history]
            assert len(plan.steps) == seen.shape[0]
            loss_tokens = recorded_rank_rows(rec.tensors, plan.dp_size)
            per_row = [t for r in loss_tokens for t in r.loss_tokens]
            for k, opt in enumerate(plan.steps):
                computed = (~torch.isnan(seen[k]).all(-1)).nonzero().flatten().tolist()
                assert sorted(opt.rows()) == computed, (name, s, role, k)
                assert opt.batch_num_tokens == sum(per_row[r] for r in opt.rows())


# ---------------------------------------------------------------------------------------------- executed = recorded
def trace(tmp_path: Path, nproc: int, preset: str, overrides: list[str]) -> tuple[ppolab.Run, list[list[dict]]]:
    """Train ``preset`` watching every rank's worker (tests/dist/plan_trace.py); (the run, each rank's trace)."""
    args = ["tests/dist/plan_trace.py", str(tmp_path), preset, *overrides]
    if nproc == 1:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    else:
        torchrun(nproc, *args, timeout=600)
    traces = [json.loads((tmp_path / f"trace_{r}.json").read_text()) for r in range(nproc)]
    return ppolab.load_run(tmp_path / "run"), traces


def assert_executed_as_recorded(run, traces) -> int:
    """Every recorded plan equals what each rank's worker executed, micro-batch by micro-batch, with the counts
    its losses were given. Returns the optimizer steps compared."""
    compared = 0
    updates = [iter(t) for t in traces]
    for s in run.steps:
        plans = run.step(s).info["update_plans"]
        for role in ("critic", "actor"):
            if role not in plans:
                continue
            plan = UpdatePlan.from_dict(plans[role])
            assert plan.dp_size == len(traces)
            for rank, it in enumerate(updates):
                done = next(it)
                assert done["role"] == role
                assert len(done["steps"]) == len(plan.steps)
                for opt, seen in zip(plan.steps, done["steps"]):
                    assert seen["micro_batches"] == opt.micro_batches[rank]
                    info = opt.info()
                    assert all(i == [info.dp_size, info.batch_num_tokens, info.global_batch_size,
                                     info.loss_scale_factor] for i in seen["infos"])
                    compared += 1
    assert all(next(it, None) is None for it in updates)  # nothing executed that was not recorded
    return compared


SHAPE = ["trainer.total_training_steps=2", "trainer.record_freq=1", "data.train_batch_size=4",
         "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.shuffle=true", *NO_VAL]
FIXED = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
DYNAMIC = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64"]
CRITIC = ["critic.ppo_mini_batch_size=2", "+critic.ppo_infer_max_token_len_per_gpu=64"]


@pytest.mark.spread
@pytest.mark.parametrize("nproc,preset,extra", [
    pytest.param(1, "grpo_tiny", FIXED, marks=pytest.mark.slow), (1, "grpo_tiny", DYNAMIC),
    pytest.param(1, "ppo_gae_tiny", [*DYNAMIC, *CRITIC], marks=pytest.mark.slow),
    pytest.param(2, "grpo_tiny", DYNAMIC, marks=pytest.mark.slow),
    pytest.param(2, "ppo_gae_tiny", [*FIXED, *CRITIC], marks=pytest.mark.slow),
], ids=["1rank-fixed", "1rank-dynamic", "1rank-critic", "2ranks-dynamic", "2ranks-critic-fixed"])
def test_the_recorded_plan_is_what_the_worker_executed(tmp_path, nproc, preset, extra):
    run, traces = trace(tmp_path, nproc, preset, [*SHAPE, *extra])
    assert assert_executed_as_recorded(run, traces) >= 2 * 4  # 2 steps × 2 epochs × 2 mini-batches at least
    if nproc == 2:  # every rank runs as many micro-batches (a dynamic count is agreed over the ranks)
        for s in run.steps:
            for opt in UpdatePlan.from_dict(run.step(s).info["update_plans"]["actor"]).steps:
                assert len(opt.micro_batches[0]) == len(opt.micro_batches[1]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["grpo_temp_tiny", "grpo_tool_tiny", "ppo_fire_tiny"])
def test_every_other_preset_executes_its_recorded_plan(tmp_path, preset):
    run, traces = trace(tmp_path, 1, preset, ["trainer.total_training_steps=2", "trainer.record_freq=1", *NO_VAL])
    assert assert_executed_as_recorded(run, traces) > 0
