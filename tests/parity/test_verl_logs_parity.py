"""A verl job's metrics, as verl 0.9.1's own writers leave them, read by ``ppolab.verl_logs``: the metrics of a
shipped ppolab run are logged through verl's ``utils/tracking.py`` — its ``FileLogger`` (JSONL) and its
``_TensorboardAdapter`` (TensorBoard) — and read back; the values are the run's, and §15's warning signs are the ones
lab 15 shows on that run.

Skipped (loudly) unless verl's source is on the path, with orjson (the FileLogger's serializer) and, for the
TensorBoard half, tensorboard installed; ``.ci/run``'s verl phase installs verl with them
(``pip install -e ".[verl]"``); an unpacked wheel on the path also serves::

    pip download verl==0.9.1 --no-deps -d /tmp/verl091 && (cd /tmp/verl091 && unzip -q verl-0.9.1-py3-none-any.whl)
    .venv/bin/pip install orjson tensorboard
    PYTHONPATH=/tmp/verl091 .venv/bin/python -m pytest tests/parity/test_verl_logs_parity.py -q -n0

verl's module is loaded from its file: it imports nothing of verl's at module level.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from ppolab.numbers.metrics import warning_signs
from ppolab.run.reader import Run
from ppolab.verl_logs import read_verl_metrics, report

_SPEC = importlib.util.find_spec("verl")
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("verl's source is not on the path (see the module docstring)", allow_module_level=True)
pytest.importorskip("orjson", reason="verl's FileLogger writes with orjson (pip install orjson)")
ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "data" / "runs" / "ppo_fire_tiny"
_TOOL = importlib.util.spec_from_file_location("verl_log_example", ROOT / "tools" / "verl_log_example.py")
example = importlib.util.module_from_spec(_TOOL)
_TOOL.loader.exec_module(example)


def same_frame(frame, run: Run, tol: float) -> None:
    want = run.metrics
    assert list(frame.index) == list(want.index)
    for name in want.columns:
        for step, value in want[name].items():
            if value == value:
                got = frame.loc[step, name]
                assert math.isclose(float(got), float(value), rel_tol=tol, abs_tol=tol), (name, step, got, value)


def test_verls_file_logger_reads_back_with_lab_15s_warning_signs(tmp_path, monkeypatch):
    path = tmp_path / "verl_job.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    run = example.log_run(example.verl_tracking().FileLogger("ppolab", "ppo_fire_tiny"),
                          extra={"my_reward/bonus": 0.5})
    frame = read_verl_metrics(path)
    same_frame(frame, run, 1e-12)
    assert warning_signs(frame) == warning_signs(run)
    text = "\n".join(report(path))
    assert "my_reward/bonus" in text.split("no description for")[1], "a metric ppolab does not know was dropped"
    for sign in warning_signs(run):
        assert str(sign) in text


def test_verls_tensorboard_log_reads_back_with_lab_15s_warning_signs(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="verl's TensorBoard logger needs tensorboard (pip install tensorboard)")
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    run = example.log_run(example.verl_tracking()._TensorboardAdapter("ppolab", "ppo_fire_tiny"))
    frame = read_verl_metrics(tmp_path / "tb")
    same_frame(frame, run, 1e-6)  # TensorBoard keeps float32
    assert warning_signs(frame) == warning_signs(run)


def test_the_shipped_example_is_what_verls_file_logger_writes(tmp_path, monkeypatch):
    """data/verl_logs/ppo_fire_tiny.jsonl (the labs' "your verl job" example) byte for byte."""
    out = example.write(tmp_path / "again.jsonl")
    assert out.read_bytes() == example.OUT.read_bytes(), "re-run tools/verl_log_example.py"


@pytest.mark.parametrize("with_uid", [True, False])
def test_rollout_dumps_written_by_verls_own_writer_read_as_group_statistics(tmp_path, with_uid):
    """verl 0.9.1 writes ``trainer.rollout_data_dir/<step>.jsonl`` with ``_write_generations`` — here the legacy
    ``trainer/ppo/ray_trainer.py::RayPPOTrainer``'s (the V1 ``trainer/ppo/v1/trainer_base.py`` has the same lines but
    needs transfer_queue to import): scores as ``_log_rollout_data`` passes them (``.tolist()``), with the V1
    trainer's uid ``{prompt uid}_{session}_{index}`` or, as the legacy trainer writes, none (a group is then one
    prompt's text). ppolab reads those files as its group statistics."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from ppolab.verl_dumps import group_statistics, read_rollout_dumps

    # two steps, three prompts of two responses: step 1 has one group with no signal (both 1.0), step 2 two
    for step, scores in ((1, [1.0, 1.0, 0.0, 1.0, 0.0, 0.5]), (2, [0.0, 0.0, 1.0, 1.0, 0.0, 1.0])):
        extra = {"uid": [f"u{g}_{i}_0" for g in range(3) for i in range(2)]} if with_uid else {}
        RayPPOTrainer._write_generations(inputs=[f"prompt {g}" for g in range(3) for _ in range(2)],
                                         outputs=[f"answer {k}" for k in range(6)], gts=["1"] * 6, scores=scores,
                                         reward_extra_infos_dict=extra, dump_path=str(tmp_path), global_steps=step)
    stats = group_statistics(read_rollout_dumps(tmp_path))
    assert stats["ppolab/signal/uniform_group_frac"].round(6).tolist() == [round(1 / 3, 6), round(2 / 3, 6)]
    assert stats["ppolab/dump/groups"].tolist() == [3.0, 3.0] and stats["ppolab/dump/trajectories"].tolist() == [6, 6]
    assert read_verl_metrics(tmp_path).loc[2, "ppolab/dump/score/mean"] == 0.5
