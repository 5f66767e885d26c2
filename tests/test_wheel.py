"""The wheel carries the course: built from this checkout, installed (not editable) into a fresh venv and used from a
folder outside the repository, it trains, opens a shipped run and copies the labs — and a lab runs there.

The venv (tests/wheel_env.py, the ``wheel_venv`` fixture) takes ppolab from the wheel alone and its other packages
from the test's own environment; it is built once a session and shared with tests/browser/test_labs_command.py, which
starts JupyterLab with ``ppolab labs`` and runs lab 04 in a browser."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from wheel_env import run

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # builds a wheel, trains a step and runs a lab in a fresh venv (≈ 1 min)


@pytest.fixture(scope="module")
def installed(wheel_venv, tmp_path_factory) -> tuple[Path, Path]:
    """The wheel's venv and an empty folder outside the repository for this file's tests to work in."""
    return wheel_venv, tmp_path_factory.mktemp("elsewhere")


def test_the_wheel_opens_a_shipped_run_from_any_folder(installed):
    env_dir, outside = installed
    out = run([str(env_dir / "bin" / "python"), "-c",
               "import json, ppolab; r = ppolab.load_run('grpo_tiny'); "
               "print(json.dumps({'module': ppolab.__file__, 'run': str(r.path), 'steps': len(r.steps)}))"], outside)
    got = json.loads(out.strip().splitlines()[-1])
    assert str(env_dir) in got["module"] and str(ROOT) not in got["module"], got  # the wheel's, not the checkout's
    assert "_course/data/runs/grpo_tiny" in got["run"] and got["steps"] > 1, got


def test_the_shipped_verl_job_and_log_open_by_name_from_the_wheel(installed):
    env_dir, outside = installed
    out = run([str(env_dir / "bin" / "ppolab"), "doctor", "verl", "ppo_fire_tiny", "--metrics", "ppo_fire_tiny"],
              outside)
    assert "verl version: 0.9.1 by its keys" in out and "data-parallel size 2" in out, out[:2000]
    assert "data/verl_logs/ppo_fire_tiny.jsonl: 31 logged steps" in out, out[-2000:]


def test_ppolab_train_learns_from_the_wheel(installed):
    env_dir, outside = installed
    run([str(env_dir / "bin" / "ppolab"), "train", "trainer.total_training_steps=2", "trainer.test_freq=-1",
         "trainer.run_dir=run"], outside)
    rows = [json.loads(x) for x in (outside / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]
    config = json.loads((outside / "run" / "config.json").read_text())
    assert "_course/data/models/tiny-arith" in json.dumps(config)  # the shipped model, found inside the package


def test_ppolab_labs_copies_the_course_and_a_lab_runs_there(installed):
    env_dir, outside = installed
    out = run([str(env_dir / "bin" / "ppolab"), "labs", "course", "--no-start"], outside)
    assert "notebook(s) copied" in out
    lab = next((outside / "course").glob("04_*.ipynb"))
    # the kernel is the venv's own python (nbclient's "python3" is the interpreter that runs it)
    run([str(env_dir / "bin" / "python"), "-c",
         "import nbclient, nbformat, sys; nb = nbformat.read(sys.argv[1], as_version=4); "
         "nbclient.NotebookClient(nb, timeout=600, kernel_name='python3').execute(); "
         "print(sum(len(c.get('outputs', [])) for c in nb.cells), 'outputs')", lab.name],
        outside / "course", timeout=900)
    zh = run([str(env_dir / "bin" / "ppolab"), "labs", "course-zh", "--zh", "--no-start"], outside)
    assert "notebook(s) copied" in zh and any((outside / "course-zh").glob("04_*.ipynb"))
