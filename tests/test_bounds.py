"""Bounds a user can trip over: a reward hung in a background training, a follow that would re-read the run dir
without pause, and ``ppolab logs`` on logs that are huge, damaged, nested without end, out of range or linked twice.
Each ends in one line naming the culprit (or a short report), never a hang, a crash or a 4 MB line."""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from ppolab.errors import ArgumentError, FileFormatError, RewardError, RunWarning
from ppolab.verl_logs import main, read_verl_metrics
from helpers import NO_VAL, TINY

RUN = Path(__file__).resolve().parents[1] / "data" / "runs" / "ppo_fire_tiny"


def lines(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows))
    return path


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# ====================================================================== a reward hung in a background training
def test_a_hung_reward_ends_a_background_training_with_the_timeout_error(tmp_path, capfd):
    import ppolab

    started = tmp_path / "started"
    f = tmp_path / "my_reward.py"
    f.write_text("import threading\n\ndef my_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 f"    open({str(started)!r}, 'w').close()\n    threading.Event().wait()  # never set\n")
    training = ppolab.train_in_background("grpo_tiny", [
        *TINY, *NO_VAL, "trainer.total_training_steps=1", f"trainer.run_dir={tmp_path / 'run'}",
        f"custom_reward_function.path={f}", "custom_reward_function.name=my_score",
        "custom_reward_function.timeout_s=1"])
    deadline = time.monotonic() + 300
    while not started.exists() and not training.done and time.monotonic() < deadline:
        time.sleep(0.05)
    hung_at = time.monotonic()
    training._thread.join(30)
    assert training.done, "the background training still hangs 30 s after its reward passed timeout_s=1"
    assert time.monotonic() - hung_at < 10
    assert isinstance(training.error, RewardError) and "failed" in repr(training)
    message = str(training.error)
    assert "\n" not in message and "my_score" in message and str(f) in message
    assert "took more than 1 s" in message and "custom_reward_function.timeout_s" in message
    with pytest.raises(RewardError, match="took more than 1 s"):
        training.join()
    err = capfd.readouterr().err
    assert "my_score" in err and "it is stopped after 1 s" in err and "no time limit" not in err


# ====================================================================== follow(every=…)
@pytest.mark.parametrize("every", [0, -1, float("nan"), float("inf"), True, "2"])
def test_follow_refuses_an_every_that_would_spin_or_never_look(every):
    from ppolab.widgets import follow, metrics_dashboard

    with pytest.raises(ArgumentError) as e:
        follow(metrics_dashboard, RUN, every=every)
    assert one_line(e).startswith("every must be a finite number of seconds > 0") and repr(every) in str(e.value)


# ====================================================================== ppolab logs
def test_a_job_logging_100000_unknown_names_gets_a_short_report(tmp_path, capsys):
    names = {f"myjob/custom_metric_number_{i:06d}": 0.5 for i in range(100_000)}
    path = lines(tmp_path / "job.jsonl", [{"step": 1, "data": {**names, "actor/pg_loss": 0.1}},
                                          {"step": 2, "data": {"actor/pg_loss": 0.2, "x" * 5000: 1.0}}])
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert len(out) < 2000 and max(len(line) for line in out.splitlines()) < 300, out
    assert "(100,001;" in out and "myjob/custom_metric_number_000000" in out and "… and 99,9" in out


def test_a_deeply_nested_line_names_file_and_line(tmp_path):
    path = lines(tmp_path / "job.jsonl", [{"step": 1, "data": {"actor/pg_loss": 0.1}},
                                          '{"step": 2, "data": {"x": ' + "[" * 10_000 + "]" * 10_000 + "}}\n"])
    with pytest.raises(FileFormatError) as e:
        read_verl_metrics(path)
    assert f"{path}, line 2: JSON nested deeper than" in one_line(e)


@pytest.mark.parametrize("step", [2**70, 2**63, -1])
def test_a_step_out_of_range_names_file_and_line(tmp_path, step):
    path = lines(tmp_path / "job.jsonl", [{"step": 1, "data": {"actor/pg_loss": 0.1}},
                                          {"step": step, "data": {"actor/pg_loss": 0.2}}])
    with pytest.raises(FileFormatError) as e:
        read_verl_metrics(path)
    assert f"{path}, line 2: step {step} is out of range" in one_line(e)


def test_the_largest_int64_step_still_reads(tmp_path):
    path = lines(tmp_path / "job.jsonl", [{"step": 2**63 - 1, "data": {"actor/pg_loss": 0.1}}])
    assert list(read_verl_metrics(path).index) == [2**63 - 1]


def test_a_latest_link_beside_the_job_folders_is_not_a_second_job(tmp_path):
    root = tmp_path / "logs"
    lines(root / "job1" / "exp.jsonl", [{"step": 1, "data": {"actor/pg_loss": 0.1}}])
    (root / "latest").symlink_to(root / "job1", target_is_directory=True)
    assert list(read_verl_metrics(root)["actor/pg_loss"]) == [0.1]  # one job, not "2 .jsonl file(s)"
    lines(root / "job2" / "exp.jsonl", [{"step": 1, "data": {"actor/pg_loss": 0.3}}])
    with pytest.raises(FileFormatError, match=r"holds 2 \.jsonl file\(s\)"):  # two jobs, counted once each
        read_verl_metrics(root)


def _record(data: bytes) -> bytes:
    from ppolab.verl_logs import _masked_crc32c

    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", _masked_crc32c(header)) + data + struct.pack("<I", _masked_crc32c(data))


def test_an_event_folder_holding_only_damaged_files_names_them(tmp_path):
    job = tmp_path / "tensorboard_log" / "proj" / "exp"
    job.mkdir(parents=True)
    (job / "events.out.tfevents.1.host.1.0").write_bytes(b"\x00garbage, not a record" * 20)
    (job / "events.out.tfevents.2.host.1.0").write_bytes(_record(b"x" * 40)[:30])  # cut inside its first record
    with pytest.raises(FileFormatError) as e:
        read_verl_metrics(tmp_path / "tensorboard_log")
    msg = one_line(e)
    assert "no readable TensorBoard event file" in msg and "events.out.tfevents.1.host.1.0" in msg
    assert "and 1 more damaged file" in msg


def test_the_framing_walk_finds_where_a_file_is_torn(tmp_path):
    from ppolab.verl_logs import _damage

    whole = _record(b"a" * 10) + _record(b"b" * 20)
    f = tmp_path / "events.out.tfevents.1"
    f.write_bytes(whole)
    assert _damage(f) is None
    f.write_bytes(whole[:-3])
    assert _damage(f) == (1, len(_record(b"a" * 10)))
    f.write_bytes(b"\xff" * 12 + whole)
    assert _damage(f) == (0, 0)


def test_a_damaged_event_file_beside_a_good_one_is_named_and_the_good_one_read(tmp_path):
    pytest.importorskip("tensorboard", reason="reading TensorBoard logs needs tensorboard (pip install tensorboard)")
    from torch.utils.tensorboard import SummaryWriter

    job = tmp_path / "tensorboard_log" / "proj" / "exp"
    writer = SummaryWriter(str(job))
    for step in (1, 2, 3):
        writer.add_scalar("actor/pg_loss", 0.1 * step, step)
    writer.close()
    good = next(job.glob("events.out.tfevents.*"))
    bad = job / "events.out.tfevents.0.garbage"  # sorts first
    bad.write_bytes(b"\x00not an event file" * 30)
    torn = job / "events.out.tfevents.9.torn"
    torn.write_bytes(good.read_bytes()[:-7])
    with pytest.warns(RunWarning) as caught:
        frame = read_verl_metrics(tmp_path / "tensorboard_log")
    assert list(frame.index) == [1, 2, 3] and frame.loc[3, "actor/pg_loss"] == pytest.approx(0.3)
    said = [str(w.message) for w in caught]
    assert any(str(bad) in s and "not a TensorBoard event file" in s for s in said), said
    assert any(str(torn) in s and "damaged at byte" in s for s in said), said
    assert main([str(tmp_path / "tensorboard_log")]) == 0
