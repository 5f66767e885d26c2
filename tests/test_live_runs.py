"""Reading a run while it trains: the commit rule (a step is part of the run once its metrics row is logged), one
version of a step's files, a resume that hides the steps it will record again, ``ppolab.widgets.follow`` on the
newest step, and ``ppolab.train_in_background``.

A live run is simulated by copying a shipped run's files in the recorder's own write order (tensors, then the step's
JSON, then metrics.jsonl through a rename), so the explorers read real tensors at every stage of a step's writing.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from ppolab.errors import StepNotCommitted
from ppolab.run.files import STEP_FILE
from ppolab.run.reader import Run
from ppolab.run.recorder import Recorder

SOURCE = Path(__file__).resolve().parents[1] / "data" / "runs" / "ppo_fire_tiny"


class LiveCopy:
    """A run dir filled step by step from a shipped run, as its recorder would write it."""

    def __init__(self, dest: Path, source: Path = SOURCE):
        self.src, self.dest = source, dest
        dest.mkdir()
        for name in ("config.json", "tokenizer"):
            (shutil.copytree if (source / name).is_dir() else shutil.copy2)(source / name, dest / name)
        (dest / "steps").mkdir()
        self.rows = [json.loads(line) for line in (source / "metrics.jsonl").read_text().splitlines() if line.strip()]
        self.logged = 0

    def files(self, step: int) -> None:
        """Stage one of a recorded step: its tensors, then its JSON — not yet committed."""
        for suffix in (".safetensors", ".json"):
            name = STEP_FILE.format(step) + suffix
            shutil.copy2(self.src / "steps" / name, self.dest / "steps" / (name + ".tmp"))
            os.replace(self.dest / "steps" / (name + ".tmp"), self.dest / "steps" / name)

    def commit(self, step: int) -> None:
        """The last stage: metrics.jsonl, rewritten with every row up to ``step``, renamed into place."""
        lines = "".join(json.dumps(r) + "\n" for r in self.rows if r.get("step", 0) <= step)
        (self.dest / "metrics.tmp").write_text(lines)
        os.replace(self.dest / "metrics.tmp", self.dest / "metrics.jsonl")


def recorded(source: Path = SOURCE) -> list[int]:
    return Run(source).steps


def test_a_step_is_visible_only_once_its_metrics_row_is_logged(tmp_path):
    live = LiveCopy(tmp_path / "run")
    first, second = recorded()[:2]
    live.files(first)
    live.commit(first)
    run = Run(live.dest)
    assert run.steps == [first] and run.being_written() == []
    live.files(second)  # tensors and JSON on disk, metrics row not yet
    assert run.steps == [first], "a step whose metrics row is not logged yet is not part of the run"
    assert run.being_written() == [second]
    with pytest.raises(StepNotCommitted, match=rf"step {second} of .* is being written"):
        run.step(second)
    assert run.step().step == first, "the default step is the newest committed one"
    live.commit(second)
    assert run.steps == [first, second], "the same Run object sees the step that landed, without reopening"
    assert run.step().step == second and "old_log_probs" in run.step(second).tensors


def test_only_half_a_step_on_disk_is_being_written_not_damage(tmp_path):
    live = LiveCopy(tmp_path / "run")
    first = recorded()[0]
    name = STEP_FILE.format(first) + ".safetensors"
    shutil.copy2(SOURCE / "steps" / name, live.dest / "steps" / name)  # the JSON is not written yet
    run = Run(live.dest)
    with pytest.raises(FileNotFoundError, match=f"step {first} is being written"):
        run.step()
    live.commit(first)  # a committed step missing its half is damage, and named as such
    with pytest.raises(FileNotFoundError, match="is missing, so step .* is only half recorded"):
        run.step(first)


def test_a_step_record_reads_one_version_of_its_tensors(tmp_path):
    rec = Recorder(tmp_path / "run", {"trainer": {}}, {})
    old = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.int64)}
    rec.record_step(1, old, {"texts": {}})
    rec.log_metrics(1, {"x": 1.0})
    record = Run(tmp_path / "run").step(1)
    assert torch.equal(record["a"], old["a"])  # "b" not read yet
    rec.record_step(1, {"a": -torch.ones(2, 3), "b": torch.zeros(4, dtype=torch.int64)}, {"texts": {}})
    assert torch.equal(record["b"], old["b"]), "a tensor read after the file was replaced came from the new file"
    assert torch.equal(Run(tmp_path / "run").step(1)["a"], -torch.ones(2, 3)), "a new reader sees the new file"


def test_recorded_dtypes_and_shapes_read_back_exactly(tmp_path):
    rec = Recorder(tmp_path / "run", {"trainer": {}}, {})
    tensors = {"f64": torch.randn(3, 2, dtype=torch.float64), "bf16": torch.randn(5).to(torch.bfloat16),
               "bool": torch.tensor([True, False, True]), "i32": torch.arange(7, dtype=torch.int32),
               "empty": torch.zeros(0, 4), "scalar": torch.tensor(2.5), "u8": torch.arange(3, dtype=torch.uint8)}
    rec.record_step(1, tensors, {})
    rec.log_metrics(1, {})
    record = Run(tmp_path / "run").step(1)
    for k, t in tensors.items():
        assert record[k].dtype == t.dtype and record[k].shape == t.shape and torch.equal(record[k], t), k


def test_a_truncated_tensors_file_is_named(tmp_path):
    rec = Recorder(tmp_path / "run", {"trainer": {}}, {})
    rec.record_step(1, {"a": torch.randn(100)}, {})
    rec.log_metrics(1, {})
    path = tmp_path / "run" / "steps" / (STEP_FILE.format(1) + ".safetensors")
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ValueError, match=rf"{path.name} is not a complete safetensors file"):
        Run(tmp_path / "run").step(1)


def test_a_resume_hides_the_steps_it_records_again(tmp_path):
    rec = Recorder(tmp_path / "run", {"trainer": {}}, {})
    for k in (1, 2, 3):
        rec.record_step(k, {"a": torch.full((2,), float(k))}, {})
        rec.log_metrics(k, {"x": float(k)})
    run = Run(tmp_path / "run")
    assert run.steps == [1, 2, 3]
    resumed = Recorder(tmp_path / "run", {"trainer": {}}, {}, resume={"at_step": 1, "changed": {}})
    resumed.truncate_metrics(1)  # what ppolab.train does right after the checkpoint loads
    assert run.steps == [1] and run.being_written() == [2, 3], \
        "steps after the checkpoint must leave the run before they are recorded again"
    assert list(run.metrics.index) == [1]


def test_follow_keeps_an_explorer_on_the_newest_step(tmp_path):
    from ppolab.widgets import clip_explorer, follow, metrics_dashboard

    live = LiveCopy(tmp_path / "run")
    steps = recorded()[:3]
    run = Run(live.dest)
    box = follow(clip_explorer, run, every=None)
    assert box.explorer is None and "waiting" in box.children[0].children[1].value
    shown = None
    for s in steps:
        live.files(s)
        box.refresh()
        assert box.shown == shown, "a step being written was shown"
        assert f"step {s} is being written" in box.children[0].children[1].value
        live.commit(s)
        box.refresh()
        assert box.shown == s
        shown = s
        assert [v for _, v in box.controls["step"].options] == ["latest", *steps[:steps.index(s) + 1]]
    # the explorer on the newest step is the one clip_explorer builds on that step after training
    after = clip_explorer(Run(SOURCE), step=steps[-1])
    assert box.figures.keys() == after.figures.keys()
    for name in after.figures:
        assert box.figures[name].to_json() == after.figures[name].to_json(), name
    # a step picked by hand stays, as steps land
    box.controls["step"].value = steps[0]
    assert box.shown == steps[0]
    more = recorded()[3]
    live.files(more)
    live.commit(more)
    box.refresh()
    assert box.shown == steps[0] and more in [v for _, v in box.controls["step"].options]
    box.controls["step"].value = "latest"
    assert box.shown == more
    # the dashboard (no step parameter) is rebuilt as the log grows, on the metric the learner chose
    dash = follow(metrics_dashboard, run, every=None)
    dash.explorer.controls["metric"].value = "actor/pg_clipfrac"
    n = len(dash.explorer.figures["metric"].data[0].x)
    nxt = recorded()[4]
    live.files(nxt)
    live.commit(nxt)
    dash.refresh()
    assert dash.explorer.controls["metric"].value == "actor/pg_clipfrac"
    assert len(dash.explorer.figures["metric"].data[0].x) > n


@pytest.mark.slow  # three replays of step 1 (the explorer's own): in .ci/run's slow phase
def test_follow_keeps_a_step_limited_explorer_on_the_steps_it_can_show(tmp_path):
    """The micro-batch invariance explorer replays step 1 alone: followed on a training run it shows step 1 once it
    lands and stays there as later steps land, offering only that step."""
    from ppolab.widgets import follow, invariance_explorer

    live = LiveCopy(tmp_path / "run")
    steps = recorded()[:3]
    assert steps[0] == 1
    box = follow(invariance_explorer, Run(live.dest), every=None)
    for s in steps:
        live.files(s)
        live.commit(s)
        box.refresh()
        assert box.shown == 1 and "stopped" not in box.children[0].children[1].value
        assert [v for _, v in box.controls["step"].options] == ["latest", 1]


@pytest.mark.slow
def test_train_in_background_is_followed_to_its_end(tmp_path):
    import ppolab
    from ppolab.widgets import follow, ratio_explorer

    small = ["data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
             "actor_rollout_ref.actor.ppo_mini_batch_size=4",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "data.val_max_samples=8",
             "trainer.test_freq=-1", "trainer.record_freq=1", "trainer.total_training_steps=3",
             f"trainer.run_dir={tmp_path / 'bg'}"]
    seen = []
    training = ppolab.train_in_background("grpo_tiny", small, on_step=lambda s, m, r: seen.append(s))
    run = training.run()
    box = follow(ratio_explorer, run, every=0.2)
    final = training.join(timeout=600)
    assert final is not None and final.steps == [1, 2, 3] and training.done and seen[-3:] == [1, 2, 3]
    box.refresh()
    box.stop()
    assert box.shown == 3 and not box.poller.is_alive()
    # stop(): ends after the step in progress, the run whole up to there
    training = ppolab.train_in_background("grpo_tiny", [*small[:-2], "trainer.total_training_steps=50",
                                                        f"trainer.run_dir={tmp_path / 'stopped'}"])
    training.run()
    stopped = training.stop(timeout=600)
    assert training.done and 1 <= len(stopped.steps) < 50
    assert stopped.summary["interrupted_at_step"] == stopped.steps[-1]


def test_a_step_replaced_before_its_first_read_is_named_never_mixed(tmp_path):
    rec = Recorder(tmp_path / "run", {"trainer": {}}, {})
    rec.record_step(1, {"a": torch.ones(3)}, {})
    rec.log_metrics(1, {})
    record = Run(tmp_path / "run").step(1)  # the header only
    rec.record_step(1, {"a": torch.zeros(3)}, {})  # a resume records step 1 again
    with pytest.raises(ValueError, match="was replaced since its step was opened.*open the run again"):
        record["a"]
    assert torch.equal(Run(tmp_path / "run").step(1)["a"], torch.zeros(3))


@pytest.mark.slow
def test_a_run_trained_by_another_process_is_followed_to_its_end(tmp_path):
    """A notebook's view of a run another process trains: every look at the run dir while it is written sees only
    whole steps (no error, never a step without its metrics row), and follow ends on the last step."""
    import subprocess
    import sys
    import time

    from ppolab.widgets import follow, ratio_explorer

    run_dir = tmp_path / "other"
    cmd = [sys.executable, "-m", "ppolab.train", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
           "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
           "data.val_max_samples=8", "trainer.test_freq=-1", "trainer.record_freq=1",
           "trainer.total_training_steps=4", f"trainer.run_dir={run_dir}"]
    writer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not (run_dir / "config.json").exists():
            assert writer.poll() is None, writer.stderr.read()
            time.sleep(0.05)
        run = Run(run_dir)
        box = follow(ratio_explorer, run, every=None)
        seen = set()
        while writer.poll() is None:
            box.refresh()  # as the poller does, but as often as the test can
            for k in run.steps:
                assert k in run.metrics.index, f"step {k} listed before its metrics row was logged"
                run.step(k)["old_log_probs"]
                seen.add(k)
            time.sleep(0.02)
        assert writer.returncode == 0, writer.stderr.read()
    finally:
        if writer.poll() is None:
            writer.kill()
    box.refresh()
    assert box.shown == 4 and run.steps == [1, 2, 3, 4] and run.being_written() == []
    assert seen, "the reader never saw a step while the run trained"


def test_a_metrics_log_is_parsed_once_per_version_across_runs_opened(tmp_path, monkeypatch):
    """Every Run opened on the same log shares one parse of it; a log rewritten (another inode, size or mtime) is
    parsed again, so a reader never sees an older version of a run's metrics."""
    from ppolab.run import metrics_log

    parsed = []
    real = metrics_log.metrics_frame
    first, second = recorded()[:2]
    monkeypatch.setattr(metrics_log, "metrics_frame", lambda path: parsed.append(path) or real(path))
    live = LiveCopy(tmp_path / "run")
    live.files(first)
    live.commit(first)
    assert [Run(live.dest).steps for _ in range(5)] == [[first]] * 5 and len(parsed) == 1
    live.files(second)
    live.commit(second)
    assert Run(live.dest).steps == [first, second] and len(parsed) == 2
    frame = Run(live.dest).metrics
    frame.loc[first, "actor/pg_loss"] = 123.0  # a caller's copy: the shared parse is not changed
    assert Run(live.dest).metrics.loc[first, "actor/pg_loss"] != 123.0 and len(parsed) == 2
