"""``ppolab labs DIR`` writes only what it made (ppolab/labs_copy.py, ppolab/cli.py): a link planted at a temporary's
name is never followed, a learner's link or file at a notebook's name is kept and named, a DIR that cannot hold the
course is one line naming it (exit 1, no traceback), root gets ``--allow-root`` said aloud, and a script run beside
the clone imports the editable install, not the clone's folder as a namespace package."""
from __future__ import annotations

import errno
import itertools
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import ppolab.cli
import ppolab.labs_copy
from ppolab.cli import LABS, copy_labs, main

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(p.name for p in LABS.glob("*.ipynb"))


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_links_planted_at_temporary_names_are_never_followed(tmp_path, monkeypatch):
    dest = tmp_path / "course"
    dest.mkdir()
    victims = {}
    # the names of the old writer (.NAME.tmp) and the first name the new one will try, for every notebook
    tokens = itertools.chain.from_iterable(("planted", f"fresh{i}") for i in itertools.count())
    monkeypatch.setattr(ppolab.labs_copy.secrets, "token_hex", lambda n: next(tokens))
    for name in NAMES:
        for planted in (f".{name}.tmp", f".{name}.planted.tmp"):
            victim = tmp_path / f"victim-{planted}"
            victim.write_bytes(b"someone else's file\n")
            os.symlink(victim, dest / planted)
            victims[planted] = victim
    old = os.umask(0o027)
    try:
        copied, same, kept = copy_labs(dest)
    finally:
        os.umask(old)
    assert (copied, same, kept) == (NAMES, [], [])
    for planted, victim in victims.items():
        assert victim.read_bytes() == b"someone else's file\n", f"{planted} was followed"
        assert os.readlink(dest / planted) == str(victim)
    for name in NAMES:
        assert (dest / name).read_bytes() == (LABS / name).read_bytes()
        assert stat.S_IMODE((dest / name).lstat().st_mode) == 0o640  # 0o666 less the umask, as open() gives
    assert sorted(p.name for p in dest.iterdir() if p.name.startswith(".")) == sorted(victims), "a temporary left"


def test_a_learners_links_at_notebook_names_are_kept_and_named(tmp_path, capsys):
    dest = tmp_path / "course"
    dest.mkdir()
    mine = tmp_path / "drive" / "mine.ipynb"
    mine.parent.mkdir()
    mine.write_bytes(b'{"cells": []}')
    same_as_course = tmp_path / "drive" / "same.ipynb"
    same_as_course.write_bytes((LABS / NAMES[2]).read_bytes())
    links = {NAMES[0]: "/mnt/not-mounted-now/00.ipynb", NAMES[1]: str(mine), NAMES[2]: str(same_as_course)}
    for name, to in links.items():
        os.symlink(to, dest / name)
    assert main(["labs", str(dest), "--no-start"]) == 0
    out = capsys.readouterr().out
    for name, to in links.items():
        assert os.readlink(dest / name) == to
        assert f"kept your {name} (a link to {to}, not followed" in out, out
    assert not Path("/mnt/not-mounted-now").exists()
    assert mine.read_bytes() == b'{"cells": []}'
    assert same_as_course.read_bytes() == (LABS / NAMES[2]).read_bytes()
    assert f"{len(NAMES) - 3} notebook(s) copied" in out


def test_what_appears_at_a_name_while_copying_is_kept(tmp_path, monkeypatch):
    dest = tmp_path / "course"
    dest.mkdir()
    real = ppolab.labs_copy._temporary

    def racing(target):  # the learner's link lands between the look and the publish
        made = real(target)
        if target.name == NAMES[3]:
            os.symlink("/mnt/elsewhere.ipynb", target)
        return made

    monkeypatch.setattr(ppolab.labs_copy, "_temporary", racing)
    copied, same, kept = copy_labs(dest)
    assert kept == [NAMES[3]] and len(copied) == len(NAMES) - 1
    assert os.readlink(dest / NAMES[3]) == "/mnt/elsewhere.ipynb"
    assert not [p for p in dest.iterdir() if p.name.endswith(".tmp")]


def test_a_link_to_a_folder_of_the_learners_is_their_folder(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "course")
    assert main(["labs", str(tmp_path / "course"), "--no-start"]) == 0
    assert sorted(p.name for p in (tmp_path / "real").glob("*.ipynb")) == NAMES


def test_a_dir_that_is_a_file_or_under_a_file_is_one_line(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert main(["labs", str(notes), "--no-start"]) == 1
    assert _error_line(capsys) == (f"error: {notes} is a file, not a folder: give `ppolab labs` a folder, or a new "
                                   "name (it makes the folder)")
    assert main(["labs", str(notes / "course"), "--no-start"]) == 1
    line = _error_line(capsys)
    assert line.startswith(f"error: {notes / 'course'}: a part of this path is a file") and f"({notes} is" in line
    os.symlink("/mnt/not-mounted-now", tmp_path / "gone")
    assert main(["labs", str(tmp_path / "gone"), "--no-start"]) == 1
    assert f"{tmp_path / 'gone'} is a link to /mnt/not-mounted-now" in _error_line(capsys)
    assert notes.read_text() == "mine"


def test_an_empty_dir_or_the_courses_own_labs_folder_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["labs", "", "--no-start"]) == 1  # `ppolab labs "$COURSE"` with $COURSE unset
    assert _error_line(capsys).startswith("error: DIR is empty (an unset variable?): give `ppolab labs` a folder")
    assert list(tmp_path.iterdir()) == []
    before = sorted(LABS.rglob("*"))
    for dest in (LABS, LABS / "zh", LABS / "mine"):  # JupyterLab would autosave into the course's own notebooks
        assert main(["labs", str(dest), "--no-start"]) == 1
        line = _error_line(capsys)
        assert line.startswith(f"error: {dest} is") and f"ppolab's own labs folder {LABS.resolve()}" in line, line
    assert sorted(LABS.rglob("*")) == before


@pytest.mark.parametrize("where", ["name", "path"])
def test_an_over_long_dir_is_one_line(tmp_path, capsys, where):
    dest = tmp_path / ("n" * 300) if where == "name" else tmp_path.joinpath(*["p" * 250] * 20)
    assert main(["labs", str(dest), "--no-start"]) == 1
    line = _error_line(capsys)
    assert "too long for the file system" in line and str(tmp_path) in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into a 0o555 folder")
def test_a_read_only_dir_is_one_line(tmp_path, capsys):
    dest = tmp_path / "course"
    dest.mkdir()
    dest.chmod(0o555)
    try:
        assert main(["labs", str(dest), "--no-start"]) == 1
    finally:
        dest.chmod(0o755)
    assert _error_line(capsys) == (f"error: {dest} is not writable by you: give `ppolab labs` a folder of yours, or "
                                   "make it writable (chmod u+w)")


@pytest.mark.parametrize("code, says", [(errno.EACCES, "is not writable by you"),
                                        (errno.EROFS, "is on a read-only file system"),
                                        (errno.ENOSPC, "no space left on its drive")])
def test_a_folder_that_refuses_files_is_one_line(tmp_path, capsys, monkeypatch, code, says):
    """What a read-only DIR (as a user), a read-only drive (as root too) or a full one does to the temporary."""
    def refuse(target):
        raise OSError(code, os.strerror(code), str(target))

    monkeypatch.setattr(ppolab.labs_copy, "_temporary", refuse)
    dest = tmp_path / "course"
    assert main(["labs", str(dest), "--no-start"]) == 1
    assert _error_line(capsys).startswith(f"error: {dest}{':' if code == errno.ENOSPC else ''} {says}")
    assert list(dest.iterdir()) == []


class FakeLab:
    started: list[list[str]] = []

    def __init__(self, argv):
        FakeLab.started.append(argv)

    def wait(self):
        return 0

    def terminate(self):
        pass


@pytest.mark.parametrize("given", [[], ["--allow-root"]])
def test_as_root_jupyterlab_gets_allow_root_and_the_user_is_told(tmp_path, capsys, monkeypatch, given):
    pytest.importorskip("jupyterlab")
    FakeLab.started = []
    monkeypatch.setattr(ppolab.cli.subprocess, "Popen", FakeLab)
    monkeypatch.setattr(ppolab.cli.os, "geteuid", lambda: 0)
    dest = tmp_path / "course"
    assert main(["labs", str(dest), "--", "--no-browser", *given]) == 0
    assert FakeLab.started == [[sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", str(dest)]]
    said = "running as root: JupyterLab refuses to start as root without --allow-root, so ppolab passes it"
    assert (said in capsys.readouterr().out) == (not given)
    monkeypatch.setattr(ppolab.cli.os, "geteuid", lambda: 1000)
    assert main(["labs", str(dest)]) == 0
    assert FakeLab.started[-1] == [sys.executable, "-m", "jupyterlab", str(dest)]
    assert "running as root" not in capsys.readouterr().out


def test_the_editable_install_is_a_static_path_entry():
    """Why a script beside the clone imported the clone's folder: setuptools' editable finder (for a flat layout) is
    a meta-path finder after PathFinder, which takes the clone's folder in the script's directory for a namespace
    package first. With ``package-dir = {"" = "."}`` setuptools writes a plain path entry instead, and a regular
    package anywhere on sys.path wins over a namespace portion. This is setuptools' own condition for that."""
    tomllib = pytest.importorskip("tomllib")
    from setuptools import find_packages
    from setuptools.command.editable_wheel import _simple_layout

    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert package_dir == {"": "."}
    assert _simple_layout(find_packages(str(ROOT), include=["ppolab*"]), package_dir, str(ROOT))


def _beside_the_clone(home: Path, python: str, **env) -> str:
    out = subprocess.run([python, "-c", "import ppolab; print(ppolab.__file__, ppolab.__version__)"], cwd=home,
                         capture_output=True, text=True, timeout=120,
                         env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_a_path_entry_wins_over_the_clones_folder_beside_the_script(tmp_path):
    home = tmp_path / "home"
    (home / "ppolab").mkdir(parents=True)  # the clone, as the script's folder sees it: no __init__.py
    out = _beside_the_clone(home, sys.executable, PYTHONPATH=str(ROOT))  # a path entry after '', like a .pth's
    assert out == f"{ROOT / 'ppolab' / '__init__.py'} {ppolab.__version__}"


@pytest.mark.slow
def test_a_script_beside_a_fresh_editable_clone_imports_ppolab(tmp_path):
    """The README's ``pip install -e .`` of a clone at ~/ppolab, then ``cd ~ && python -c 'import ppolab'``."""
    import shutil
    import venv

    home = tmp_path / "home"
    clone = home / "ppolab"
    clone.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in"):
        shutil.copy(ROOT / name, clone / name)
    shutil.copytree(ROOT / "ppolab", clone / "ppolab", ignore=shutil.ignore_patterns("__pycache__"))
    # what pip -e runs (PEP 660's build_editable), with this environment's setuptools: no index needed
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-c", "import sys, setuptools.build_meta as b; b.build_editable(sys.argv[1])",
                    str(wheels)], cwd=clone, check=True, capture_output=True, timeout=300)
    venv.create(tmp_path / "venv", with_pip=True)
    py = str(tmp_path / "venv" / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *map(str, wheels.glob("*.whl"))],
                   check=True, capture_output=True, timeout=300)
    assert _beside_the_clone(home, py) == f"{clone / 'ppolab' / '__init__.py'} {ppolab.__version__}"
