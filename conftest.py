"""Repository-wide pytest setup.

pyproject's addopts pass ``--nbval-sanitize-with=tests/nbval_sanitize.cfg``; nbval opens that
path relative to the working directory, so resolve it against the repository root to let
pytest run from anywhere (``cd labs && python -m pytest 04_clipped_objective.ipynb``).
"""

from __future__ import annotations

from pathlib import Path


def pytest_configure(config):
    opt = getattr(config.option, "nbval_sanitize_with", None)
    if opt and not Path(opt).is_absolute() and not Path(opt).exists():
        candidate = Path(config.rootpath) / opt
        if candidate.exists():
            config.option.nbval_sanitize_with = str(candidate)
