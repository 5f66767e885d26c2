"""Build step of the wheel: the course's files travel inside the package.

``pyproject.toml`` holds the project's metadata; this file adds one thing to setuptools' ``build_py``: copying the
repository's ``data/`` (the tiny models, the datasets, the shipped runs, the ablations, an example verl log) and
``labs/`` (both editions, the solutions) into ``ppolab/_course/`` of the wheel, where ``ppolab/course.py`` finds them
with ``importlib.resources``. An editable install (``pip install -e .``) skips the copy: it reads them in place.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
COURSE = ("data", "labs")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", ".*.tmp")


class build_py_with_course(build_py):  # noqa: N801 — setuptools' command naming
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "ppolab" / "_course"
        for name in COURSE:
            if (ROOT / name).is_dir():  # an sdist unpacked elsewhere carries them too (MANIFEST.in)
                shutil.rmtree(target / name, ignore_errors=True)
                shutil.copytree(ROOT / name, target / name, ignore=SKIP)


setup(cmdclass={"build_py": build_py_with_course})
