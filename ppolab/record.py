"""Run directories: the :class:`Recorder` (the only writer) and :class:`Run` / :func:`load_run` (readers).

Layout of a run dir::

    config.json                 resolved config, batch plan, library versions
    metrics.jsonl               one JSON object per training step (verl metric names)
    steps/step_000005.safetensors + .json    the real tensors of a recorded step + decoded texts
    checkpoints/step_000020/    adapters, value head, optimizer and RNG state (safetensors + JSON)
    summary.json                before/after validation accuracy, written at the end

Every file is written to a temporary name in the same folder and renamed into place, so a run stopped
at any moment (a learner interrupting a cell) stays loadable. Only JSON and safetensors — never pickle.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

STEP_FILE = "step_{:06d}"


def _atomic(path: Path, write) -> None:
    """Write through ``write(tmp_path)`` then ``os.replace`` onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return _json_safe(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON (non-finite floats become null)."""

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(_json_safe(obj), f, indent=1)

    _atomic(Path(path), write)


def write_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor],
                  metadata: dict[str, str] | None = None) -> None:
    """Atomically write tensors as safetensors (detached, contiguous, on the CPU).

    Each tensor is cloned: a batch often holds the same storage under two names (GRPO's returns are
    its advantages, rewards are scores without reward-side KL) and safetensors refuses shared memory.
    """
    clean = {k: v.detach().to("cpu").clone().contiguous() for k, v in tensors.items()}
    _atomic(Path(path), lambda tmp: save_file(clean, tmp, metadata=metadata))


class Recorder:
    """Writes one run directory. The trainer hands it plain dicts and tensors; it decides the layout."""

    def __init__(self, run_dir: str | os.PathLike, config: dict[str, Any], info: dict[str, Any], write: bool = True):
        """``write=False`` (data-parallel ranks other than 0): keep metrics in memory, write nothing."""
        self.run_dir = Path(run_dir)
        self.write = write
        self.metrics: list[dict[str, Any]] = []
        if not write:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        existing = self.run_dir / "metrics.jsonl"
        if existing.exists():  # resuming: keep what was logged
            self.metrics = _read_jsonl(existing)
        write_json(self.run_dir / "config.json", {"config": config, **info})

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        """Add (or replace, when resuming) the metrics of ``step`` and rewrite metrics.jsonl atomically."""
        self.metrics = [m for m in self.metrics if m.get("step") != step] + [{"step": step, **metrics}]
        if not self.write:
            return
        lines = "".join(json.dumps(_json_safe(m)) + "\n" for m in self.metrics)
        _atomic(self.run_dir / "metrics.jsonl", lambda tmp: Path(tmp).write_text(lines))

    def truncate_metrics(self, last_step: int) -> None:
        """Forget metrics after ``last_step`` (a resumed run re-logs them)."""
        self.metrics = [m for m in self.metrics if m.get("step", 0) <= last_step]

    def record_step(self, step: int, tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> Path:
        """Write ``steps/step_<k>.safetensors`` (tensors) and ``.json`` (texts, plan, metadata)."""
        base = self.run_dir / "steps" / STEP_FILE.format(step)
        if not self.write:
            return base
        write_tensors(base.with_suffix(".safetensors"), tensors)
        write_json(base.with_suffix(".json"), {"step": step, **info})
        return base

    def write_json(self, name: str, obj: Any) -> None:
        if self.write:
            write_json(self.run_dir / name, obj)

    def checkpoint_dir(self, step: int) -> Path:
        return self.run_dir / "checkpoints" / STEP_FILE.format(step)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line cannot happen with atomic writes, but be lenient
            continue
    return rows


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder (one whose ``state.json`` exists), or None."""
    root = Path(run_dir) / "checkpoints"
    done = sorted(p for p in root.glob("step_*") if (p / "state.json").exists()) if root.exists() else []
    return done[-1] if done else None


@dataclass
class StepRecord:
    """One recorded training step: ``tensors`` (name → tensor) and ``info`` (texts, batch plan, …)."""

    step: int
    tensors: dict[str, torch.Tensor]
    info: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    @property
    def texts(self) -> dict[str, list[str]]:
        """Decoded ``prompts`` and ``responses`` of every row."""
        return self.info.get("texts", {})


class Run:
    """A run directory opened for reading: config, metrics, recorded steps."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        config_file = self.path / "config.json"
        if not config_file.exists():
            raise FileNotFoundError(
                f"{self.path} is not a ppolab run directory (no config.json). Shipped runs live in data/runs/; "
                "make one with python -m ppolab.train trainer.run_dir=<dir>"
            )
        meta = json.loads(config_file.read_text())
        self.config: dict[str, Any] = meta.pop("config")
        self.info: dict[str, Any] = meta
        self._cache: dict[int, StepRecord] = {}

    @property
    def metrics(self):
        """A pandas DataFrame, one row per training step, indexed by ``step``."""
        import pandas as pd

        path = self.path / "metrics.jsonl"
        rows = _read_jsonl(path) if path.exists() else []
        frame = pd.DataFrame(rows)
        return frame.set_index("step").sort_index() if "step" in frame else frame

    @property
    def steps(self) -> list[int]:
        """Training steps with recorded tensors (both files present)."""
        folder = self.path / "steps"
        if not folder.exists():
            return []
        return sorted(int(p.stem.split("_")[1]) for p in folder.glob("step_*.safetensors")
                      if p.with_suffix(".json").exists())

    def step(self, k: int | None = None) -> StepRecord:
        """The recorded step ``k`` (default: the last one)."""
        steps = self.steps
        if not steps:
            raise FileNotFoundError(f"{self.path} has no recorded steps (trainer.record_freq)")
        k = steps[-1] if k is None else k
        if k not in steps:
            raise KeyError(f"step {k} was not recorded in {self.path}; recorded steps: {steps}")
        if k not in self._cache:
            base = self.path / "steps" / STEP_FILE.format(k)
            self._cache[k] = StepRecord(k, load_file(str(base.with_suffix(".safetensors"))),
                                        json.loads(base.with_suffix(".json").read_text()))
        return self._cache[k]

    @property
    def summary(self) -> dict[str, Any]:
        path = self.path / "summary.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def ppo_config(self):
        """The run's config as a :class:`ppolab.config.PPOConfig` (to re-run or compare)."""
        from ppolab.config import from_dict

        return from_dict(self.config)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, steps recorded: {self.steps})"


def load_run(path: str | os.PathLike) -> Run:
    """Open a run directory written by :class:`Recorder`."""
    return Run(path)
