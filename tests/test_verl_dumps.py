"""A verl job's rollout dumps (``trainer.rollout_data_dir``) read as per-step group statistics: the files written
here follow verl 0.9.1's ``trainer/ppo/v1/trainer_base.py::_write_generations`` line for line (its own writer writes
them in tests/parity/test_verl_logs_parity.py); a file of another shape is one line naming it."""
from __future__ import annotations

import json

import pytest

from ppolab.errors import FileFormatError
from ppolab.verl_dumps import group_statistics, read_rollout_dumps
from ppolab.verl_logs import read_verl_metrics, report


def write_step(folder, step, groups, uid=True):
    """``groups``: one list of (score, output) per prompt; V1's uid is ``{prompt uid}_{session}_{index}``."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{step}.jsonl", "w") as f:
        for g, trajectories in enumerate(groups):
            for i, (score, output) in enumerate(trajectories):
                row = {"input": f"prompt {g}", "output": output, "gts": str(g), "score": score, "step": step}
                if uid:
                    row["uid"] = f"p{g}x{step}_{i}_0"
                f.write(json.dumps(row) + "\n")


def test_group_statistics_count_the_groups_without_signal(tmp_path):
    write_step(tmp_path, 1, [[(1.0, "a"), (0.0, "bb")], [(1.0, "a"), (1.0, "a")], [(0.0, "x"), (0.0, "yyy")],
                             [(0.0, "q"), (1.0, "qq")]])
    write_step(tmp_path, 2, [[(1.0, "a"), (1.0, "ab")], [(0.0, "c"), (1.0, "cd")]])
    stats = group_statistics(read_rollout_dumps(tmp_path))
    assert list(stats.index) == [1, 2]
    s1 = stats.loc[1]
    assert s1["ppolab/signal/uniform_group_frac"] == 0.5  # groups 1 (all 1) and 2 (all 0) of 4
    assert s1["ppolab/signal/identical_group_frac"] == 0.25  # group 1: "a", "a"
    assert (s1["ppolab/dump/groups"], s1["ppolab/dump/trajectories"], s1["ppolab/dump/group_size"]) == (4, 8, 2)
    assert s1["ppolab/dump/score/mean"] == 0.5 and s1["ppolab/dump/response_chars/max"] == 3
    assert stats.loc[2, "ppolab/signal/uniform_group_frac"] == 0.5


def test_the_legacy_trainers_dumps_group_by_prompt_text(tmp_path):
    write_step(tmp_path, 5, [[(1.0, "a"), (1.0, "b")], [(0.0, "c"), (1.0, "d")]], uid=False)
    assert group_statistics(read_rollout_dumps(tmp_path)).loc[5, "ppolab/signal/uniform_group_frac"] == 0.5


def test_ppolab_logs_reads_a_dump_folder_and_lab_15s_names(tmp_path):
    write_step(tmp_path, 1, [[(1.0, "a"), (1.0, "a")]] * 3)
    frame = read_verl_metrics(tmp_path)
    assert frame.loc[1, "ppolab/signal/uniform_group_frac"] == 1.0
    text = "\n".join(report(tmp_path))
    assert "1 logged steps" in text and "no description" not in text, text


@pytest.mark.parametrize("content, words", [
    ("{not json", "line 1: not JSON"),
    ('{"input": "p", "output": "o"}', "line 1: no score"),
    ('{"input": "p", "output": "o", "score": "high"}', "score='high' is not a finite number"),
    ('{"input": "p", "output": "o", "score": 1, "step": 9}', "step=9 in a file named for step 3"),
    ('{"input": "p", "output": "o", "score": 1}\n{"input": "p", "outp', "line 2: not JSON .* ends mid-line"),
])
def test_a_file_that_is_not_verls_dump_is_named(tmp_path, content, words):
    (tmp_path / "3.jsonl").write_text(content + ("" if "outp" in content[-6:] else "\n"))
    with pytest.raises(FileFormatError, match=words) as e:
        read_rollout_dumps(tmp_path)
    assert "3.jsonl" in str(e.value) and "\n" not in str(e.value)
