"""A run's recorded steps as tensors: which step, which optimizer step's rows, the run's actor config."""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch

from ppolab.config.actor import ActorConfig
from ppolab.errors import whole_argument
from ppolab.i18n import tr
from ppolab.record import Run, StepRecord, resolve_run


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
    """Boolean (N,) of the real trajectories (synthetic padding samples excluded)."""
    t = record.tensors
    return ~t["is_pad"].bool() if "is_pad" in t else torch.ones(t["responses"].shape[0], dtype=torch.bool)


def loss_mask_of_real_rows(record: StepRecord) -> torch.Tensor:
    """(N, R) float: the recorded ``loss_mask`` (the mask as generated, which the engine counts for
    ``batch_num_tokens``; rejection sampling rewrites only ``response_mask``, verl V1) of the real rows, 0 on synthetic
    padding rows; ``response_mask`` of the real rows for a recording without a loss_mask."""
    t = record.tensors
    return t.get("loss_mask", t["response_mask"]).float() * real_rows(record).float().unsqueeze(-1)


def global_batch_info(run: Run, record: StepRecord, opt_step: int) -> Any:
    """The :class:`~ppolab.algos.GlobalBatchInfo` the worker divided every micro-batch loss of optimizer step
    ``opt_step`` by — read from the step's update plan (:func:`ppolab.update_plan.recorded_plan`): Σ loss_mask of its
    rows on all ranks (``batch_num_tokens``), ppo_mini_batch_size × rollout.n rows (``global_batch_size``, padding
    rows counted), the run's ``loss_scale_factor`` — with ``dp_size`` 1, for a loss over every rank's rows at once
    (a recording merges the ranks; on one rank each share is × dp_size and the gradients are averaged)."""
    from ppolab.update_plan import recorded_plan

    plan = recorded_plan(record, run.ppo_config(), "actor")
    _check_index("opt_step", opt_step, len(plan.steps))
    return replace(plan.steps[opt_step].info(), dp_size=1)


def token_labels(record: StepRecord, tokenizer: Any, row: int) -> list[str]:
    """The decoded response tokens of one row (one string per position, padding included)."""
    return [tokenizer.decode([int(t)]) for t in record.tensors["responses"][row]]


def actor_config(run: Run, **overrides: Any) -> ActorConfig:
    """The run's ``actor_rollout_ref.actor`` (from ``run.ppo_config()``) as a fresh :class:`ActorConfig` with
    ``overrides`` applied (``loss_mode`` goes to ``policy_loss.loss_mode``)."""
    cfg = run.ppo_config().actor_rollout_ref.actor
    if "loss_mode" in overrides:
        overrides["policy_loss"] = replace(cfg.policy_loss, loss_mode=overrides.pop("loss_mode"))
    return replace(cfg, **overrides)


def _n_opt_steps(rec: StepRecord) -> int:
    return int(rec.tensors["actor_log_probs"].shape[0])


def _check_index(name: str, value: int | None, n: int) -> int | None:
    # the one index check of the readers (ppolab.errors.whole_argument): a bool, float or string is named, not used
    return None if value is None else whole_argument(name, value, range(n), "an index")


def _opt_step_label(rec: StepRecord, k: int) -> str:
    per_epoch = int(rec.info.get("batch_plan", {}).get("optimizer_steps_per_epoch", 0) or 0)
    if per_epoch > 0:
        return tr("opt step {k} (epoch {e}, mini-batch {m})").format(k=k, e=k // per_epoch, m=k % per_epoch)
    return tr("opt step {k}").format(k=k)


def optimizer_step_batch(rec: StepRecord, k: int) -> dict[str, torch.Tensor]:
    """The rows optimizer step ``k`` trained on: ``rows`` (indices), and for those rows ``old_log_probs``,
    ``log_prob`` (= actor_log_probs[k]), ``advantages``, ``response_mask`` (real rows only), ``entropy``,
    ``ref_log_prob`` — every tensor (n_rows, R), ready for the ``ppolab.algos`` losses."""
    t = rec.tensors
    _check_index("opt_step", k, _n_opt_steps(rec))
    lp = t["actor_log_probs"][k]
    rows = torch.nonzero(~torch.isnan(lp).all(dim=-1)).flatten()
    mask = t["response_mask"].float() * real_rows(rec).float().unsqueeze(-1)
    out = {"rows": rows, "log_prob": torch.nan_to_num(lp[rows], nan=0.0)}
    for key in ("old_log_probs", "advantages", "entropy", "ref_log_prob"):
        if key in t:
            out[key] = t[key][rows].float()
    out["response_mask"] = mask[rows]
    # a NaN at a masked position would leak through the seq-mean modes; pad positions carry 0 instead
    out["log_prob"] = torch.where(out["response_mask"] > 0, out["log_prob"], out["old_log_probs"])
    return out
