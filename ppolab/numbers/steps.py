"""A run's recorded steps as tensors: which step, which optimizer step's rows, the run's actor config."""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch

from ppolab.config.actor import ActorConfig
from ppolab.errors import whole_argument
from ppolab.run.reader import Run, resolve_run
from ppolab.run.step import StepRecord, real_rows_of


def step_tensors(run: Run | str | os.PathLike | None = None, step: int | None = None,
                 default: str = "grpo_tiny") -> StepRecord:
    """The recorded step ``step`` (default: the first recorded one, where the ratio story starts) of ``run``;
    a step that was not recorded raises ``KeyError`` naming the recorded steps."""
    r = resolve_run(run, default)
    steps = r.steps
    if not steps:
        raise FileNotFoundError(r.no_steps())
    return r.step(steps[0] if step is None else step)


def real_rows(record: StepRecord) -> torch.Tensor:
    """Boolean (N,) of the real trajectories (synthetic padding samples excluded): ``ppolab.run.step.real_rows_of``."""
    return real_rows_of(record.tensors)


def loss_mask_of_real_rows(record: StepRecord) -> torch.Tensor:
    """(N, R) float: the recorded ``loss_mask`` (the mask as generated, which the engine counts for
    ``batch_num_tokens``; rejection sampling rewrites only ``response_mask``, verl V1) of the real rows, 0 on synthetic
    padding rows; ``response_mask`` of the real rows for a recording without a loss_mask."""
    t = record.tensors
    return t.get("loss_mask", t["response_mask"]).float() * real_rows(record).float().unsqueeze(-1)


def global_batch_info(run: Run, record: StepRecord, opt_step: int) -> Any:
    """The :class:`~ppolab.algos.GlobalBatchInfo` the worker divided every micro-batch loss of optimizer step
    ``opt_step`` by — read from the step's update plan (:meth:`StepRecord.opt_step`): Σ loss_mask of its rows on all
    ranks (``batch_num_tokens``), ppo_mini_batch_size × rollout.n rows (``global_batch_size``, padding rows
    counted), the run's ``loss_scale_factor`` — with ``dp_size`` 1, for a loss over every rank's rows at once (a
    recording merges the ranks; on one rank each share is × dp_size and the gradients are averaged)."""
    return replace(record.opt_step(opt_step).step.info(), dp_size=1)


def actor_config(run: Run, **overrides: Any) -> ActorConfig:
    """The run's ``actor_rollout_ref.actor`` (from ``run.ppo_config()``) as a fresh :class:`ActorConfig` with
    ``overrides`` applied (``loss_mode`` goes to ``policy_loss.loss_mode``)."""
    cfg = run.ppo_config().actor_rollout_ref.actor
    if "loss_mode" in overrides:
        overrides["policy_loss"] = replace(cfg.policy_loss, loss_mode=overrides.pop("loss_mode"))
    return replace(cfg, **overrides)


def n_opt_steps(rec: StepRecord) -> int:
    """The actor's optimizer steps at ``rec`` (its update plan)."""
    return len(rec.plan("actor").steps)


def check_index(name: str, value: int | None, n: int) -> int | None:
    # the one index check of the readers (ppolab.errors.whole_argument): a bool, float or string is named, not used
    return None if value is None else whole_argument(name, value, range(n), "an index")


def opt_step_label(rec: StepRecord, k: int) -> str:
    """"opt step k (epoch e, mini-batch m)" of the actor's update at ``rec``."""
    return rec.opt_step(k).label


def optimizer_step_batch(rec: StepRecord, k: int) -> dict[str, torch.Tensor]:
    """The rows optimizer step ``k`` of the actor trained on, and their tensors (:meth:`StepRecord.opt_step` →
    ``batch()``): ``rows`` (indices), and for those rows ``old_log_probs``, ``log_prob`` (= actor_log_probs[k]),
    ``advantages``, ``response_mask`` (real rows only), ``entropy``, ``ref_log_prob`` — every tensor (n_rows, R),
    ready for the ``ppolab.algos`` losses."""
    check_index("opt_step", k, n_opt_steps(rec))
    return rec.opt_step(k).batch()
