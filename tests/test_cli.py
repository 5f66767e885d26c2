"""The ``ppolab`` command (ppolab/cli.py): its entry point is declared, and each subcommand does what the README's
commands do — labs copied without ever overwriting a learner's notebook, a verl log reported, train and site reached."""
from __future__ import annotations

from pathlib import Path

import pytest

from ppolab.cli import LABS, copy_labs, main

ROOT = Path(__file__).resolve().parents[1]


def test_the_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"ppolab": "ppolab.cli:main"}


def test_python_dash_m_ppolab_is_the_ppolab_command(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ppolab", "logs", str(ROOT / "data" / "verl_logs" /
                                                                   "ppo_fire_tiny.jsonl")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "31 logged steps" in out.stdout, out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-m", "ppolab", "bogus"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "invalid choice: 'bogus'" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("zh", [False, True])
def test_labs_are_copied_and_an_edited_notebook_is_kept(tmp_path, capsys, zh):
    source = LABS / "zh" if zh else LABS
    names = sorted(p.name for p in source.glob("*.ipynb"))
    assert main(["labs", str(tmp_path / "course"), "--no-start", *(["--zh"] if zh else [])]) == 0
    assert sorted(p.name for p in (tmp_path / "course").glob("*.ipynb")) == names
    assert f"{len(names)} notebook(s) copied" in capsys.readouterr().out
    mine = tmp_path / "course" / names[4]
    mine.write_text(mine.read_text().replace('"cells": [', '"cells": [ ', 1))  # the learner's edits
    edited = mine.read_bytes()
    copied, same, kept = copy_labs(tmp_path / "course", zh)
    assert (copied, kept) == ([], [names[4]]) and len(same) == len(names) - 1
    assert mine.read_bytes() == edited, "a notebook the learner edited was overwritten"
    main(["labs", str(tmp_path / "course"), "--no-start", *(["--zh"] if zh else [])])
    assert f"kept your {names[4]}" in capsys.readouterr().out


def test_logs_train_and_site_reach_their_modules(capsys):
    assert main(["logs", str(ROOT / "data" / "verl_logs" / "ppo_fire_tiny.jsonl")]) == 0
    assert "31 logged steps" in capsys.readouterr().out
    assert main(["train", "--preset", "no_such_preset"]) == 2
    assert "no_such_preset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["site", "--help"])
    assert "output folder" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["bogus"])
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


def test_labs_starts_this_pythons_jupyterlab_with_the_arguments_after_dashdash(tmp_path, monkeypatch, capsys):
    import sys

    import ppolab.cli

    started = []

    class FakeLab:
        def __init__(self, argv):
            started.append(argv)

        def wait(self):
            return 0

        def terminate(self):
            pass

    monkeypatch.setattr(ppolab.cli.subprocess, "Popen", FakeLab)
    monkeypatch.setattr(ppolab.cli, "_as_root", lambda: False)  # as root it adds --allow-root (test_labs_command_trust)
    dest = tmp_path / "course"
    assert main(["labs", str(dest), "--", "--no-browser", "--port=8899", "--zh"]) == 0
    # `python -m jupyterlab` of this interpreter (not the first `jupyter-lab` on PATH); `--zh` after -- is JupyterLab's
    assert started == [[sys.executable, "-m", "jupyterlab", "--no-browser", "--port=8899", "--zh", str(dest)]]
    lab = next(LABS.glob("04_*.ipynb"))
    assert (dest / lab.name).read_bytes() == lab.read_bytes()  # the English edition: --zh went to JupyterLab
    assert main(["labs", str(tmp_path / "zh"), "--zh", "--no-start", "--", "--port=1"]) == 0 and len(started) == 1
