"""The :class:`Recorder`: the one writer of a run dir (what the trainer hands it, it lays out and writes).

The commit rule — what a reader sees of a run that is being trained: the recorder writes a recorded step in a fixed
order — ``step_<k>.safetensors``, then ``step_<k>.json``, then step k's row of ``metrics.jsonl`` (the whole file
rewritten and renamed into place) — and a step is part of the run from that last rename on
(:mod:`ppolab.run.reader`). A resumed run rewrites ``metrics.jsonl`` without the steps after its checkpoint before
it records any of them again. A directory that already holds a run is never written into again except to resume
it (:func:`ppolab.run.checkpoints.resume_checkpoint`).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ppolab.run.checkpoints import optimizer_tensors
from ppolab.run.claim import refuse_existing_run
from ppolab.run.files import (STEP_FILE, TOKENIZER_DIR, atomic_write, disk_full, full_disk_error, honour_umask,
                              json_safe, read_json, remove_leftovers, write_json, write_tensors)
from ppolab.run.identity import fingerprints, flatten, folder_fingerprint
from ppolab.run.metrics_log import read_metrics

class Recorder:
    """Writes one run directory. The trainer hands it plain dicts and tensors; it decides the layout."""

    def __init__(self, run_dir: str | os.PathLike, config: dict[str, Any], info: dict[str, Any], write: bool = True,
                 resume: dict[str, Any] | None = None):
        """``write=False`` (data-parallel ranks other than 0): keep metrics in memory, write nothing.
        ``resume=None`` refuses a directory that already holds a run (:func:`refuse_existing_run`); a resume passes
        ``{"at_step": k, "changed": {key: [old, new]}}`` (:func:`ppolab.run.identity.check_resume`): the logged metrics
        are kept (the trainer truncates them to the checkpoint's step) and the resume is appended to
        ``config.json``'s ``resumes``, so the run dir says which settings produced which steps. Create the
        recorder of a resumed run only after its checkpoint loaded: this writes ``config.json``."""
        self.run_dir = Path(run_dir)
        self.write = write
        self.metrics: list[dict[str, Any]] = []
        if not write:
            return
        existing = self.run_dir / "metrics.jsonl"
        resumes: list[dict[str, Any]] = []
        if resume is None:
            refuse_existing_run(self.run_dir)
        else:
            remove_leftovers(self.run_dir)
            if existing.exists():  # resuming: keep what was logged
                self.metrics = read_metrics(existing)
            recorded = read_json(self.run_dir / "config.json")
            resumes = [*recorded.get("resumes", []), {**resume, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}]
            if recorded.get("world_size", info.get("world_size")) != info.get("world_size"):
                resumes[-1]["world_size"] = [recorded.get("world_size"), info.get("world_size")]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        prints = fingerprints(flatten(config))
        if resume is not None and (recorded.get("fingerprints") or {}).get(TOKENIZER_DIR):  # the run keeps its
            prints[TOKENIZER_DIR] = recorded["fingerprints"][TOKENIZER_DIR]  # tokenizer/, and so its fingerprint
        self._config_record = {"config": config, **info, "fingerprints": prints, "resumes": resumes}
        write_json(self.run_dir / "config.json", self._config_record)

    def save_tokenizer(self, tokenizer: Any) -> None:
        """``tokenizer/``: the tokenizer files (and chat template) the run was trained with, as ``save_pretrained``
        writes them (JSON and plain text), so the run decodes exactly on any machine (:meth:`Run.tokenizer`).
        Written once, into a temporary folder renamed into place; a resumed run keeps the one it has."""
        if not self.write or (self.run_dir / TOKENIZER_DIR).is_dir():
            return
        tmp = Path(tempfile.mkdtemp(dir=self.run_dir, prefix=f".{TOKENIZER_DIR}.", suffix=".tmp"))
        try:
            try:
                tokenizer.save_pretrained(str(tmp))
            except Exception as e:
                if disk_full(e):
                    raise full_disk_error(self.run_dir / TOKENIZER_DIR) from None
                raise
            honour_umask(tmp, folder=True)
            printed = folder_fingerprint(tmp)
            os.replace(tmp, self.run_dir / TOKENIZER_DIR)
            # config.json's fingerprints gain the tokenizer's: Run.tokenizer() refuses a tokenizer/ changed since
            self._config_record["fingerprints"][TOKENIZER_DIR] = printed
            write_json(self.run_dir / "config.json", self._config_record)
        finally:
            if tmp.exists():
                import shutil

                shutil.rmtree(tmp, ignore_errors=True)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        """Add (or replace, when resuming) the metrics of ``step`` and rewrite metrics.jsonl atomically."""
        self.metrics = [m for m in self.metrics if m.get("step") != step] + [{"step": step, **metrics}]
        if not self.write:
            return
        lines = "".join(json.dumps(json_safe(m)) + "\n" for m in self.metrics)
        atomic_write(self.run_dir / "metrics.jsonl", lambda tmp: Path(tmp).write_text(lines))

    def truncate_metrics(self, last_step: int) -> None:
        """Forget metrics after ``last_step`` (a resumed run re-logs them) — on disk too, at once: the steps after
        the checkpoint leave the run (the commit rule) before any of them is recorded again."""
        kept = [m for m in self.metrics if m.get("step", 0) <= last_step]
        changed, self.metrics = len(kept) != len(self.metrics), kept
        if self.write and changed:
            lines = "".join(json.dumps(json_safe(m)) + "\n" for m in self.metrics)
            atomic_write(self.run_dir / "metrics.jsonl", lambda tmp: Path(tmp).write_text(lines))

    def record_step(self, step: int, tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> Path:
        """Write ``steps/step_<k>.safetensors`` (tensors) and ``.json`` (texts, plan, metadata)."""
        base = self.run_dir / "steps" / STEP_FILE.format(step)
        if not self.write:
            return base
        # the step number in the tensors file's header too: a file copied over another step's is named (Run.step)
        write_tensors(base.with_suffix(".safetensors"), tensors, metadata={"step": str(step)})
        write_json(base.with_suffix(".json"), {"step": step, **info})
        return base

    def discard_step(self, step: int) -> None:
        """Remove what :meth:`record_step` wrote for ``step`` (a step interrupted before its metrics were
        logged is not part of the run)."""
        if not self.write:
            return
        base = self.run_dir / "steps" / STEP_FILE.format(step)
        for suffix in (".safetensors", ".json"):
            base.with_suffix(suffix).unlink(missing_ok=True)

    def write_json(self, name: str, obj: Any) -> None:
        if self.write:
            write_json(self.run_dir / name, obj)

    def checkpoint_dir(self, step: int) -> Path:
        return self.run_dir / "checkpoints" / STEP_FILE.format(step)

    def save_checkpoint(self, step: int, state: dict[str, Any], *, rank: int = 0, save_adapters=None,
                        barrier=None) -> Path:
        """Write ``PPOTrainer.state_dict()`` to ``checkpoints/step_<k>/``: ``trainable.safetensors`` (weights),
        ``optim_<worker>.safetensors`` (optimizer tensors), ``rng_rank<r>.safetensors`` (each rank's torch RNG: ranks
        sample different rollouts) and ``state.json`` (progress, optimizer param groups and schedulers, Python
        and NumPy RNG) written last, so a folder without it is an interrupted save that resume skips.
        ``save_adapters(dir)``: the adapters as ``save_pretrained`` writes them, for use outside ppolab. Called on
        every rank; the others write only their RNG file (``barrier`` makes rank 0 wait for them)."""
        directory = self.checkpoint_dir(step)
        directory.mkdir(parents=True, exist_ok=True)
        if self.write:  # re-saving a step (after a resume): never leave an old state.json over new files
            (directory / "state.json").unlink(missing_ok=True)
        write_tensors(directory / f"rng_rank{rank}.safetensors", {"torch": state["rng"]["torch"]})
        if barrier is not None:
            barrier()
        if not self.write:
            return directory
        if save_adapters is not None:
            save_adapters(directory / "adapters")
            for f in (directory / "adapters").rglob("*"):  # safetensors' own writer makes 0600 files
                honour_umask(f, folder=f.is_dir())
        write_tensors(directory / "trainable.safetensors", state["weights"])
        optimizers = {}
        for name, worker in state["workers"].items():
            tensors, meta = optimizer_tensors(worker["optimizer"])
            write_tensors(directory / f"optim_{name}.safetensors", tensors or {"_empty": torch.zeros(0)})
            optimizers[name] = {**meta, "scheduler": worker["scheduler"]}
        write_json(directory / "state.json", {**state["progress"], "optimizers": optimizers,
                                              "python_random": state["rng"]["python"],
                                              "numpy_random": state["rng"]["numpy"]})
        return directory

