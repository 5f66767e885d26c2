"""Caches and records checked against what they derive from (issue 50, parts D + E): a run replaced at the same path
is never served the old run's numbers; a replay reads only an update state and a plan that agree with their own
step; a killed ablation run is never read as a result; every odd argument and damaged record is one line naming
the argument, the file or the key. Every test edits a copy of a shipped run; none trains or replays a model."""
from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ppolab
from ppolab.course import DATA
from ppolab.errors import FileFormatError, MissingFileError
from ppolab.experiments import ablations
from ppolab.numbers import invariance, update_effect
from ppolab.numbers.needs import RunLacks
from ppolab.run.checkpoints import update_state_record
from ppolab.run.files import write_tensors
from ppolab.run.reader import Run

from helpers import tree_hash


def copy_run(name: str, dst: Path) -> Path:
    shutil.copytree(DATA / "runs" / name, dst)
    return dst


def step_files(run_dir: Path, k: int) -> tuple[Path, Path]:
    base = run_dir / "steps" / f"step_{k:06d}"
    return base.with_suffix(".safetensors"), base.with_suffix(".json")


def edit_info(run_dir: Path, k: int, edit) -> Path:
    info_file = step_files(run_dir, k)[1]
    info = json.loads(info_file.read_text())
    edit(info)
    info_file.write_text(json.dumps(info))
    return info_file


def one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message and not message.startswith("'"), message  # one line, not a quoted KeyError
    return message


# ====================================================================== caches keyed by the run's identity
@pytest.fixture
def fake_replay(monkeypatch):
    """step_effect's replay, cheap: the "numbers" are the step's recorded old log-probs, read from the run it was
    given — what the cache stores and serves is what is under test, not the model."""
    calls = []

    def replay(r, step, opt_step, entry):
        calls.append(r.path)
        entry["steps"] = {**entry["steps"], opt_step: {"old": r.step(step)["old_log_probs"].clone()}}

    monkeypatch.setattr(update_effect, "_replay_update", replay)
    monkeypatch.setattr(update_effect, "_CACHE", {})
    return calls


def test_a_run_replaced_at_the_same_path_gets_its_own_numbers(tmp_path, fake_replay):
    p = copy_run("grpo_tiny", tmp_path / "run")
    a = update_effect.step_effect(str(p), 1, 0)["old"]
    assert torch.equal(update_effect.step_effect(str(p), 1, 0)["old"], a) and len(fake_replay) == 1  # cached
    shutil.rmtree(p)
    copy_run("grpo_temp_tiny", p)  # the user retrained into the same folder
    b = update_effect.step_effect(str(p), 1, 0)["old"]
    assert len(fake_replay) == 2
    assert torch.equal(b, Run(DATA / "runs" / "grpo_temp_tiny").step(1)["old_log_probs"])
    assert not (a.shape == b.shape and torch.equal(a, b))
    assert len(update_effect._CACHE) == 1  # the replaced run's entry is gone, not kept beside the new one


def test_a_run_object_opened_before_the_run_was_replaced_says_so(tmp_path, fake_replay):
    p = copy_run("grpo_tiny", tmp_path / "run")
    run = ppolab.load_run(p)
    update_effect.step_effect(run, 1, 0)
    shutil.rmtree(p)
    copy_run("grpo_temp_tiny", p)
    with pytest.raises(FileFormatError) as e:
        update_effect.step_effect(run, 1, 0)
    assert "was replaced" in one_line(e) and str(p) in str(e.value) and "load_run" in str(e.value)


def test_the_replay_batch_and_the_invariance_key_follow_a_replaced_run(tmp_path):
    from ppolab.replay import _replay_batch

    p = copy_run("grpo_tiny", tmp_path / "run")
    rows_a, batch_a = _replay_batch(Run(p), 1, 0)
    key_a = invariance.replay_key(str(p), 1, loss_agg_mode="token-mean", loss_scale_factor=None,
                                  micro_batch_size=4)
    shutil.rmtree(p)
    copy_run("grpo_temp_tiny", p)
    rows_b, batch_b = _replay_batch(Run(p), 1, 0)
    want = Run(DATA / "runs" / "grpo_temp_tiny").step(1)["responses"][rows_b]
    assert torch.equal(batch_b["responses"], want)
    assert not torch.equal(batch_a["responses"][:len(rows_b)], want)
    key_b = invariance.replay_key(str(p), 1, loss_agg_mode="token-mean", loss_scale_factor=None,
                                  micro_batch_size=4)
    assert key_a != key_b


# ====================================================================== what a replay reads agrees with its step
def _record_state(run_dir: Path, k: int, seed: int) -> None:
    """Rewrite step k's pair as the recorder writes it with trainer.record_update_state (a digest-keeping
    ppolab): the step number in the header, the actor's state before the update among the tensors."""
    tensors_file, info_file = step_files(run_dir, k)
    g = torch.Generator().manual_seed(seed)
    state = {"weights": {"actor.0": torch.randn(4, 3, generator=g)},
             "optimizer": {"state": {0: {"step": torch.tensor(float(seed)), "exp_avg": torch.randn(4, 3, generator=g),
                                         "exp_avg_sq": torch.rand(4, 3, generator=g)}},
                           "param_groups": [{"lr": 1e-3, "params": [0]}]},
             "scheduler": {"last_epoch": seed}}
    extra, meta = update_state_record(state)
    write_tensors(tensors_file, {**load_file(str(tensors_file)), **extra}, metadata={"step": str(k)})
    edit_info(run_dir, k, lambda info: info.update(update_state=meta))


def test_a_sound_recorded_update_state_reads_back(tmp_path):
    p = copy_run("grpo_tiny", tmp_path / "run")
    _record_state(p, 5, seed=5)
    state = Run(p).step(5).update_state()
    assert set(state["weights"]) == {"actor.0"} and state["scheduler"] == {"last_epoch": 5}


def test_an_update_state_spliced_in_from_another_step_is_named(tmp_path):
    p = copy_run("grpo_tiny", tmp_path / "run")
    _record_state(p, 1, seed=1)
    _record_state(p, 5, seed=5)
    one, five = step_files(p, 1)[0], step_files(p, 5)[0]
    state5 = {k: v for k, v in load_file(str(five)).items() if k.startswith("update_state.")}
    spliced = {**load_file(str(one)), **state5}
    write_tensors(one, spliced, metadata={"step": "1"})  # step 2's state over step 1's, the rest of step 1 kept
    with pytest.raises(FileFormatError) as e:
        Run(p).step(1).update_state()
    assert str(one) in one_line(e) and "not the one" in str(e.value) and "another step" in str(e.value)
    with pytest.raises(FileFormatError, match="update state"):  # a replay stops there, before any model loads
        update_effect.step_effect(str(p), 1, 0)


def test_a_step_file_copied_over_another_step_is_named(tmp_path):
    p = copy_run("grpo_tiny", tmp_path / "run")
    _record_state(p, 1, seed=1)
    _record_state(p, 5, seed=5)
    shutil.copyfile(step_files(p, 5)[0], step_files(p, 1)[0])  # the tensors file alone
    with pytest.raises(FileFormatError) as e:
        Run(p).step(1)
    assert str(step_files(p, 1)[0]) in one_line(e) and "records step 5, not 1" in str(e.value)
    for f in step_files(p, 5):  # the pair
        shutil.copyfile(f, f.with_name(f.name.replace("000005", "000001")))
    with pytest.raises(FileFormatError) as e:
        Run(p).step(1)
    assert str(step_files(p, 1)[1]) in one_line(e) and "records step 5, not 1" in str(e.value)


@pytest.mark.parametrize("edit, says", [
    (lambda s: s["shares"][0].__setitem__(1, s["shares"][0][0]), "twice in optimizer step 0"),
    (lambda s: s["shares"][0].__setitem__(0, 10**6), "row 1000000 in optimizer step 0, outside"),
    (lambda s: s["micro_batches"][0][0].pop(), "leave out row"),
    (lambda s: s.pop("shares"), "does not parse as an update plan"),
], ids=["row twice", "row out of range", "row missing", "key missing"])
def test_an_edited_update_plan_is_named(tmp_path, edit, says):
    p = copy_run("ppo_fire_tiny", tmp_path / "run")
    info_file = edit_info(p, 1, lambda info: edit(info["update_plans"]["actor"]["steps"][0]))
    before = tree_hash(p)
    for read in (lambda: update_effect.step_effect(str(p), 1, 0), lambda: ppolab.replay.step_plan(str(p), 1)):
        with pytest.raises(FileFormatError) as e:
            read()
        assert str(info_file) in one_line(e) and "update_plans.actor" in str(e.value) and says in str(e.value)
    assert tree_hash(p) == before


def test_the_shipped_recorded_plans_pass_the_check():
    from ppolab.update_plan import recorded_plan

    r = Run(DATA / "runs" / "ppo_fire_tiny")
    for k in r.steps:
        for role in r.step(k).info["update_plans"]:
            assert recorded_plan(r.step(k), r.ppo_config(), role).recorded


# ====================================================================== killed ablation runs
SHIPPED_BASE = ablations.SHIPPED / "base" / "seed1"


def _fake_train(calls, fail: bool = False):
    """ppolab.train for the ablation's short runs: writes a whole short run (the shipped base's files) into its
    trainer.run_dir, or half of one and then dies."""
    def train(config, overrides, progress=False):
        out = Path(next(o for o in overrides if o.startswith("trainer.run_dir=")).split("=", 1)[1])
        calls.append(out)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(SHIPPED_BASE / "config.json", out)
        if fail:
            (out / "metrics.jsonl").write_text((SHIPPED_BASE / "metrics.jsonl").read_text().splitlines()[0] + "\n")
            raise KeyboardInterrupt("killed at step 2")
        for f in ("metrics.jsonl", "summary.json"):
            shutil.copy(SHIPPED_BASE / f, out)
        return Run(out)
    return train


def test_a_killed_ablation_run_leaves_nothing_that_reads_as_a_result(tmp_path, monkeypatch):
    monkeypatch.setenv("PPOLAB_CACHE", str(tmp_path / "cache"))
    run = copy_run("grpo_tiny", tmp_path / "mine")
    root = ablations._cache_dir(Run(run))
    calls = []
    monkeypatch.setattr(importlib.import_module("ppolab.train"), "train", _fake_train(calls, fail=True))
    with pytest.raises(KeyboardInterrupt):
        ablations.ablation_runs(run, ("clip_ratio",))
    assert not (root / "base" / "seed1").exists() and list((root / "base").iterdir()) == []  # nor a temporary
    with pytest.raises(RunLacks, match="'base'"):
        ablations.ablation_runs(run, ("clip_ratio",), train=False)
    monkeypatch.setattr(importlib.import_module("ppolab.train"), "train", _fake_train(calls))
    runs = ablations.ablation_runs(run, ("clip_ratio",))
    assert set(runs) == {"base", "clip_ratio"} and (root / "base" / "seed1" / ablations.DONE).is_file()
    assert ablations.verdict(runs, "clip_ratio") == "flat"  # the same curves on every seed
    n = len(calls)
    ablations.ablation_runs(run, ("clip_ratio",))
    assert len(calls) == n  # complete: read, not trained again


def test_a_folder_a_killed_run_left_at_the_final_name_is_trained_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PPOLAB_CACHE", str(tmp_path / "cache"))
    run = copy_run("grpo_tiny", tmp_path / "mine")
    root = ablations._cache_dir(Run(run))
    half = root / "base" / "seed1"  # what an older ppolab left when killed mid-run: one step's metrics, no marker
    half.mkdir(parents=True)
    shutil.copy(SHIPPED_BASE / "config.json", half)
    (half / "metrics.jsonl").write_text((SHIPPED_BASE / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    with pytest.raises(RunLacks, match="'base'"):
        ablations.ablation_runs(run, ("clip_ratio",), train=False)
    calls = []
    monkeypatch.setattr(importlib.import_module("ppolab.train"), "train", _fake_train(calls))
    runs = ablations.ablation_runs(run, ("clip_ratio",))
    n = ablations.N_SEEDS
    assert len(calls) == 2 * n and len(runs["base"][0].metrics) == len(Run(SHIPPED_BASE).metrics)


def test_a_base_curve_of_zeros_is_a_verdict_not_a_division(tmp_path):
    """A base whose metric is 0 at every step (a clip that never binds) gets a verdict: no ratio divides by it."""
    metric = ablations.KNOBS["clip_ratio"].metric
    base = []
    for i, src in enumerate(ablations.ablation_runs("grpo_tiny", train=False)["base"]):
        shutil.copytree(src.path, tmp_path / f"base{i}")
        rows = [json.loads(line) for line in (tmp_path / f"base{i}" / "metrics.jsonl").read_text().splitlines()]
        (tmp_path / f"base{i}" / "metrics.jsonl").write_text("".join(json.dumps({**r, metric: 0.0}) + "\n"
                                                                    for r in rows))
        base.append(Run(tmp_path / f"base{i}"))
    runs = {"base": tuple(base), "clip_ratio": ablations.ablation_runs("grpo_tiny", train=False)["clip_ratio"]}
    assert ablations.verdict(runs, "clip_ratio") == "up"


# ====================================================================== errors that name the fault
@pytest.mark.parametrize("step, opt_step, says", [
    (1, 0.5, "opt_step=0.5 is not a whole number"), (1, "0", "opt_step='0' is not a whole number"),
    (1, -1, "opt_step=-1 is out of range"), (1, 2**70, f"opt_step={2**70} is out of range"),
    (1, True, "opt_step=True is not a whole number"),
    ("1", 0, "step='1' is not a whole number"), (1.0, 0, "step=1.0 is not a whole number"),
    (2**70, 0, f"a recorded step {2**70}"),
])
def test_an_odd_argument_is_named(step, opt_step, says, tmp_path):
    with pytest.raises((ValueError, TypeError, LookupError)) as e:
        update_effect.step_effect("grpo_tiny", step, opt_step)
    assert says in one_line(e)
    if "opt_step" in says:
        assert "0 … 3" in str(e.value)  # the valid range: step 1 of grpo_tiny has 4 optimizer steps


def test_the_replays_name_an_odd_step_or_mini_batch():
    from ppolab.replay import mini_batch_rows, replay_actor_update

    for read, says in ((lambda: mini_batch_rows("grpo_tiny", 1, "0"), "mini_batch='0' is not a whole number"),
                       (lambda: mini_batch_rows("grpo_tiny", 1, 2**70), "is out of range"),
                       (lambda: replay_actor_update("grpo_tiny", "1"), "step='1' is not a whole number"),
                       (lambda: replay_actor_update("grpo_tiny", 1, mini_batch=0.5), "mini_batch=0.5 is not")):
        with pytest.raises(ValueError) as e:
            read()
        assert says in one_line(e)


def test_run_step_names_an_odd_step():
    r = Run(DATA / "runs" / "grpo_tiny")
    with pytest.raises(TypeError, match="step='1' is not a whole number"):
        r.step("1")
    with pytest.raises(KeyError) as e:
        r.step(2**70)
    assert f"step {2**70} was not recorded" in one_line(e) and "recorded steps: [1, 5" in str(e.value)


def test_a_run_moved_after_load_run_says_moved(tmp_path):
    p = copy_run("grpo_tiny", tmp_path / "run")
    run = ppolab.load_run(p)
    p.rename(tmp_path / "elsewhere")
    for read in (lambda: update_effect.step_effect(run, 1, 0), lambda: run.steps, lambda: run.step(1)):
        with pytest.raises(MissingFileError) as e:
            read()
        assert f"the run dir {p} is no longer there (moved or deleted after load_run)" in one_line(e)


def test_a_key_deleted_from_a_step_record_is_named(tmp_path):
    p = copy_run("grpo_tiny", tmp_path / "run")
    info_file = edit_info(p, 1, lambda info: info.pop("batch_plan"))
    rec = Run(p).step(1)
    assert rec.info.get("batch_plan") is None and "batch_plan" not in rec.info  # a dict's get and in, as before
    with pytest.raises(FileFormatError) as e:
        rec.info["batch_plan"]["n_trajectories"]
    assert isinstance(e.value, KeyError) and str(info_file) in one_line(e) and "batch_plan" in str(e.value)
    with pytest.raises(FileFormatError) as e:
        rec.info["metrics"]["no/such_metric"]
    assert str(info_file) in one_line(e) and "metrics.no/such_metric" in str(e.value)
    with pytest.raises(FileFormatError) as e:
        rec["no_such_tensor"]
    assert str(step_files(p, 1)[0]) in one_line(e)


def test_a_per_row_list_shorter_than_the_rows_is_named(tmp_path):
    p = copy_run("grpo_tiny", tmp_path / "run")
    info_file = edit_info(p, 1, lambda info: info["texts"]["responses"].pop())
    with pytest.raises(FileFormatError) as e:
        Run(p).step(1)
    assert str(info_file) in one_line(e) and "texts.responses has 127 entries" in str(e.value)


def test_a_truncated_tensors_file_is_named(tmp_path):
    p = copy_run("grpo_tiny", tmp_path / "run")
    tensors_file = step_files(p, 1)[0]
    data = tensors_file.read_bytes()
    tensors_file.write_bytes(data[:len(data) // 2])
    with pytest.raises(FileFormatError) as e:
        update_effect.step_effect(str(p), 1, 0)
    assert str(tensors_file) in one_line(e) and "not a complete safetensors file" in str(e.value)


def test_the_recorder_writes_what_the_checks_read(tmp_path):
    """A step recorded by the Recorder carries its number in the tensors file's header and a digest of its update
    state, so the checks above hold for every run trained from now on."""
    from ppolab.run.recorder import Recorder
    from ppolab.run.step import LazyTensors

    rec = Recorder(tmp_path / "run", {"trainer": {}}, {})
    _, meta = update_state_record({"weights": {"actor.0": torch.ones(2)}, "optimizer": {"state": {},
                                   "param_groups": []}, "scheduler": {}})
    base = rec.record_step(3, {"responses": torch.zeros(2, 1)}, {"update_state": meta})
    assert LazyTensors(base.with_suffix(".safetensors")).metadata == {"step": "3"}
    assert len(json.loads(base.with_suffix(".json").read_text())["update_state"]["digest"]) == 64


@pytest.mark.slow  # trains the 3-step run test_update_effect.py's kept fixture trains (shared when both run)
def test_an_update_state_recorded_before_digests_is_checked_by_its_log_probs(trained_run, tmp_path):
    """A run recorded before update states carried a digest: the state's weights must compute the log-probs the
    step's first optimizer step recorded — exactly so for the step's own state, 1.6 away for step 3's."""
    from test_update_effect import KEPT

    src = Path(trained_run("grpo_tiny", KEPT))

    def legacy(dst: Path) -> Path:
        shutil.copytree(src, dst)
        for k in (2, 3):
            edit_info(dst, k, lambda info: info["update_state"].pop("digest"))
        return dst

    sound = legacy(tmp_path / "sound")
    assert update_effect.step_effect(str(sound), 2, 0)["opt_step"] == 0
    bad = legacy(tmp_path / "bad")
    two, three = step_files(bad, 2)[0], step_files(bad, 3)[0]
    state3 = {k: v for k, v in load_file(str(three)).items() if k.startswith("update_state.")}
    write_tensors(two, {**load_file(str(two)), **state3}, metadata={"step": "2"})
    with pytest.raises(FileFormatError) as e:
        update_effect.step_effect(str(bad), 2, 0)
    assert str(two) in one_line(e) and "actor_log_probs[0]" in str(e.value)


def test_a_run_followed_from_its_start_keeps_its_identity_when_the_tokenizer_is_added(tmp_path):
    """The recorder writes config.json twice as a run starts (its claim, then the tokenizer's fingerprint): a Run
    opened between the two — a live explorer, ``BackgroundTraining.run()`` — is the same run after the second."""
    p = copy_run("grpo_tiny", tmp_path / "run")
    meta = json.loads((p / "config.json").read_text())
    with_tokenizer = json.dumps(meta)
    meta["fingerprints"].pop("tokenizer", None)
    (p / "config.json").write_text(json.dumps(meta))
    run = ppolab.load_run(p)
    first = run.identity()
    (p / "config.json").write_text(with_tokenizer)  # the recorder's second write
    assert run.identity()[0] == first[0]
    meta["resumes"] = [{"at_step": 1, "changed": {}}]  # a resume is another run as far as a cache knows
    meta["fingerprints"] = json.loads(with_tokenizer)["fingerprints"]
    (p / "config.json").write_text(json.dumps(meta))
    with pytest.raises(FileFormatError, match="replaced"):
        run.identity()
