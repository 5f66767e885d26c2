"""Where the course's files are: the shipped model, the datasets, the recorded runs and the labs (both editions).

A checkout (``pip install -e .``) reads them where they live, in the repository's ``data/`` and ``labs/``; a wheel
(``pip install ppolab`` or ``pip install .``) carries the same two folders inside the package, as
``ppolab/_course/data`` and ``ppolab/_course/labs`` (setup.py's build step copies them there), found through
``importlib.resources``. Every reader of a shipped file starts from :data:`COURSE_ROOT`, so both installs behave the
same from any working directory.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def _course_root() -> Path:
    """The checkout's root when its ``data/runs`` sits next to the package, else the wheel's ``ppolab/_course``."""
    if (_CHECKOUT / "data" / "runs").is_dir() and (_CHECKOUT / "pyproject.toml").is_file():
        return _CHECKOUT
    return Path(str(resources.files("ppolab") / "_course"))


#: The folder holding ``data/`` (models, datasets, runs, ablations, an example verl log) and ``labs/``.
COURSE_ROOT = _course_root()
DATA = COURSE_ROOT / "data"
LABS = COURSE_ROOT / "labs"
