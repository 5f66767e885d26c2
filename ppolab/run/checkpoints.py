"""Checkpoints and update states: a trainer's state as safetensors + JSON, written and read back.

``checkpoints/step_<k>/`` holds what ``PPOTrainer.state_dict()`` returns — weights, each optimizer's tensors and
JSON rest, every rank's RNG — written by :meth:`ppolab.run.recorder.Recorder.save_checkpoint` (``state.json``
last, so a folder without it is an interrupted save) and read by :func:`read_checkpoint`. A recorded step may carry
the actor's state before its update (:func:`update_state_record`, under :data:`UPDATE_STATE`), with a digest that
ties it to the step's JSON.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from ppolab.run.claim import holds_run, refuse_existing_run
from ppolab.run.files import read_json
from ppolab.run.metrics_log import check_metrics_log

#: Prefix of a recorded step's tensors that hold the actor's state *before* its update (weights and optimizer
#: moments, ``trainer.record_update_state``): what a replay of that step's optimizer steps starts from.
UPDATE_STATE = "update_state."
#: The files every checkpoint folder holds (``optim_critic`` too when the run has a critic).
CHECKPOINT_FILES = ("trainable.safetensors", "optim_actor.safetensors", "rng_rank0.safetensors")


def _safetensors_problem(path: Path) -> str | None:
    from safetensors import safe_open

    if not path.is_file():
        return f"{path.name} is missing"
    try:
        with safe_open(str(path), framework="pt"):
            return None
    except Exception as e:  # safetensors' own error type: truncated, not safetensors at all, ...
        return f"{path.name} is not a complete safetensors file ({e})"


def checkpoint_problem(directory: str | os.PathLike) -> str | None:
    """Why a checkpoint folder cannot be resumed from (no ``state.json``: the save was interrupted; a file
    that is missing or does not parse), or None when it is complete."""
    directory = Path(directory)
    state_file = directory / "state.json"
    if not state_file.is_file():
        return "incomplete (no state.json: the save was interrupted)"
    try:
        state = json.loads(state_file.read_text())
        optimizers = state["optimizers"]
        int(state["global_step"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, RecursionError) as e:
        return f"state.json does not parse ({type(e).__name__}: {e})"
    names = CHECKPOINT_FILES + (("optim_critic.safetensors",) if "critic" in optimizers else ())
    for name in names:
        problem = _safetensors_problem(directory / name)
        if problem:
            return problem
    return None


def optimizer_tensors(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A torch optimizer ``state_dict()`` as (tensors "<param index>.<name>" → tensor, its JSON-able rest); the
    inverse is :func:`optimizer_state`. The one flattening checkpoints and recorded update states use."""
    tensors = {f"{i}.{k}": v for i, st in state_dict["state"].items() for k, v in st.items()}
    return tensors, {"param_groups": state_dict["param_groups"]}


def optimizer_state(tensors: Mapping[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`optimizer_tensors`: a ``state_dict`` ``load_state_dict`` takes."""
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key != "_empty":
            idx, name_in_state = key.split(".", 1)
            per_param.setdefault(int(idx), {})[name_in_state] = value
    return {"state": per_param, "param_groups": meta["param_groups"]}


def update_state_record(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The actor's state before an update (``PPOTrainer.actor_state``) as a recorded step's extra tensors (under
    :data:`UPDATE_STATE`) and the JSON its ``info["update_state"]`` holds; read back by
    :meth:`StepRecord.update_state`."""
    optim, meta = optimizer_tensors(state["optimizer"])
    tensors = {f"{UPDATE_STATE}weights.{k}": v for k, v in state["weights"].items()}
    tensors.update({f"{UPDATE_STATE}optim.{k}": v for k, v in optim.items()})
    # the digest ties the state to this step's JSON: a state copied in from another step's file is caught exactly,
    # on any machine, without a forward pass (StepRecord.update_state)
    return tensors, {"optimizer": meta, "scheduler": state["scheduler"], "digest": tensors_digest(tensors)}


def tensors_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the names, dtypes, shapes and bytes of ``tensors`` (in name order): what a recorded update state
    is checked against."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def read_checkpoint(directory: str | os.PathLike, rank: int = 0) -> dict[str, Any]:
    """A checkpoint folder as ``PPOTrainer.state_dict()`` (inverse of :meth:`Recorder.save_checkpoint`); the torch
    RNG of ``rank`` (rank 0's when the run had fewer ranks)."""
    directory = Path(directory)
    meta = json.loads((directory / "state.json").read_text())
    workers = {}
    for name, saved in meta["optimizers"].items():
        optimizer = optimizer_state(load_file(str(directory / f"optim_{name}.safetensors")), saved)
        workers[name] = {"optimizer": optimizer, "scheduler": saved["scheduler"]}
    rng_file = directory / f"rng_rank{rank}.safetensors"
    rng_torch = load_file(str(rng_file if rng_file.exists() else directory / "rng_rank0.safetensors"))["torch"]
    progress = {k: meta[k] for k in ("global_step", "data_epoch", "data_cursor", "kl_ctrl_value")}
    return {"weights": load_file(str(directory / "trainable.safetensors")), "workers": workers, "progress": progress,
            "rng": {"torch": rng_torch, "python": meta["python_random"], "numpy": meta["numpy_random"]}}


def resume_checkpoint(run_dir: str | os.PathLike, resume: bool) -> tuple[Path | None, list[str]]:
    """Decide, before any model loads, how a run may start in ``run_dir``: ``(checkpoint, notes)``.

    Not resuming: a directory holding a run is refused (:func:`refuse_existing_run`); returns ``(None, [])``.
    Resuming: ``(None, [])`` when the directory holds no run yet (a fresh start, as verl's ``resume_mode=auto``);
    else the newest complete checkpoint and one note per newer checkpoint skipped (incomplete or corrupt,
    with its path). No complete checkpoint, or a metrics/summary file that does not parse, is a
    :class:`ppolab.errors.RunDirError` / :class:`ppolab.errors.FileFormatError`. Reads only; writes nothing.
    """
    from ppolab.errors import RunDirError

    run_dir = Path(run_dir)
    if not resume:
        refuse_existing_run(run_dir)
        return None, []
    if not holds_run(run_dir):
        return None, []
    root = run_dir / "checkpoints"
    skipped, found = [], None
    for folder in sorted(root.glob("step_*"), reverse=True) if root.exists() else []:
        problem = checkpoint_problem(folder)
        if problem is None:
            found = folder
            break
        skipped.append(f"checkpoint {folder} is {problem}" if problem.startswith("incomplete")
                       else f"checkpoint {folder} is corrupt: {problem}")
    if found is None:
        why = "; ".join(skipped) if skipped else "it has no checkpoints: trainer.save_freq=-1 saves none"
        raise RunDirError(f"trainer.resume=true but {run_dir} holds no complete checkpoint to resume from ({why}); "
                          "give a new trainer.run_dir to start over — nothing in it was changed")
    if (run_dir / "metrics.jsonl").exists():
        check_metrics_log(run_dir / "metrics.jsonl")  # a torn line is reported now, not after the model loaded
    if (run_dir / "summary.json").exists():
        read_json(run_dir / "summary.json", "fix or delete it (it is rewritten at the end of the run)")
    notes = [f"{note}; resuming from the previous complete checkpoint {found} instead" for note in skipped]
    return found, notes

