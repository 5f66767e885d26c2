"""The code base stays clean under the project's own ruff rules (pyproject.toml: [tool.ruff.lint])."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    ruff = Path(sys.executable).with_name("ruff")  # the environment's own ruff, not whatever is on PATH
    ruff = str(ruff) if ruff.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the dev extra)")
    out = subprocess.run([ruff, "check", "ppolab", "tests", "tools", "bench", "labs"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_learner_facing_text_cites_the_chapter_or_verl_never_our_notes():
    # "facts §N" points into the developers' notes, which learners do not have: cite the chapter's § or verl's
    # file and function instead.
    hits = [f"{p.relative_to(ROOT)}:{i}" for pattern in ("ppolab/**/*.py", "labs/**/*.ipynb", "labs/**/*.py",
                                                         "labs/**/*.md", "README.md", "docs/*.md")
            for p in ROOT.glob(pattern)
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "facts §" in line
            or "facts sheet" in line]
    assert not hits, hits
