"""``ppolab.verl_logs`` on what is not a verl job's log: each is one line naming the file (and line) and what was
expected. (verl's own writers, read back: tests/parity/test_verl_logs_parity.py.)"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from ppolab.errors import FileFormatError, MissingFileError
from ppolab.verl_logs import main, read_verl_metrics

RUN = Path(__file__).resolve().parents[1] / "data" / "runs" / "ppo_fire_tiny"


def lines(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "verl's file logger JSONL" in msg, msg
    return msg


def test_a_truncated_line_names_file_and_line(tmp_path):
    path = lines(tmp_path / "job.jsonl", [{"step": 1, "data": {"actor/pg_loss": 0.1}}])
    path.write_text(path.read_text() + '{"step": 2, "data": {"actor/pg_lo')
    with pytest.raises(FileFormatError) as e:
        read_verl_metrics(path)
    assert f"{path}, line 2: not valid JSON" in one_line(e)


def test_another_trainers_log_is_named(tmp_path):
    shutil.copy(RUN / "metrics.jsonl", tmp_path / "metrics.jsonl")  # ppolab's own format: no "data"
    with pytest.raises(FileFormatError) as e:
        read_verl_metrics(tmp_path / "metrics.jsonl")
    assert "line 1" in one_line(e) and "is not a line of" in str(e.value)


@pytest.mark.parametrize("what", ["empty folder", "folder of notes", "empty file", "two logs"])
def test_a_folder_or_file_with_no_log_is_named(tmp_path, what):
    target = tmp_path / "x"
    if what == "empty file":
        target.write_text("")
    else:
        target.mkdir()
        if what == "folder of notes":
            (target / "notes.txt").write_text("hello")
        if what == "two logs":
            for name in ("a.jsonl", "b.jsonl"):
                lines(target / name, [{"step": 1, "data": {"x": 1.0}}])
    with pytest.raises(FileFormatError) as e:
        read_verl_metrics(target)
    assert str(target) in one_line(e)


def test_a_missing_path_is_named(tmp_path):
    with pytest.raises(MissingFileError) as e:
        read_verl_metrics(tmp_path / "nope.jsonl")
    assert str(tmp_path / "nope.jsonl") in one_line(e)


def test_steps_logged_in_parts_merge_and_the_dashboard_shows_them(tmp_path, capsys):
    from ppolab.widgets import metrics_dashboard

    path = lines(tmp_path / "job.jsonl", [{"step": 0, "data": {"val-core/arith/acc/mean@1": 0.1}},
                                          {"step": 1, "data": {"actor/pg_loss": 0.5, "critic/score/mean": 0.2}},
                                          {"step": 1, "data": {"timing_s/step": 3.0}},
                                          {"step": 2, "data": {"actor/pg_loss": 0.4, "critic/score/mean": 0.3}}])
    frame = read_verl_metrics(path)
    assert list(frame.index) == [0, 1, 2] and frame.loc[1, "timing_s/step"] == 3.0
    assert isinstance(frame, pd.DataFrame) and frame.index.name == "step"
    box = metrics_dashboard(metrics=frame)
    assert box.controls["metric"].value == "critic/score/mean" and list(box.figures["metric"].data[0].y) == [0.2, 0.3]
    assert main([str(path)]) == 0 and "3 logged steps" in capsys.readouterr().out
    assert main([str(tmp_path / "nope")]) == 1 and capsys.readouterr().err.startswith("error: ")
