"""Small helpers shared by test modules (tests/ is on sys.path under pytest)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def logged(run) -> list[dict]:
    """metrics.jsonl of a run (a Run or its directory) as written: no NaN filling of a DataFrame."""
    path = Path(getattr(run, "path", run)) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def stable(metrics: dict) -> dict:
    """Metrics that must repeat exactly: everything but wall-clock timings and throughput."""
    return {k: v for k, v in metrics.items() if not k.startswith(("timing_s/", "perf/time", "perf/throughput"))}


def sweep_values(ctl, n: int = 5) -> list:
    """What a sweep sets a control to: every option of a choice; both states of a checkbox; for a slider its min,
    max and ``n`` values in between (a FloatLogSlider's min/max are exponents), cast to the slider's type."""
    if hasattr(ctl, "options"):
        return list(ctl.options)
    if not hasattr(ctl, "min"):
        return [not ctl.value, ctl.value]
    values = [ctl.min, ctl.max, *np.linspace(ctl.min, ctl.max, n)]
    if hasattr(ctl, "base"):
        values = [ctl.base**v for v in values]
    return [type(ctl.value)(v) for v in values]


def sweep_all(w, n: int = 5, skip=()) -> None:
    """Move every control of explorer ``w`` (its ``.controls``) through :func:`sweep_values`, then back to where
    it started; each move redraws the figures, so a control that breaks them raises here."""
    for name, ctl in w.controls.items():
        if name in skip or not hasattr(ctl, "value"):
            continue
        start = ctl.value
        for v in sweep_values(ctl, n):
            ctl.value = (v,) if isinstance(start, tuple) else v  # a SelectMultiple takes tuples
        ctl.value = start


# 2 prompts × 2 answers: the smallest run that still has groups, an optimizer step and validation.
TINY = [
    "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.ppo_epochs=1",
    "data.val_max_samples=4", "trainer.record_freq=1",
]
NO_VAL = ["trainer.test_freq=-1", "trainer.val_before_train=false"]
#: A fresh run at a preset's own shape (several optimizer steps, groups, a critic for PPO): 3 steps, every one
#: recorded. The any-run lab matrix and the exercise matrix read the same runs (``trained_run`` trains each once).
FRESH = ["trainer.total_training_steps=3", "trainer.record_freq=1", "data.val_max_samples=16"]


def tree_hash(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path → sha256): equal before and after means nothing changed."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def no_model(tmp_path) -> str:
    """An override whose model does not exist: a check that passes this point ran before any model loads."""
    return f"actor_rollout_ref.model.path={tmp_path / 'no-model'}"


def write_parquet(path: Path, rows: list[dict]) -> Path:
    """A verl-format parquet of ``rows`` (``ppolab.data.make_row``), with the schema of a well-formed row."""
    from ppolab.data import make_row

    schema = pa.Table.from_pylist([make_row("What is 1+1?", 2, "train", 0)]).schema
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path
