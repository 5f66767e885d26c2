"""Reading a run trusts nothing it reads (issue 36): a device behind a run's file, a step that is not a number, a
huge answer, a $PPOLAB_RUN that opens no run — each is one line naming the file, the value or the variable, before
memory or time is spent on it; a large metrics file is parsed in bounded memory."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ppolab
from ppolab.errors import FileFormatError, MissingFileError, RunDirError
from ppolab.exercises import check
from ppolab.record import SHIPPED_RUNS, Run

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def copy_of_run(tmp_path):
    def make(name="grpo_tiny") -> Path:
        dest = tmp_path / name
        shutil.copytree(SHIPPED_RUNS[name], dest)
        return dest
    return make


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.json"])
def test_a_device_behind_a_runs_file_is_refused_by_name_at_once(copy_of_run, name):
    run = copy_of_run()
    (run / name).unlink()
    os.symlink("/dev/zero", run / name)
    t = time.time()
    with pytest.raises(FileFormatError) as e:
        ppolab.load_run(run).metrics
    assert time.time() - t < 5
    assert str(run / name) in str(e.value) and "device" in str(e.value) and "link" in str(e.value)


def test_a_folder_where_a_file_belongs_is_named(copy_of_run):
    run = copy_of_run()
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()
    with pytest.raises(FileFormatError, match="metrics.jsonl is a folder"):
        ppolab.load_run(run)


def test_a_step_that_is_not_a_number_names_the_file_and_line(copy_of_run):
    run = copy_of_run()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    row = json.loads(lines[3])
    row["step"] = "three"
    lines[3] = json.dumps(row)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(FileFormatError) as e:
        ppolab.load_run(run)
    assert f"{run / 'metrics.jsonl'}, line 4: step 'three' is not a whole number" in str(e.value)


def test_the_streamed_metrics_equal_the_rows_pandas_reads():
    import pandas as pd

    from ppolab.record import _metrics_frame, _read_jsonl

    for name, path in SHIPPED_RUNS.items():
        rows = pd.DataFrame(_read_jsonl(path / "metrics.jsonl")).set_index("step").sort_index()
        frame = _metrics_frame(path / "metrics.jsonl")
        assert list(frame.columns) == list(rows.columns), name
        pd.testing.assert_frame_equal(frame, rows, check_dtype=True)


def test_a_metric_of_strings_keeps_its_values(tmp_path):
    from ppolab.record import _metrics_frame

    f = tmp_path / "metrics.jsonl"
    f.write_text('{"step": 1, "a": 1.5, "b": 2}\n{"step": 2, "a": "n/a", "c": true}\n')
    frame = _metrics_frame(f)
    assert frame["a"].tolist() == [1.5, "n/a"] and frame["b"].isna().tolist() == [False, True]
    assert frame.index.tolist() == [1, 2]


@pytest.mark.slow  # writes a 200 MB file: in .ci/run's slow phase
def test_a_200_mb_metrics_file_opens_within_300_mb(tmp_path):
    run = tmp_path / "big"
    shutil.copytree(SHIPPED_RUNS["grpo_tiny"], run)
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[1])
    keys = [k for k in row if k != "step"]
    with open(run / "metrics.jsonl", "w") as f:
        step = 0
        while f.tell() < 200 * 2**20:
            step += 1
            f.write(json.dumps({"step": step, **{k: (row[k] or 0) + step * 1e-7 for k in keys}}) + "\n")
    probe = ("import resource, ppolab, sys; base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
             "m = ppolab.load_run(sys.argv[1]).metrics; "
             "print(len(m), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)")
    out = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, timeout=600,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    rows, grown_mb = out.stdout.split()
    assert int(rows) == step and float(grown_mb) < 300, out.stdout


def test_a_huge_answer_is_refused_before_it_is_converted():
    import resource

    big = torch.zeros(40_000_000)  # 160 MB; as Python lists it would be ~1.5 GB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    v = check("00.1", big)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert not v.ok and "40,000,000 or more numbers" in v.message and grown < 100, (v.message, grown)
    assert "or more numbers" not in check("00.1", torch.zeros(3)).message  # a small wrong tensor: the usual line


@pytest.mark.parametrize("value, shown", [("no/such/run", "does not exist"), ("grpo_tinyy", "did you mean"),
                                          ("file", "is a file"), ("model", "is a model directory")])
def test_a_ppolab_run_that_opens_no_run_names_the_variable(monkeypatch, tmp_path, value, shown):
    from ppolab.numbers import lab_pair, lab_run

    if value == "file":
        value = str(tmp_path / "notes.txt")
        Path(value).write_text("hello")
    elif value == "model":
        value = str(REPO / "data" / "models" / "tiny-arith")
    monkeypatch.setenv("PPOLAB_RUN", value)
    for fn, default in ((lab_run, "grpo_tiny"), (lab_pair, ("grpo_tiny", "ppo_gae_tiny"))):
        with pytest.raises(RunDirError) as e:
            fn(default)
        line = str(e.value)
        assert "\n" not in line and line.startswith(f"PPOLAB_RUN={value!r}") and shown in line, line
        assert "re-record" not in line


def test_a_missing_run_is_not_called_damaged(tmp_path):
    with pytest.raises(MissingFileError, match="does not exist"):
        ppolab.load_run(tmp_path / "nothing")


def test_a_run_of_a_newer_ppolab_opens_with_one_line_naming_both_versions(copy_of_run):
    import warnings

    from ppolab import __version__
    from ppolab.errors import RunWarning

    run = copy_of_run()
    meta = json.loads((run / "config.json").read_text())
    meta["versions"]["ppolab"] = "9.0.0"
    (run / "config.json").write_text(json.dumps(meta))
    with pytest.warns(RunWarning) as seen:
        ppolab.load_run(run)
    line = str(seen[0].message)
    assert "9.0.0" in line and __version__ in line and str(run) in line and "\n" not in line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ppolab.load_run(SHIPPED_RUNS["grpo_tiny"])  # its own version: silent


@pytest.mark.parametrize("what", ["tensors", "json", "metrics"])
def test_a_full_disk_names_the_path(tmp_path, monkeypatch, what):
    """safetensors' Rust writer raises its own error type with the OS message inside; Python's I/O an OSError 28.
    Either way: one OSError(ENOSPC) naming the file, and the file keeps its last whole version."""
    import errno

    import ppolab.record as record
    from ppolab.record import Recorder

    rec = Recorder(tmp_path / "run", {"trainer": {}}, {})
    rec.record_step(1, {"a": torch.ones(3)}, {"texts": {}})
    rec.log_metrics(1, {"x": 1.0})

    class SafetensorError(Exception):
        pass

    def full_rust(*a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def full_python(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    if what == "tensors":
        monkeypatch.setattr(record, "save_file", full_rust)
        target, act = "step_000001.safetensors", lambda: rec.record_step(1, {"a": torch.zeros(3)}, {})
    elif what == "json":
        monkeypatch.setattr(record.json, "dump", full_python)
        target, act = "config.json", lambda: rec.write_json("config.json", {"config": {}})
    else:
        monkeypatch.setattr(Path, "write_text", full_python)
        target, act = "metrics.jsonl", lambda: rec.log_metrics(2, {"x": 2.0})
    with pytest.raises(OSError) as e:
        act()
    assert e.value.errno == errno.ENOSPC and target in str(e.value) and "MiB free" in str(e.value)
    monkeypatch.undo()
    run = Run(tmp_path / "run")
    assert run.steps == [1] and torch.equal(run.step(1)["a"], torch.ones(3))
    assert not list((tmp_path / "run").rglob("*.tmp")), "a temporary file was left behind"
