"""The numbers layer: every number an explorer shows and every exercise's truth, read from a run with torch only.

Run → numbers → widgets (views) and exercises (checks). Nothing here imports ipywidgets or plotly, so the checks
run anywhere a run can be read. Modules, one concept each:

* :mod:`~ppolab.numbers.steps` — recorded steps, an optimizer step's rows, the run's actor config;
* :mod:`~ppolab.numbers.needs` — what a run has (:data:`NEEDS`, :func:`require`) and :class:`RunLacks`; for a lab's
  sections :func:`has` and :func:`find`, which print the one lacks line (:func:`lacks_line`) instead of raising;
* :mod:`~ppolab.numbers.cases` — where in a run a mechanism shows (the step and optimizer step an exercise names);
* :mod:`~ppolab.numbers.kl`, ``masks``, ``aggregation``, ``gradients``, ``invariance``, ``metrics``, ``mistakes`` —
  the chapter's numbers by topic.
"""
from __future__ import annotations

import os

from ppolab.numbers.needs import NEEDS, RunLacks, find, has, lacks_line, require, run_label
from ppolab.numbers.steps import actor_config, optimizer_step_batch, real_rows, step_tensors
from ppolab.run.reader import SHIPPED_RUNS, Run, resolve_run

__all__ = ["NEEDS", "SHIPPED_RUNS", "Run", "RunLacks", "actor_config", "find", "has", "lab_pair", "lab_run",
           "lacks_line", "optimizer_step_batch", "real_rows", "require", "resolve_run", "run_label", "step_tensors"]

#: The environment variable a lab's RUN cell reads: a shipped run's name or the path of a run directory.
RUN_ENV = "PPOLAB_RUN"


def lab_run(default: str) -> str:
    """The run a lab binds to: ``$PPOLAB_RUN`` when set (a shipped run's name or a path), else ``default``. A
    ``$PPOLAB_RUN`` that opens no run stops here, in one line naming the variable as the cause."""
    own = os.environ.get(RUN_ENV)
    if not own:
        return default
    try:
        resolve_run(own)
    except Exception as e:  # noqa: BLE001 — whatever the reader says, the variable is where it came from
        from ppolab.errors import RunDirError

        raise RunDirError(f"{RUN_ENV}={own!r} (set in the environment) opens no run: {e} — fix or unset "
                          f"{RUN_ENV}") from None
    return own


def lab_pair(default: tuple[str, str]) -> tuple[str, str]:
    """The (GRPO, PPO + GAE) pair lab 14 compares: ``default``, or with ``$PPOLAB_RUN`` set that run in the place of
    its configuration (a GAE run: PPO + GAE's, any other: GRPO's) beside the shipped run of the other."""
    own = os.environ.get(RUN_ENV)
    if not own:
        return default
    lab_run(default[0])  # a $PPOLAB_RUN that opens no run: one line naming the variable
    gae = resolve_run(own).ppo_config().algorithm.adv_estimator == "gae"
    return (default[0], own) if gae else (own, default[1])

# chapter §3's clamp on a run's own tensors, and §3/§5's rollout IS weights in the loss (labs 02, 03)
from ppolab.numbers.clamp import clamp_gradient, large_step_replay, largest_log_ratio  # noqa: E402
from ppolab.numbers.rollout_is import is_weighted_step, pg_loss_with_and_without_is  # noqa: E402

__all__ += ["clamp_gradient", "is_weighted_step", "large_step_replay", "largest_log_ratio",
            "pg_loss_with_and_without_is"]
