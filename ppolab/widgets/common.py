"""Shared plumbing of the explorers: which run, which step, and the masked tensors of that step."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ppolab.record import Run, StepRecord

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The demo runs shipped in ``data/runs`` (``python -m ppolab.train ... trainer.run_dir=data/runs/<name>``).
SHIPPED_RUNS = {"grpo_tiny": REPO_ROOT / "data" / "runs" / "grpo_tiny",
                "ppo_gae_tiny": REPO_ROOT / "data" / "runs" / "ppo_gae_tiny"}


def resolve_run(run: Run | str | os.PathLike | None = None, default: str = "grpo_tiny") -> Run:
    """A :class:`Run` from a Run, a shipped run's name (``"grpo_tiny"``, ``"ppo_gae_tiny"``), a path, or None
    (the shipped ``default``)."""
    if isinstance(run, Run):
        return run
    if run is None:
        run = default
    if isinstance(run, str) and run in SHIPPED_RUNS:
        return Run(SHIPPED_RUNS[run])
    return Run(run)


def step_tensors(run: Run | str | os.PathLike | None = None, step: int | None = None,
                 default: str = "grpo_tiny") -> StepRecord:
    """The recorded step ``step`` (default: the first recorded one, where the ratio story starts) of ``run``;
    a step that was not recorded raises ``KeyError`` naming the recorded steps."""
    r = resolve_run(run, default)
    steps = r.steps
    if not steps:
        raise FileNotFoundError(f"{r.path} has no recorded steps; train with trainer.record_freq > 0")
    return r.step(steps[0] if step is None else step)


def real_rows(record: StepRecord) -> torch.Tensor:
    """Boolean (N,) of the real trajectories (synthetic padding samples excluded)."""
    t = record.tensors
    return ~t["is_pad"].bool() if "is_pad" in t else torch.ones(t["responses"].shape[0], dtype=torch.bool)


def token_labels(record: StepRecord, tokenizer: Any, row: int) -> list[str]:
    """The decoded response tokens of one row (one string per position, padding included)."""
    return [tokenizer.decode([int(t)]) for t in record.tensors["responses"][row]]
