"""Run directories: the :class:`Recorder` (the only writer) and :class:`Run` / :func:`load_run` (readers).

Layout of a run dir::

    .ppolab-run                 the claim: marks a folder ppolab made; locked by the process writing it (rundir.py)
    config.json                 resolved config, batch plan, library versions, fingerprints of the model and data
                                files, and ``resumes`` (each resume's step and changed settings)
    metrics.jsonl               one JSON object per training step (verl metric names)
    steps/step_000005.safetensors + .json    the real tensors of a recorded step + decoded texts (with
                                trainer.record_update_state: also the actor's weights and Adam state before it)
    tokenizer/                  the tokenizer files and chat template the run was trained with (Run.tokenizer)
    checkpoints/step_000020/    adapters, value head, optimizer and RNG state (safetensors + JSON)
    summary.json                before/after validation accuracy, written at the end

Every file is written to a temporary name in the same folder and renamed into place, so a run stopped
at any moment (a learner interrupting a cell) stays loadable.

The commit rule — what a reader sees of a run that is being trained: the recorder writes a recorded step in a fixed
order — ``step_<k>.safetensors``, then ``step_<k>.json``, then step k's row of ``metrics.jsonl`` (the whole file
rewritten and renamed into place) — and a step is part of the run from that last rename on. :attr:`Run.steps` lists
only such committed steps: a step whose files are on disk but whose metrics row is not is *being written* (or was
left by a writer that died before committing it) and is invisible; :meth:`Run.step` names it as such in one line,
never as damage. A resumed run rewrites ``metrics.jsonl`` without the steps after its checkpoint before it records
any of them again, so a step being re-recorded is invisible too. A reader never takes a lock and never blocks the
writer; a step record maps its tensors file once (one version, even when the file is later replaced) and pairs it
with the ``.json`` that was on disk with it. Only JSON and safetensors — never pickle.
A directory that already holds a run is never written into again except to resume it
(:func:`resume_checkpoint`); a file that does not parse is reported with its path, never skipped.
"""
from __future__ import annotations

import errno
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from safetensors.torch import load_file, save_file

# read_json lives with the run dir's other file rules (rundir.py imports nothing of ppolab's at module level)
from ppolab.course import DATA
from ppolab.rundir import REDO as _REDO
from ppolab.rundir import read_json  # noqa: F401 — re-exported: ppolab.train and readers import it from here
from ppolab.rundir import regular_file

STEP_FILE = "step_{:06d}"
#: The folder of a run dir holding the tokenizer it was trained with.
TOKENIZER_DIR = "tokenizer"
#: What makes a directory a run directory: training into one of these without resuming would mix two runs.
#: (A ``config.json`` alone, metrics of step 0 only or a summary of 0 steps is a start stopped before step 1.)
#: Recorded tensors that are histories of the update (optimizer step, N, R), not part of the step's batch: π_θ's
#: log-probs and entropy and the critic's vpreds at every optimizer step (``ppolab.worker.UpdateHistory``).
HISTORIES = ("actor_log_probs", "actor_entropy", "critic_vpreds")
#: Prefix of a recorded step's tensors that hold the actor's state *before* its update (weights and optimizer
#: moments, ``trainer.record_update_state``): what a replay of that step's optimizer steps starts from.
UPDATE_STATE = "update_state."
RUN_ENTRIES = ("metrics.jsonl", "summary.json", "steps", "checkpoints")
#: The files every checkpoint folder holds (``optim_critic`` too when the run has a critic).
CHECKPOINT_FILES = ("trainable.safetensors", "optim_actor.safetensors", "rng_rank0.safetensors")


def _umask() -> int:
    """The process's umask. Linux shows it in /proc (reading it there leaves it untouched for other threads);
    elsewhere it is read by setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def honour_umask(path: Path | str, folder: bool = False) -> None:
    """Give ``path`` the mode an ordinary ``open``/``mkdir`` would have: mkstemp makes 0600 files and mkdtemp 0700
    folders whatever the umask, which would keep a run an instructor trains on a shared machine from its learners."""
    os.chmod(path, (0o777 if folder else 0o666) & ~_umask())


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete what a killed writer left: the ``.<name>.*.tmp`` files of :func:`_atomic` and the
    ``.tokenizer.*.tmp/`` folder of :meth:`Recorder.save_tokenizer`. Called by the one writer of the run dir (it
    holds the claim) when it resumes; nothing a reader uses is ever named so. Returns what it removed."""
    import shutil

    gone = []
    for p in sorted(Path(run_dir).rglob(".*.tmp")):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        gone.append(p)
    return gone


#: What a full disk (or quota) looks like from Python's I/O and from safetensors' Rust writer, which raises its own
#: exception type with the OS message inside.
_FULL = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122", "StorageFull")


def _disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _FULL or any(t in str(e) for t in _FULL_TEXT)


def _atomic(path: Path, write) -> None:
    """Write through ``write(tmp_path)`` then ``os.replace`` onto ``path`` (with the umask's mode, like ``open``).
    A full disk is an ``OSError(ENOSPC)`` naming the path, what is free there and what to do — the file keeps its
    last whole version."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        if _disk_full(e):
            raise _full_error(path) from None
        raise
    os.close(fd)
    try:
        write(tmp)
        honour_umask(tmp)
        os.replace(tmp, path)
    except Exception as e:
        if _disk_full(e):
            raise _full_error(path) from None
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _full_error(path: Path) -> OSError:
    import shutil

    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free there"
    except OSError:
        free = "free space unknown"
    return OSError(errno.ENOSPC, f"no space left to write {path} ({free}): free space on that disk, or train into "
                                 "a trainer.run_dir on another one — the run stays whole up to its last step, and "
                                 "trainer.resume=true continues it from its latest checkpoint")


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


def _run_entries(run_dir: str | os.PathLike) -> list[str]:
    """The entries of ``run_dir`` that show a training step happened there (see :data:`RUN_ENTRIES`)."""
    d = Path(run_dir)
    found = []
    if (d / "metrics.jsonl").is_file() and any(row.get("step", 0) for _, row in _jsonl_rows(d / "metrics.jsonl")):
        found.append("metrics.jsonl")  # step 0 alone is the validation before training
    if (d / "summary.json").is_file():
        try:
            steps = json.loads((d / "summary.json").read_text()).get("steps", 1)
        except (ValueError, AttributeError):  # unreadable: count it, a run may be behind it
            steps = 1
        if steps:
            found.append("summary.json")
    found += [n for n in ("steps", "checkpoints") if (d / n).is_dir() and any((d / n).iterdir())]
    return found


def holds_run(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` already holds (part of) a run: logged training steps, a summary, recorded steps or
    checkpoints. A directory holding only the ``config.json`` of a start that failed before step 1 does not."""
    return bool(_run_entries(run_dir))


def refuse_existing_run(run_dir: str | os.PathLike) -> None:
    """:class:`ppolab.errors.RunDirError` when ``run_dir`` holds a run: a new run never mixes with an old one."""
    from ppolab.errors import RunDirError

    found = ", ".join(_run_entries(run_dir))
    if found:
        raise RunDirError(f"trainer.run_dir={str(run_dir)!r} already holds a run ({found}); set trainer.resume=true "
                          "to continue it, or give a new trainer.run_dir — nothing in it was changed")


class Recorder:
    """Writes one run directory. The trainer hands it plain dicts and tensors; it decides the layout."""

    def __init__(self, run_dir: str | os.PathLike, config: dict[str, Any], info: dict[str, Any], write: bool = True,
                 resume: dict[str, Any] | None = None):
        """``write=False`` (data-parallel ranks other than 0): keep metrics in memory, write nothing.
        ``resume=None`` refuses a directory that already holds a run (:func:`refuse_existing_run`); a resume passes
        ``{"at_step": k, "changed": {key: [old, new]}}`` (:func:`ppolab.rundir.check_resume`): the logged metrics
        are kept (the trainer truncates them to the checkpoint's step) and the resume is appended to
        ``config.json``'s ``resumes``, so the run dir says which settings produced which steps. Create the
        recorder of a resumed run only after its checkpoint loaded: this writes ``config.json``."""
        from ppolab.rundir import fingerprints, flatten

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
            remove_stale_temporaries(self.run_dir)
            if existing.exists():  # resuming: keep what was logged
                self.metrics = _read_jsonl(existing)
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
        from ppolab.rundir import folder_fingerprint

        tmp = Path(tempfile.mkdtemp(dir=self.run_dir, prefix=f".{TOKENIZER_DIR}.", suffix=".tmp"))
        try:
            try:
                tokenizer.save_pretrained(str(tmp))
            except Exception as e:
                if _disk_full(e):
                    raise _full_error(self.run_dir / TOKENIZER_DIR) from None
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
        lines = "".join(json.dumps(_json_safe(m)) + "\n" for m in self.metrics)
        _atomic(self.run_dir / "metrics.jsonl", lambda tmp: Path(tmp).write_text(lines))

    def truncate_metrics(self, last_step: int) -> None:
        """Forget metrics after ``last_step`` (a resumed run re-logs them) — on disk too, at once: the steps after
        the checkpoint leave the run (the commit rule) before any of them is recorded again."""
        kept = [m for m in self.metrics if m.get("step", 0) <= last_step]
        changed, self.metrics = len(kept) != len(self.metrics), kept
        if self.write and changed:
            lines = "".join(json.dumps(_json_safe(m)) + "\n" for m in self.metrics)
            _atomic(self.run_dir / "metrics.jsonl", lambda tmp: Path(tmp).write_text(lines))

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


def _jsonl_rows(path: Path):
    """``(line number, row)`` of a JSON-lines file, read line by line (a regular file only: :func:`regular_file`);
    a line that does not parse is an error naming the file and line."""
    from ppolab.errors import FileFormatError
    from ppolab.rundir import json_lines

    seen: dict[int, int] = {}  # step → its line: the recorder logs each step once
    for number, row in json_lines(path, "fix or delete that line (its step's metrics are lost), or " + _REDO):
        if not isinstance(row, dict):
            raise FileFormatError(f"{path}, line {number}: expected a JSON object of metrics, got "
                                  f"{type(row).__name__}; fix or delete that line")
        if "step" not in row:
            raise FileFormatError(f"{path}, line {number}: a row without a 'step' (the recorder writes one on every "
                                  "row); fix or delete that line")
        step = row["step"]
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) \
                or step != int(step):
            raise FileFormatError(f"{path}, line {number}: step {step!r} is not a whole number; fix or delete "
                                  "that line")
        if not 0 <= step < 2**53:  # 2**53: past it a float64 column no longer holds every whole number
            raise FileFormatError(f"{path}, line {number}: step {step!r} is out of range (a run's steps count from "
                                  "0, the validation before training); fix or delete that line")
        if int(step) in seen:
            raise FileFormatError(f"{path}, lines {seen[int(step)]} and {number}: step {int(step)} is logged twice "
                                  "(the recorder logs each step once); delete the line that is not the run's")
        seen[int(step)] = number
        yield number, row


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (:func:`_jsonl_rows`)."""
    return [row for _, row in _jsonl_rows(path)]


def _check_jsonl(path: Path) -> None:
    """Every line of ``path`` parses: a torn line is reported when a run is opened, in constant memory."""
    for _ in _jsonl_rows(path):
        pass


def _metrics_frame(path: Path):
    """metrics.jsonl as a DataFrame indexed by step, parsed streaming into one float64 array per metric (8 bytes a
    value; a list of row dicts costs ~10× that): a 200 MB file stays within a few hundred MB. The dtypes are those
    pandas gives the rows: a metric logged as a whole number on every row is int64, as a bool on every row bool; a
    value that is not a number (a string a custom reward logged) keeps its column as objects."""
    from array import array

    import numpy as np
    import pandas as pd

    numbers: dict[str, array] = {}
    kinds: dict[str, set] = {}  # per numeric column: the Python types seen, and "missing"
    objects: dict[str, list] = {}
    n = 0
    for _, row in _jsonl_rows(path):
        for key, value in row.items():
            if key in objects:
                objects[key].append(value)
                continue
            col = numbers.get(key)
            if col is None:
                col = numbers[key] = array("d", [float("nan")] * n)
                kinds[key] = {"missing"} if n else set()
            if value is None or isinstance(value, (int, float)):
                col.append(float("nan") if value is None else float(value))
                kinds[key].add("missing" if value is None else type(value))
            else:  # this column holds something else: objects from now on, the numbers so far included
                objects[key] = [None if v != v else v for v in col] + [value]
                del numbers[key], kinds[key]
        n += 1
        for key, col in numbers.items():  # a metric this row lacks: NaN
            if len(col) < n:
                col.append(float("nan"))
                kinds[key].add("missing")
        for col in objects.values():
            if len(col) < n:
                col.append(None)
    data: dict[str, Any] = {}
    for key, col in numbers.items():
        values = np.frombuffer(col, dtype=np.float64) if len(col) else np.zeros(0)
        seen = kinds[key]
        data[key] = (values.astype(np.int64) if seen == {int} else values.astype(bool) if seen == {bool}
                     else values)
    data.update(objects)
    frame = pd.DataFrame(data, copy=False)
    if "step" in frame:
        frame["step"] = frame["step"].astype("int64")
        frame = frame.set_index("step").sort_index()
    return frame


def _warn_if_newer(path: Path, recorded: Any) -> None:
    """One line when the run was recorded by a newer ppolab than this one: it may hold what this reader does not
    know (opened anyway: most of a run reads the same)."""
    import importlib.metadata as md
    import warnings

    from packaging.version import InvalidVersion, Version

    from ppolab.errors import RunWarning

    try:  # the version the recorder writes (ppolab.train._versions): the installed distribution's
        __version__ = md.version("ppolab")
    except md.PackageNotFoundError:  # a checkout on sys.path, not installed: nothing to compare with
        return
    try:
        newer = recorded is not None and Version(str(recorded)) > Version(__version__)
    except InvalidVersion:
        newer = False
    if newer:
        warnings.warn(f"{path} was recorded by ppolab {recorded}, newer than this ppolab {__version__}: what it "
                      "added may be missing or misread here — upgrade ppolab to read it fully", RunWarning,
                      stacklevel=3)


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
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as e:
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
        _check_jsonl(run_dir / "metrics.jsonl")  # a torn line is reported now, not after the model loaded
    if (run_dir / "summary.json").exists():
        read_json(run_dir / "summary.json", "fix or delete it (it is rewritten at the end of the run)")
    notes = [f"{note}; resuming from the previous complete checkpoint {found} instead" for note in skipped]
    return found, notes


#: safetensors' dtype names → torch dtypes (the ones the recorder writes, and the rest of the format's common ones).
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


class LazyTensors(Mapping):
    """The tensors of one ``steps/step_<k>.safetensors``, each read on first use. Opening reads only the header
    (and checks the file is complete); the first tensor read maps the file privately (``UntypedStorage.from_file``:
    no file descriptor kept, memory only for the pages read) and every later read comes from that mapping — one
    version of the file, even when the writer replaces it afterwards (a rename leaves the mapped file as it was).
    A file replaced between opening and the first read is an error, never a mix of two versions.
    A read-only mapping: name → tensor, each loaded once."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            self.version, self._size = (st.st_dev, st.st_ino, st.st_mtime_ns), st.st_size
            if self._size < 8:
                raise ValueError(f"{self._size} bytes, shorter than a safetensors header")
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= self._size - 8:
                raise ValueError(f"a header of {n} bytes in a file of {self._size}")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError(f"a header that is a JSON {_json_kind(header)}, not an object")
        metadata = header.pop("__metadata__", None)
        #: the header's metadata (the recorder writes the step number there): str → str, {} when none
        self.metadata = metadata if isinstance(metadata, dict) else {}
        self._start = 8 + n
        self._entries: dict[str, tuple[torch.dtype, list[int], int, int]] = {}
        for name, e in header.items():
            try:
                dtype_name, shape, (begin, end) = e["dtype"], list(e["shape"]), e["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise ValueError(f"tensor {name!r} has no dtype, shape and data_offsets") from None
            if dtype_name not in _SAFETENSORS_DTYPES:
                raise ValueError(f"dtype {dtype_name} of {name!r}")
            whole = lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 0  # noqa: E731
            if not (all(map(whole, shape)) and whole(begin) and whole(end) and begin <= end):
                raise ValueError(f"tensor {name!r} has shape {shape} and bytes {begin}–{end}")
            if self._start + end > self._size:
                raise ValueError(f"tensor {name!r} (bytes {begin}–{end}) is past the end of the file's "
                                 f"{self._size} bytes")
            dtype = _SAFETENSORS_DTYPES[dtype_name]
            if math.prod(shape) * dtype.itemsize != end - begin:
                raise ValueError(f"tensor {name!r} of shape {shape} ({dtype_name}) needs "
                                 f"{math.prod(shape) * dtype.itemsize} bytes, its header gives it {end - begin}")
            self._entries[name] = (dtype, shape, begin, end)
        self._names = list(self._entries)
        self._bytes: torch.Tensor | None = None
        self._loaded: dict[str, torch.Tensor] = {}

    def _stamp(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return st.st_dev, st.st_ino, st.st_mtime_ns

    def _mapped(self) -> torch.Tensor:
        """The file's bytes, mapped once — the version whose header was read (checked before and after mapping)."""
        if self._bytes is None:
            from ppolab.errors import FileFormatError

            if self._stamp() == self.version:
                storage = torch.UntypedStorage.from_file(str(self.path), shared=False, nbytes=self._size)
                if self._stamp() == self.version:
                    self._bytes = torch.empty(0, dtype=torch.uint8).set_(storage)
            if self._bytes is None:
                raise FileFormatError(f"{self.path} was replaced since its step was opened (a resumed run recorded "
                                      "the step again): open the run again (ppolab.load_run) to read the new one")
        return self._bytes

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._loaded:
            if name not in self._entries:
                from ppolab.errors import RecordEntryError

                raise RecordEntryError(f"{self.path} holds no tensor {name!r} (it holds {', '.join(self._names)}): "
                                       f"the step was recorded without it, or the file was replaced; {_REDO}")
            dtype, shape, begin, end = self._entries[name]
            if end == begin:
                t = torch.empty(shape, dtype=dtype)
            else:  # a copy: the tensor must not keep the mapping (nor share it with the next reader)
                t = self._mapped()[self._start + begin:self._start + end].clone().view(dtype).reshape(shape)
            self._loaded[name] = t
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def real_rows_of(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Boolean (N,) of a recorded batch's real trajectories: not ``is_pad`` (every row where nothing was padded)."""
    t = tensors
    return ~t["is_pad"].bool() if "is_pad" in t else torch.ones(t["responses"].shape[0], dtype=torch.bool)


@dataclass(frozen=True)
class OptimizerStepRecord:
    """Optimizer step ``index`` of ``role``'s update at a recorded step (:meth:`StepRecord.opt_step`): ``step`` is
    the plan's :class:`ppolab.update_plan.OptimizerStep` — ``epoch``, ``mini_batch``, every rank's share in loader
    order (``rows()``), ``micro_batches[rank]``, and the global counts (``info()``) its micro-batch losses were
    divided by."""

    record: StepRecord
    role: str
    index: int
    step: Any

    @property
    def label(self) -> str:
        """"opt step k (epoch e, mini-batch m)", in the learner's language."""
        from ppolab.i18n import tr

        return tr("opt step {k} (epoch {e}, mini-batch {m})").format(k=self.index, e=self.step.epoch,
                                                                     m=self.step.mini_batch)

    def rows(self) -> list[int]:
        """The recorded rows this optimizer step trained on (every rank's, padding rows included), in row order."""
        return sorted(self.step.rows())

    def batch(self) -> dict[str, torch.Tensor]:
        """Its rows' tensors (n_rows, R), ready for the ``ppolab.algos`` losses: ``rows`` (indices),
        ``response_mask`` of the real rows (0 on padding rows), and — the actor: ``old_log_probs``, ``advantages``,
        ``entropy``, ``ref_log_prob`` where recorded, and ``log_prob`` (= ``actor_log_probs[k]``, the old log-prob
        at masked positions so no NaN leaks into a seq-mean mode); the critic: ``values``, ``returns`` and
        ``vpreds`` (= ``critic_vpreds[k]``, V_old at masked positions)."""
        t = self.record.tensors
        rows = torch.tensor(self.rows(), dtype=torch.long)
        mask = (t["response_mask"].float() * self.record.real_rows().float().unsqueeze(-1))[rows]
        out: dict[str, torch.Tensor] = {"rows": rows}
        for key in (("old_log_probs", "advantages", "entropy", "ref_log_prob") if self.role == "actor"
                    else ("values", "returns")):
            if key in t:
                out[key] = t[key][rows].float()
        out["response_mask"] = mask
        if self.role == "actor":
            lp = torch.nan_to_num(t["actor_log_probs"][self.index][rows], nan=0.0)
            out["log_prob"] = torch.where(mask > 0, lp, out["old_log_probs"])
        else:
            # past a micro-batch's own width the recording holds NaN (mask 0): V_old there, as lab 09 and the
            # value-clip explorer put it, so no masked NaN can leak into the loss
            vp = torch.nan_to_num(t["critic_vpreds"][self.index][rows], nan=0.0)
            out["vpreds"] = torch.where(mask > 0, vp, out["values"])
        return out


@dataclass
class StepRecord:
    """One recorded training step: ``tensors`` (name → tensor) and ``info`` (texts, batch plan, …)."""

    step: int
    tensors: Mapping[str, torch.Tensor]
    info: dict[str, Any] = field(default_factory=dict)
    #: (tensors file, JSON file) it was read from — what an error about the record names; None: built in memory
    files: tuple[Path, Path] | None = None
    #: stat stamps of the two files as read (:meth:`Run.identity`): a cache of numbers derived from the step keys
    #: on them, so a step recorded again (or a run replaced) is never served the old numbers
    stamp: tuple = ()
    #: the run's parsed config (a zero-argument callable: :meth:`Run.ppo_config`): what a plan the step did not
    #: record is planned from; None for a record built in memory with its plans
    config_of: Any = field(default=None, repr=False, compare=False)
    _plans: dict = field(default_factory=dict, repr=False, compare=False)

    def plan(self, role: str = "actor") -> Any:
        """The update plan ``role``'s worker ("actor" or "critic") executed at this step — every optimizer step's
        rows, each rank's micro-batches and the global counts its loss was normalised by
        (:class:`ppolab.update_plan.UpdatePlan`). Read from the record; for a run recorded before plans were kept,
        planned once from this step's own recorded batch and the run's config, which ``plan.recorded`` and
        ``plan.note()`` say. The one way a reader gets an optimizer step's facts; a step the role did not update at
        (a critic warm-up, a run without a critic) is a :class:`ppolab.errors.RecordEntryError`."""
        from ppolab.errors import RecordEntryError
        from ppolab.update_plan import PLANS_KEY, recorded_plan

        if role not in self._plans:
            recorded = role in (self.info.get(PLANS_KEY) or {})
            history = "actor_log_probs" if role == "actor" else "critic_vpreds"
            if not recorded and (history not in self.tensors or self.config_of is None):
                raise RecordEntryError(f"{self.info_file}: step {self.step} has no {role} update (no {history})")
            self._plans[role] = recorded_plan(self, None if recorded else self.config_of(), role)
        return self._plans[role]

    def opt_step(self, k: int, role: str = "actor") -> OptimizerStepRecord:
        """Optimizer step ``k`` of ``role``'s update at this step, as the worker executed it (:meth:`plan`): its
        place, rows, micro-batches, global counts and label, and its tensors (:meth:`OptimizerStepRecord.batch`)."""
        from ppolab.errors import whole_argument

        plan = self.plan(role)
        k = whole_argument("opt_step", k, range(len(plan.steps)), f"an optimizer step of the {role}'s update at "
                                                                      f"step {self.step}")
        return OptimizerStepRecord(self, role, k, plan.steps[k])

    @property
    def info_file(self) -> str:
        """How an error names the step's JSON file."""
        return str(self.files[1]) if self.files else f"the record of step {self.step}"

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def real_rows(self) -> torch.Tensor:
        """Boolean (N,) of the real trajectories (the synthetic padding samples of stage 3 excluded)."""
        return real_rows_of(self.tensors)

    def batch_tensors(self) -> dict[str, torch.Tensor]:
        """The step's batch after the nine stages: every recorded tensor but the update histories
        (:data:`HISTORIES`)."""
        return {k: v for k, v in self.tensors.items() if k not in HISTORIES and not k.startswith(UPDATE_STATE)}

    def update_state(self) -> dict[str, Any] | None:
        """The actor's state before this step's update, when the run kept it (``trainer.record_update_state``):
        ``{"weights": {"actor.<i>": tensor}, "optimizer": state_dict, "scheduler": state_dict}`` — the actor's
        weights in ``actor_parameters()`` order and what ``Worker.load_state_dict`` takes, as copies (the optimizer
        keeps the tensors it is given and steps them in place: the record must stay as recorded). None when not
        recorded."""
        from ppolab.errors import FileFormatError

        meta = self.info.get("update_state")
        if meta is None:
            return None
        tensors_file = self.files[0] if self.files else f"the tensors of step {self.step}"
        if not isinstance(meta, dict) or not {"optimizer", "scheduler"} <= set(meta):
            raise FileFormatError(f"{self.info_file}: its 'update_state' is not the object of 'optimizer' and "
                                  f"'scheduler' the recorder writes; {_REDO}")
        weights, optim = {}, {}
        for key in self.tensors:
            if key.startswith(UPDATE_STATE + "weights."):
                weights[key[len(UPDATE_STATE + "weights."):]] = self.tensors[key].clone()
            elif key.startswith(UPDATE_STATE + "optim."):
                optim[key[len(UPDATE_STATE + "optim."):]] = self.tensors[key].clone()
        recorded = meta.get("digest")  # runs recorded before digests were kept: the replay's log-prob check
        if recorded is not None:
            found = tensors_digest({f"{UPDATE_STATE}weights.{k}": v for k, v in weights.items()}
                                   | {f"{UPDATE_STATE}optim.{k}": v for k, v in optim.items()})
            if found != recorded:
                raise FileFormatError(f"{tensors_file}: its update state (the actor's weights and Adam state "
                                      f"before step {self.step}) is not the one {self.info_file} recorded "
                                      f"(digest {found[:12]}…, recorded {str(recorded)[:12]}…): copied in from "
                                      f"another step or damaged — a replay from it would measure another update; "
                                      f"put back the step's own file, or {_REDO}")
        if not weights:
            raise FileFormatError(f"{tensors_file} holds no update-state weights ({UPDATE_STATE}weights.*) though "
                                  f"{self.info_file} records an update state; {_REDO}")
        try:
            optimizer = optimizer_state(optim, meta["optimizer"])
        except (KeyError, ValueError, TypeError) as e:
            raise FileFormatError(f"{self.info_file}: its 'update_state.optimizer' does not match the tensors "
                                  f"{UPDATE_STATE}optim.* of {tensors_file} ({type(e).__name__}: {e}); "
                                  f"{_REDO}") from None
        return {"weights": weights, "optimizer": optimizer, "scheduler": meta["scheduler"]}

    @property
    def texts(self) -> dict[str, list[str]]:
        """Decoded ``prompts`` and ``responses`` of every row."""
        return self.info.get("texts", {})


def _extra_file(folder: Path, expected: str) -> str | None:
    """The name of the one file of ``folder`` whose removal gives the recorded fingerprint ``expected`` (a file a
    user put beside a run's tokenizer files), or None. A folder fingerprint covers every file, so this is the one
    change it can name: the other files are then exactly the recorded ones."""
    from ppolab.rundir import files_digest, folder_files

    files = folder_files(folder)
    if len(files) > 64:  # a tokenizer has a handful of files; a folder of many is not worth the digests
        return None
    return next((f.name for f in files if files_digest([g for g in files if g != f]) == expected), None)


#: The groups every recorded config holds (``to_dict`` writes the whole tree): :meth:`Run.ppo_config` of a config.json
#: without them would put the defaults in their place — another run's settings, silently.
CONFIG_GROUPS = ("data", "actor_rollout_ref", "algorithm", "trainer")


def _json_kind(value: Any) -> str:
    """The JSON name of ``value``'s type: object, array, string, number, boolean, null."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _check_config_shape(config_file: Path, meta: dict[str, Any]) -> None:
    """:class:`ppolab.errors.FileFormatError` naming ``config_file`` when its entries are not of the shapes the
    recorder writes (an edit, or another program's file)."""
    from ppolab.errors import FileFormatError

    config = meta["config"]
    problem = None
    if not isinstance(config, dict):
        problem = f"its 'config' is a JSON {_json_kind(config)}, not the object of settings the recorder writes"
    else:
        for key, kind in (("fingerprints", dict), ("resumes", list), ("batch_plan", dict), ("versions", dict)):
            if meta.get(key) is not None and not isinstance(meta[key], kind):
                problem = (f"its {key!r} is a JSON {_json_kind(meta[key])}, not the "
                           f"{'object' if kind is dict else 'array'} the recorder writes")
                break
    if problem:
        raise FileFormatError(f"{config_file}: {problem}; put back the run's own config.json, or {_REDO}")


def _no_config(folder: Path) -> str:
    """Why ``folder`` has no config.json: a training that claimed it and is loading its models now, one that stopped
    before writing it, or a folder that is no run at all."""
    from ppolab.rundir import CLAIM_FILE, claim_holder, pid_alive, read_claim

    claim = read_claim(folder / CLAIM_FILE) if (folder / CLAIM_FILE).is_file() else None
    if claim is None:
        return (f"{folder} is not a ppolab run directory (no config.json). Shipped runs live in data/runs/; make one "
                "with python -m ppolab.train trainer.run_dir=<dir>")
    import socket

    if claim.get("pid") and "released" not in claim and claim.get("host") == socket.gethostname() \
            and pid_alive(int(claim["pid"])):
        return (f"{folder} is being started by {claim_holder(claim)}: its config.json is written once the models "
                "load — open it again in a moment")
    return (f"{folder} holds no run: the training that claimed it ({claim_holder(claim)}) stopped before it wrote "
            "config.json; train into it again (the same command)")


def cache_slot(cache: dict, identity: tuple, *rest: Any) -> tuple:
    """The key of a module-level cache of numbers derived from a run: ``(identity, *rest)`` with ``identity`` a
    :meth:`Run.identity`. The entries of an earlier version of the same run dir (replaced at that path, or a step
    recorded again) are dropped from ``cache`` here, so they are neither served nor kept in memory."""
    path, config, *step = identity
    for old in [k for k in list(cache) if k[0][0] == path and (k[0][1] != config or (step and len(k[0]) > 2
                                                                              and k[0][2] == step[0]
                                                                              and k[0] != identity))]:
        cache.pop(old, None)
    return (identity, *rest)


def file_stamp(path: Path) -> tuple[int, int, int, int, int]:
    """(device, inode, size, mtime, ctime) of ``path``: a file replaced, rewritten or copied in (``cp -p`` keeps the
    mtime, never the ctime) has another stamp."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class RecordInfo(dict):
    """A recorded step's JSON (a ``dict``, its objects and arrays too): a key or list item a reader needs and the file
    lacks is a :class:`ppolab.errors.RecordEntryError` naming the file and the entry — still a ``KeyError`` /
    ``IndexError``; ``get`` and ``in`` behave as a dict's."""

    def __init__(self, data: Mapping[str, Any], file: Path | str, where: str = ""):
        super().__init__((k, _wrapped(v, file, f"{where}.{k}" if where else str(k))) for k, v in data.items())
        self.file, self.where = file, where

    def __missing__(self, key: Any):
        from ppolab.errors import RecordEntryError

        raise RecordEntryError(f"{self.file} has no entry {self.where + '.' if self.where else ''}{key} (the "
                               f"recorder writes it): the file was edited or damaged; {_REDO}")


class RecordList(list):
    """A list of :class:`RecordInfo`: an index past its end names the file and the entry."""

    def __init__(self, data: list, file: Path | str, where: str):
        super().__init__(_wrapped(v, file, f"{where}[{i}]") for i, v in enumerate(data))
        self.file, self.where = file, where

    def __getitem__(self, i):
        try:
            return super().__getitem__(i)
        except IndexError:
            from ppolab.errors import RecordEntryError

            raise RecordEntryError(f"{self.file}: {self.where} has {len(self)} entries, no [{i}] (the recorder "
                                   f"writes one per row): the file was edited or damaged; {_REDO}") from None


def _wrapped(value: Any, file: Path | str, where: str) -> Any:
    if isinstance(value, dict):
        return RecordInfo(value, file, where)
    if isinstance(value, list):
        return RecordList(value, file, where)
    return value


def _check_record(k: int, tensors: LazyTensors, info: dict[str, Any], tensors_file: Path, info_file: Path,
                  steps: list[int]) -> None:
    """:class:`ppolab.errors.FileFormatError` naming the file when step ``k``'s pair disagrees with itself: a file
    that records another step (copied over this one), per-row lists of another length than the tensors' rows."""
    from ppolab.errors import FileFormatError

    todo = f"put back the step's own file, open another step (recorded: {steps}), or {_REDO}"
    if "step" in info and info["step"] != k:
        raise FileFormatError(f"{info_file} records step {info['step']!r}, not {k}: copied in from another step's "
                              f"file or edited; {todo}")
    if "step" in tensors.metadata and tensors.metadata["step"] != str(k):
        raise FileFormatError(f"{tensors_file} records step {tensors.metadata['step']}, not {k} (its header): copied "
                              f"in from another step's file; {todo}")
    if "responses" not in tensors:
        return
    rows = tensors._entries["responses"][1][0] if tensors._entries["responses"][1] else 0
    texts = info.get("texts")
    lists = {f"texts.{n}": v for n, v in texts.items()} if isinstance(texts, dict) else {}
    lists["data_source"] = info.get("data_source")
    for name, value in lists.items():
        if isinstance(value, list) and len(value) != rows:
            raise FileFormatError(f"{info_file}: its {name} has {len(value)} entries, the step's "
                                  f"{tensors_file.name} {rows} rows (one each): the file was edited or damaged; "
                                  f"{todo}")


#: Parsed run configs, keyed by the recorded config itself (its canonical JSON): a reader opens the same run many
#: times (an exercise resolves its run at each check), and composing a PPOConfig costs about 0.2 s. A run replaced
#: with other settings is another key; the same settings give the same value whatever file they came from.
_PPO_CONFIGS: dict[str, Any] = {}
_PPO_CONFIGS_MAX = 64


class Run:
    """A run directory opened for reading: config, metrics, recorded steps."""

    def __init__(self, path: str | os.PathLike):
        from ppolab.errors import FileFormatError, MissingFileError

        self.path = Path(path).expanduser()  # as trainer.run_dir: "~/runs/x" trains and opens the same folder
        config_file = self.path / "config.json"
        if not self.path.exists():
            import difflib

            near = difflib.get_close_matches(self.path.name, list(SHIPPED_RUNS), n=1)
            where = "" if self.path.is_absolute() else f" (a relative path: looked for in {Path.cwd()})"
            raise MissingFileError(f"{self.path} does not exist{where}"
                                   + (f" — did you mean the shipped run {near[0]!r}?" if near else "")
                                   + f"; a run is a shipped run's name ({', '.join(SHIPPED_RUNS)}) or the "
                                   "trainer.run_dir of a run you trained")
        if not self.path.is_dir():
            raise FileFormatError(f"{self.path} is a file, not a run directory: give the folder the run was "
                                  "trained into (its trainer.run_dir)")
        if not config_file.exists():
            raise MissingFileError(_no_config(self.path))
        self._config_stamp = file_stamp(config_file)  # before reading: a file replaced meanwhile reads as changed
        meta = read_json(config_file)
        if isinstance(meta, dict) and "config" not in meta and ("model_type" in meta or "architectures" in meta):
            raise FileFormatError(f"{self.path} is a model directory (a {meta.get('model_type', 'model')}'s "
                                  "config.json), not a run: train on it with actor_rollout_ref.model.path="
                                  f"{self.path} trainer.run_dir=<dir>, then open <dir>")
        if not isinstance(meta, dict) or "config" not in meta:
            raise FileFormatError(f"{config_file} has no 'config' entry: not written by ppolab's recorder; {_REDO}")
        _check_config_shape(config_file, meta)
        self.config: dict[str, Any] = meta.pop("config")
        self.info: dict[str, Any] = meta
        _warn_if_newer(self.path, meta.get("versions", {}).get("ppolab") if isinstance(meta.get("versions"), dict)
                       else None)
        self._cache: dict[int, StepRecord] = {}
        self._ppo_config = None
        self._tokenizer = None
        self._metrics: tuple[Any, Any] | None = None
        self._steps: tuple[Any, list[int], list[int]] | None = None
        if (self.path / "metrics.jsonl").exists():
            _check_jsonl(self.path / "metrics.jsonl")  # a torn line is reported when the run is opened

    def _frame(self):
        """metrics.jsonl parsed once per version of the file (its mtime and size), shared: callers copy it."""
        import pandas as pd

        path = self.path / "metrics.jsonl"
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if self._metrics is None or self._metrics[0] != stamp:
            self._metrics = (stamp, _metrics_frame(path) if stamp else pd.DataFrame())
        return self._metrics[1]

    @property
    def metrics(self):
        """A pandas DataFrame, one row per training step, indexed by ``step``."""
        return self._frame().copy()  # a caller may change its frame without changing another's

    def _listing(self) -> tuple[list[int], list[int]]:
        """(committed steps, steps being written): the steps with a file in ``steps/``, split by the commit rule
        (the module docstring) — committed once metrics.jsonl holds their row."""
        folder = self.path / "steps"
        if not folder.exists():
            self.there()  # a run dir moved away lists no steps: say so, not "recorded: []"
            return [], []
        frame = self._frame()
        stamp = (folder.stat().st_mtime_ns, self._metrics[0])
        if self._steps is None or self._steps[0] != stamp:  # listed once per change of the folder or the log
            found = set()
            for p in folder.glob("step_*"):
                number = p.stem.split("_")[1]
                if p.suffix in (".safetensors", ".json") and number.isdigit():
                    found.add(int(number))
            logged = set(int(i) for i in frame.index) if len(frame) else set()
            self._steps = (stamp, sorted(found & logged), sorted(found - logged))
        return list(self._steps[1]), list(self._steps[2])

    def there(self) -> None:
        """:class:`ppolab.errors.MissingFileError` when the run dir is gone from its path since it was opened."""
        if not self.path.is_dir():
            from ppolab.errors import MissingFileError

            raise MissingFileError(f"the run dir {self.path} is no longer there (moved or deleted after load_run) — "
                                   "open it where it is now: ppolab.load_run(<its new path>)")

    def _only_gained_tokenizer(self, now: tuple | None) -> bool:
        """Whether config.json, rewritten since this Run opened it, differs only by the tokenizer's fingerprint the
        recorder adds once ``tokenizer/`` is written (``Recorder.save_tokenizer``, right after the run is claimed): a
        run followed from its first second is the same run. Takes the new stamp when so."""
        if now is None:
            return False
        try:
            meta = read_json(self.path / "config.json")
        except Exception:  # noqa: BLE001 — a file being replaced or damaged: not the same run, as far as a cache knows
            return False
        if not isinstance(meta, dict) or meta.get("config") != self.config:
            return False
        old, new = dict(self.info), {k: v for k, v in meta.items() if k != "config"}
        old_prints, new_prints = old.pop("fingerprints", None) or {}, new.pop("fingerprints", None) or {}
        if old != new or TOKENIZER_DIR in old_prints or {k: v for k, v in new_prints.items()
                                                         if k != TOKENIZER_DIR} != old_prints:
            return False
        self.info["fingerprints"], self._config_stamp = new_prints, now
        return True

    def identity(self, step: int | None = None) -> tuple:
        """What a cache of numbers derived from this run (or from its recorded ``step``) is keyed by: the run dir's
        path and the stat stamps (device, inode, size, mtime, ctime) of the files they were read from —
        ``config.json`` as opened, and the step's two files as :meth:`step` read them. A run replaced at the same
        path, or a step recorded again, has another identity, so a cache never serves it the old numbers; a stat
        or two, no file read. The one helper every cache of ``ppolab.numbers`` and ``ppolab.replay`` keys on. A run
        dir moved away, or replaced since this Run opened it, is an error naming it (its numbers would mix two
        runs)."""
        from ppolab.errors import FileFormatError

        self.there()
        try:
            now = file_stamp(self.path / "config.json")
        except FileNotFoundError:
            now = None
        if now != self._config_stamp and not self._only_gained_tokenizer(now):
            raise FileFormatError(f"the run dir {self.path} was replaced (or resumed) since load_run opened it: its "
                                  "config.json is another file now — open it again: "
                                  f"ppolab.load_run({str(self.path)!r})")
        key: tuple = (str(self.path.resolve()), self._config_stamp)
        if step is not None:
            record = self.step(step)
            key += (record.step, record.stamp)
        return key

    @property
    def steps(self) -> list[int]:
        """Committed training steps with recorded tensors (``step_<k>.safetensors`` and/or ``.json`` whose metrics
        row is logged; :meth:`step` names a missing half). Read again on each use: a run being trained gains steps."""
        return self._listing()[0]

    def no_steps(self) -> str:
        """The one line for a run without a committed recorded step: why (no training step logged yet, or
        ``trainer.record_freq`` records none) and what to do."""
        pending = self.being_written()
        writing = f"; step {pending[-1]} is being written" if pending else ""
        freq = (self.config.get("trainer") or {}).get("record_freq", 1)
        frame = self._frame()
        if isinstance(freq, (int, float)) and freq <= 0:
            return (f"{self.path} has no recorded steps: it was trained with trainer.record_freq={freq}; train with "
                    "trainer.record_freq > 0")
        if not any(k > 0 for k in frame.index):
            return (f"{self.path} has no recorded steps: no training step was logged yet (it is still starting, or "
                    "its training stopped before step 1: the same python -m ppolab.train command trains it again)"
                    + writing)
        return f"{self.path} has no recorded steps (trainer.record_freq={freq})" + writing

    def being_written(self) -> list[int]:
        """Steps whose files are on disk but not yet committed (the commit rule): the step a trainer is writing
        now, or one a writer that died left behind (a resume replaces it)."""
        return self._listing()[1]

    def step(self, k: int | None = None) -> StepRecord:
        """The recorded step ``k`` (default: the last committed one); a step being written, or a missing or
        unreadable file, is an error naming it."""
        from ppolab.errors import FileFormatError, MissingFileError, NoSuchStep, whole_argument

        if k is not None:  # "1", 1.0 or 2**70: one line naming the argument, not a KeyError of a string
            k = whole_argument("step", k, None, "a recorded step's number")
        steps, pending = self._listing()
        if not steps:
            raise FileNotFoundError(self.no_steps())
        k = steps[-1] if k is None else k
        if k not in steps:
            if k in pending:
                from ppolab.errors import StepNotCommitted

                raise StepNotCommitted(f"step {k} of {self.path} is being written (its files are on disk, its "
                                       "metrics row is not in metrics.jsonl yet): open it once it lands — "
                                       f"committed steps: {steps}")
            raise NoSuchStep(f"step {k} was not recorded in {self.path}; recorded steps: {steps}")
        if k not in self._cache:
            base = self.path / "steps" / STEP_FILE.format(k)
            tensors_file, info_file = base.with_suffix(".safetensors"), base.with_suffix(".json")
            for f in (tensors_file, info_file):
                if not f.exists():
                    raise MissingFileError(f"{f} is missing, so step {k} is only half recorded; open another step "
                                           f"(recorded: {steps}) or {_REDO}")
                regular_file(f)  # a folder, a pipe or a device there: named as such, never read
            for _ in range(3):  # the pair of one version: the .json read while the mapped file was still in place
                try:
                    tensors = LazyTensors(tensors_file)
                except Exception as e:  # a truncated or foreign file
                    raise FileFormatError(f"{tensors_file} is not a complete safetensors file ({e}); open another "
                                          f"step (recorded: {steps}) or {_REDO}") from None
                info_stamp = file_stamp(info_file)
                info = read_json(info_file)
                if not isinstance(info, dict):
                    raise FileFormatError(f"{info_file} holds a JSON {_json_kind(info)}, not the object of texts "
                                          f"and plan the recorder writes; open another step (recorded: {steps}) or "
                                          f"{_REDO}")
                if tensors._stamp() == tensors.version:  # the .json read while this tensors file was in place
                    break
            else:  # replaced three times while being opened: say so rather than pair two versions
                raise FileFormatError(f"step {k} of {self.path} was rewritten while it was being opened (a resumed "
                                      "run recording it again): open it again in a moment")
            _check_record(k, tensors, info, tensors_file, info_file, steps)
            try:
                info = RecordInfo(info, info_file)
            except RecursionError:  # wrapped level by level: a file nested as deep as json parses is no record
                raise FileFormatError(f"{info_file} is nested deeper than a step record (an object of texts and "
                                      f"plan a few levels deep); {_REDO}") from None
            self._cache[k] = StepRecord(k, tensors, info, (tensors_file, info_file),
                                        (tensors.version, tensors._size, info_stamp), config_of=self.ppo_config)
        return self._cache[k]

    def tokenizer(self) -> Any:
        """The tokenizer the run was trained with, from its ``tokenizer/`` folder — never another model's. A run
        recorded before runs carried their tokenizer is a :class:`ppolab.errors.MissingFileError` saying so."""
        from ppolab.errors import MissingFileError
        from ppolab.models import load_tokenizer_files

        if self._tokenizer is None:
            folder = self.path / TOKENIZER_DIR
            recorded = (self.info.get("fingerprints") or {}).get(TOKENIZER_DIR)
            if not folder.is_dir() and (recorded is not None or folder.is_symlink() or folder.exists()):
                what = ("a file" if folder.is_file() else "a link that leads to no folder (or loops)"
                        if folder.is_symlink() else "missing" if not folder.exists() else "not a folder")
                model = self.config.get("actor_rollout_ref", {}).get("model", {}).get("path", "?")
                raise MissingFileError(f"{folder} is {what}, where the run keeps the tokenizer files it was trained "
                                       f"with (recorded in config.json; its base model was {model}): put back the "
                                       f"run's own {TOKENIZER_DIR}/ folder, or {_REDO}")
            if not folder.is_dir():
                model = self.config.get("actor_rollout_ref", {}).get("model", {}).get("path", "?")
                raise MissingFileError(f"{self.path} has no {TOKENIZER_DIR}/ folder (recorded before runs carried the "
                                       f"tokenizer they were trained with; it was {model}): copy that model's "
                                       f"tokenizer files into {folder}, or {_REDO}")
            from ppolab.errors import FileFormatError
            from ppolab.rundir import folder_fingerprint

            expected = (self.info.get("fingerprints") or {}).get(TOKENIZER_DIR)
            found = folder_fingerprint(folder)
            if expected is not None and found != expected:
                extra = _extra_file(folder, expected)
                if extra is not None:  # the recorded files are all there and whole; one more was put beside them
                    raise FileFormatError(f"{folder / extra} is not one of the tokenizer files the run was recorded "
                                          f"with (without it the folder's fingerprint is the recorded {expected}): "
                                          "move it out of the folder")
                raise FileFormatError(f"{folder} is not the tokenizer the run was trained with (fingerprint {found}, "
                                      f"recorded {expected}): its files were replaced or damaged, and its tokens "
                                      f"would decode to other text; put back the run's own tokenizer files, or "
                                      f"{_REDO}")
            try:
                self._tokenizer = load_tokenizer_files(folder)
            except MissingFileError as e:  # its message is a model directory's; this is the run's own folder
                why = str(e).split(";")[0].replace(f"the model directory {folder} has no tokenizer files ", "")
                raise MissingFileError(f"{folder} holds no tokenizer file that loads {why}; put back the run's own "
                                       f"tokenizer files, or {_REDO}") from None
            except FileFormatError:
                raise
            except Exception as e:  # a damaged file ends in JSONDecodeError, AttributeError, RecursionError, …
                raise FileFormatError(f"{folder}: its tokenizer files do not load ({type(e).__name__}: "
                                      f"{str(e)[:200]}); put back the run's own tokenizer files, or {_REDO}") from None
        return self._tokenizer

    def model_path(self, field: str = "actor_rollout_ref.model.path") -> Path:
        """The model directory the run's ``field`` names (default: the base model), on this machine — the one
        fingerprint rule every reader of a run's models follows (replay, exact distributions, a tokenizer's
        fallback): the recorded path when it exists, else the folder of the same name under this checkout's
        ``data/models`` (a run recorded in another clone) — in both cases only when its fingerprint equals the
        recorded one (``config.json``'s ``fingerprints``). Never a different model: otherwise a
        :class:`ppolab.errors.MissingFileError` naming the recorded path, both fingerprints and what to do."""
        from ppolab.errors import MissingFileError
        from ppolab.rundir import fingerprint, flatten

        recorded = str(flatten(self.config).get(field) or "")
        expected = (self.info.get("fingerprints") or {}).get(field)
        candidates = [Path(recorded).expanduser(), DATA / "models" / Path(recorded).name]
        found = {}
        for candidate in candidates if recorded else []:
            if (candidate / "config.json").is_file():
                found[candidate] = fingerprint(candidate)
                if expected is None and candidate == candidates[0] or found[candidate] == expected:
                    return candidate
        if not found:  # moved, renamed or deleted here, or a run trained on another machine
            why = f"not at that path (moved, renamed or deleted) nor in {DATA / 'models'}"
        else:
            where, got = next(iter(found.items()))
            why = (f"at {where} with other weights or tokenizer files (fingerprint {got}, recorded {expected}: "
                   "retrained or replaced in place)")
        raise MissingFileError(f"{self.path} was trained with {field}={recorded or '?'}, which is {why}: copy "
                               "(or move back) the model directory the run was trained with there (or into "
                               "data/models/) to replay or read full distributions")

    @property
    def resumes(self) -> list[dict[str, Any]]:
        """Each resume of the run: ``at_step`` (the checkpoint it continued from) and ``changed`` (``{key: [old,
        new]}`` of the settings that differ from then on); empty for a run trained in one go."""
        return list(self.info.get("resumes", []))

    @property
    def summary(self) -> dict[str, Any]:
        path = self.path / "summary.json"
        return read_json(path) if path.exists() else {}

    def ppo_config(self):
        """The run's config as a :class:`ppolab.config.PPOConfig` — the one way widgets, exercises and replay read
        a run's settings. Parsed once per Run; each call returns its own copy, so a caller cannot change another's."""
        import copy

        from ppolab.config import from_dict

        if self._ppo_config is None:
            from ppolab.config.schema import ConfigError
            from ppolab.errors import FileFormatError

            missing = [g for g in CONFIG_GROUPS if not isinstance(self.config.get(g), dict)]
            if missing:  # read without them, every setting of theirs would be a default: another run's numbers
                raise FileFormatError(f"{self.path / 'config.json'}: its 'config' lacks the group(s) "
                                      f"{', '.join(missing)} (the recorder writes every setting; read without them, "
                                      f"the run's settings would be the defaults); put back the run's own "
                                      f"config.json, or {_REDO}")
            key = json.dumps(self.config, sort_keys=True, default=str)
            try:
                self._ppo_config = _PPO_CONFIGS.get(key) or from_dict(self.config)
            except ConfigError as e:  # a value edited into config.json: the loader names the key, not the file
                message = str(e).removeprefix("dict: ")
                raise FileFormatError(f"{self.path / 'config.json'}: its 'config' does not load ({message}); put "
                                      f"back the recorded value, or {_REDO}") from None
            if len(_PPO_CONFIGS) >= _PPO_CONFIGS_MAX:
                _PPO_CONFIGS.pop(next(iter(_PPO_CONFIGS)))
            _PPO_CONFIGS[key] = self._ppo_config  # never handed out: each call below returns a copy
        return copy.deepcopy(self._ppo_config)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, steps recorded: {self.steps})"


#: The demo runs shipped in ``data/runs`` (``python -m ppolab.train ... trainer.run_dir=data/runs/<name>``).
SHIPPED_RUNS = {name: DATA / "runs" / name
                for name in ("grpo_tiny", "ppo_gae_tiny", "grpo_tool_tiny", "grpo_tiny_vllm_bf16", "ppo_fire_tiny",
                             "grpo_temp_tiny")}


def resolve_run(run: Run | str | os.PathLike | None = None, default: str = "grpo_tiny") -> Run:
    """A :class:`Run` from a Run, a shipped run's name (``"grpo_tiny"``, ``"ppo_fire_tiny"``, …), a path, or None
    (the shipped ``default``)."""
    if isinstance(run, Run):
        return run
    if run is None:
        run = default
    if isinstance(run, str) and run in SHIPPED_RUNS:
        return Run(SHIPPED_RUNS[run])
    return Run(run)


def load_run(path: str | os.PathLike) -> Run:
    """Open a run directory written by :class:`Recorder`, or a shipped run by its name (``load_run("grpo_tiny")``,
    from any working directory and from a wheel: :data:`SHIPPED_RUNS`) where no folder of that name is here."""
    if isinstance(path, str) and path in SHIPPED_RUNS and not Path(path).exists():
        return Run(SHIPPED_RUNS[path])
    return Run(path)
