"""One fingerprint rule for what a run depends on: the base model (replay included) is found by fingerprint wherever
the run was moved, a model folder changed in place is refused, and the run's ``tokenizer/`` is fingerprinted when
recorded and checked when read — a mismatch or damage stops in one line naming the path (and both fingerprints)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ppolab.errors import FileFormatError, MissingFileError
from ppolab.run.files import write_json
from ppolab.run.reader import Run
from ppolab.run.recorder import Recorder
from ppolab.replay import models_config
from ppolab.run.identity import fingerprint, folder_fingerprint

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "runs"
MODEL = ROOT / "data" / "models" / "tiny-arith"


def copy_run(dest: Path, name: str = "ppo_fire_tiny") -> Path:
    """The parts of a shipped run these tests read: config.json and tokenizer/."""
    dest.mkdir()
    shutil.copy2(RUNS / name / "config.json", dest / "config.json")
    shutil.copytree(RUNS / name / "tokenizer", dest / "tokenizer")
    return dest


def edit_config(run_dir: Path, edit) -> None:
    meta = json.loads((run_dir / "config.json").read_text())
    edit(meta)
    write_json(run_dir / "config.json", meta)


def test_every_shipped_run_records_its_tokenizers_fingerprint():
    for name in ("grpo_tiny", "ppo_gae_tiny", "ppo_fire_tiny", "grpo_tool_tiny", "grpo_temp_tiny"):
        run = Run(RUNS / name)
        assert run.info["fingerprints"]["tokenizer"] == folder_fingerprint(run.path / "tokenizer"), name
        run.tokenizer()  # and it reads


def test_a_tokenizer_of_another_vocabulary_is_refused_naming_both_fingerprints(tmp_path):
    run_dir = copy_run(tmp_path / "run")
    recorded = Run(run_dir).info["fingerprints"]["tokenizer"]
    shutil.rmtree(run_dir / "tokenizer")
    shutil.copytree(RUNS / "grpo_tool_tiny" / "tokenizer", run_dir / "tokenizer")  # a vocabulary with tool tokens
    found = folder_fingerprint(run_dir / "tokenizer")
    assert found != recorded
    with pytest.raises(FileFormatError) as e:
        Run(run_dir).tokenizer()
    msg = str(e.value)
    assert str(run_dir / "tokenizer") in msg and recorded in msg and found in msg and "\n" not in msg


def test_a_file_put_beside_the_tokenizer_files_is_named(tmp_path):
    run_dir = copy_run(tmp_path / "run")
    (run_dir / "tokenizer" / "notes.txt").write_text("my notes")
    with pytest.raises(FileFormatError) as e:
        Run(run_dir).tokenizer()
    msg = str(e.value)
    assert str(run_dir / "tokenizer" / "notes.txt") in msg and "move it out" in msg and "\n" not in msg, msg
    (run_dir / "tokenizer" / "notes.txt").unlink()
    Run(run_dir).tokenizer()  # the recorded files alone: read


@pytest.mark.parametrize("damage", ["truncated", "not_json", "empty"])
def test_damaged_tokenizer_files_name_the_folder(tmp_path, damage):
    run_dir = copy_run(tmp_path / "run")
    edit_config(run_dir, lambda m: m["fingerprints"].pop("tokenizer"))  # a run recorded before the fingerprint
    target = run_dir / "tokenizer" / "tokenizer.json"
    text = target.read_text()
    target.write_text({"truncated": text[: len(text) // 2], "not_json": "{'vocab': ", "empty": ""}[damage])
    with pytest.raises((FileFormatError, MissingFileError)) as e:
        Run(run_dir).tokenizer()
    assert str(run_dir / "tokenizer") in str(e.value), str(e.value)


def test_a_recorded_tokenizer_is_fingerprinted_and_a_resume_keeps_it(tmp_path):
    from ppolab.models import load_tokenizer_files

    rec = Recorder(tmp_path / "run", {"actor_rollout_ref": {"model": {"path": str(MODEL)}}}, {})
    rec.save_tokenizer(load_tokenizer_files(RUNS / "grpo_tiny" / "tokenizer"))
    run = Run(tmp_path / "run")
    assert run.info["fingerprints"]["tokenizer"] == folder_fingerprint(tmp_path / "run" / "tokenizer") is not None
    run.tokenizer()
    Recorder(tmp_path / "run", {"actor_rollout_ref": {"model": {"path": str(MODEL)}}}, {},
             resume={"at_step": 0, "changed": {}})
    assert Run(tmp_path / "run").info["fingerprints"]["tokenizer"] == run.info["fingerprints"]["tokenizer"]


def test_replay_finds_a_moved_runs_model_by_fingerprint(tmp_path):
    run_dir = copy_run(tmp_path / "run")
    edit_config(run_dir, lambda m: m["config"]["actor_rollout_ref"]["model"].update(
        path="/a/machine/that/is/gone/tiny-arith"))
    cfg = models_config(Run(run_dir))
    assert Path(cfg.actor_rollout_ref.model.path) == MODEL and fingerprint(MODEL) == \
        Run(run_dir).info["fingerprints"]["actor_rollout_ref.model.path"]


def test_a_model_folder_changed_in_place_is_refused_by_replay(tmp_path):
    model = tmp_path / "my-model"
    shutil.copytree(MODEL, model)
    run_dir = copy_run(tmp_path / "run")

    def point_at_copy(meta):
        meta["config"]["actor_rollout_ref"]["model"]["path"] = str(model)
        meta["config"]["critic"]["model"]["path"] = str(model)
        meta["fingerprints"]["actor_rollout_ref.model.path"] = fingerprint(model)
        meta["fingerprints"]["critic.model.path"] = fingerprint(model)
    edit_config(run_dir, point_at_copy)
    assert Path(models_config(Run(run_dir)).actor_rollout_ref.model.path) == model
    recorded = fingerprint(model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "retrained": True}))  # trained again in place
    with pytest.raises(MissingFileError) as e:
        models_config(Run(run_dir))
    msg = str(e.value)
    assert str(model) in msg and recorded in msg and fingerprint(model) in msg and "in place" in msg
