"""The wheel carries the course: built from this checkout, installed (not editable) into a fresh venv and used from a
folder outside the repository, it trains, opens a shipped run and copies the labs — and a lab runs there.

The fresh venv takes ppolab from the wheel alone; its other packages (torch, transformers, …) come from the test's
own environment through a ``.pth`` line, so the test installs nothing from an index. The path line does not run that
environment's editable-install hook, so no checkout can shadow the wheel (asserted)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # builds a wheel, trains a step and runs a lab in a fresh venv (≈ 1 min)


def run(cmd: list[str], cwd: Path, timeout: int = 600) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PPOLAB_RUN", "PYTHONPATH"))}
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
         str(ROOT)], cwd=tmp)
    wheel = next((tmp / "dist").glob("ppolab-*.whl"))
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    purelib = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).strip()
    Path(purelib, "ppolab_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=tmp)
    outside = tmp / "elsewhere"
    outside.mkdir()
    print(f"wheel {wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB")
    return env_dir, outside


def test_the_wheel_opens_a_shipped_run_from_any_folder(installed):
    env_dir, outside = installed
    out = run([str(env_dir / "bin" / "python"), "-c",
               "import json, ppolab; r = ppolab.load_run('grpo_tiny'); "
               "print(json.dumps({'module': ppolab.__file__, 'run': str(r.path), 'steps': len(r.steps)}))"], outside)
    got = json.loads(out.strip().splitlines()[-1])
    assert str(env_dir) in got["module"] and str(ROOT) not in got["module"], got  # the wheel's, not the checkout's
    assert "_course/data/runs/grpo_tiny" in got["run"] and got["steps"] > 1, got


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
