"""The numbers layer: every number an explorer shows and every exercise's truth, read from a run with torch only.

Run → numbers → widgets (views) and exercises (checks). Nothing here imports ipywidgets or plotly, so the checks
run anywhere a run can be read. Modules, one concept each:

* :mod:`~ppolab.numbers.steps` — recorded steps, an optimizer step's rows, the run's actor config;
* :mod:`~ppolab.numbers.needs` — what a run has (:data:`NEEDS`, :func:`require`) and :class:`RunLacks`;
* :mod:`~ppolab.numbers.cases` — where in a run a mechanism shows (the step and optimizer step an exercise names);
* :mod:`~ppolab.numbers.kl`, ``masks``, ``aggregation``, ``gradients``, ``invariance``, ``metrics``, ``mistakes`` —
  the chapter's numbers by topic.
"""
from __future__ import annotations

import os

from ppolab.numbers.needs import NEEDS, RunLacks, require, run_label
from ppolab.numbers.steps import actor_config, optimizer_step_batch, real_rows, step_tensors
from ppolab.record import SHIPPED_RUNS, Run, resolve_run

__all__ = ["NEEDS", "SHIPPED_RUNS", "Run", "RunLacks", "actor_config", "lab_run", "optimizer_step_batch",
           "real_rows", "require", "resolve_run", "run_label", "step_tensors"]

#: The environment variable a lab's RUN cell reads: a shipped run's name or the path of a run directory.
RUN_ENV = "PPOLAB_RUN"


def lab_run(default: str) -> str:
    """The run a lab binds to: ``$PPOLAB_RUN`` when set (a shipped run's name or a path), else ``default``."""
    return os.environ.get(RUN_ENV) or default
