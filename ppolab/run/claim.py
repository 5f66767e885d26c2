"""Which folder a run may write: the claim a training takes on its run dir before any model loads.

A run directory is a folder ppolab made: :func:`claim_run_dir` refuses a non-empty folder that is not a ppolab
run (a model directory given as ``trainer.run_dir`` would be overwritten), then takes an OS lock on
``.ppolab-run`` that it holds for the run's lifetime, so a second writer stops at once, naming the process that
holds the folder. The lock is the kernel's (``fcntl.flock``): it goes away with its process, so a claim left by a
killed process is recognised as stale (the pid it names is gone) and reported when it is taken over, never taken
silently.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ppolab.run.metrics_log import metrics_rows

#: The claim file: its presence marks a folder ppolab made; its ``flock`` marks the process writing it now.
CLAIM_FILE = ".ppolab-run"


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def is_ppolab_dir(folder: Path) -> bool:
    """Whether ``folder`` was made by ppolab: it carries the claim file, or (a run recorded before claims existed)
    its ``config.json`` is the recorder's (``{"config": …, "batch_plan": …}``)."""
    if (folder / CLAIM_FILE).is_file():
        return True
    try:
        meta = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: nested past json's limit
        return False
    return isinstance(meta, dict) and "config" in meta and "batch_plan" in meta


def _describe(entries: list[str]) -> str:
    shown = ", ".join(entries[:6]) + (f", … ({len(entries)} entries)" if len(entries) > 6 else "")
    looks = ""
    if "config.json" in entries and any(e.endswith((".safetensors", ".bin")) or e.startswith("tokenizer")
                                        for e in entries):
        looks = ": it looks like a model directory"
    elif any(e.endswith(".parquet") for e in entries):
        looks = ": it looks like a data folder"
    return shown + looks


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def read_claim(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):  # being written by its holder this very moment, or damaged
        return {}


def claim_holder(info: dict[str, Any]) -> str:
    if not info.get("pid"):
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"])) if info.get("started") else "?"
    return f"process {info['pid']} on {info.get('host', '?')} (started {started}: {info.get('command', '?')})"


class RunDirClaim:
    """The lock a training process holds on its run directory (see the module docstring). ``stale`` is the
    description of a dead process's claim that was taken over, or None."""

    def __init__(self, folder: Path, fd: int, stale: str | None, info: dict[str, Any], previous: bytes,
                 made: list[Path]):
        self.folder, self._fd, self.stale, self.info, self._previous = folder, fd, stale, info, previous
        self._made = made  # the folders the claim created (removed again when the start is refused)
        self.used = False  # set once the run wrote into the folder (the recorder exists)

    def release(self) -> None:
        """Mark the claim released and drop the lock (the file stays: it marks a folder ppolab made; removing it
        would let a waiting process lock a file nobody else sees). A claim that was never ``used`` (the start was
        refused, e.g. a resume with another config) puts back what the file said before: nothing changed."""
        if self._fd < 0:
            return
        try:
            if self.used:
                _write_claim(self._fd, {**self.info, "released": time.time()})
            elif self._made:  # a start refused in a folder it made: leave no trace
                (self.folder / CLAIM_FILE).unlink(missing_ok=True)
            else:
                os.ftruncate(self._fd, 0)
                os.pwrite(self._fd, self._previous, 0)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1
        if not self.used:
            for made in self._made:  # innermost first; a folder someone else wrote into stays
                try:
                    made.rmdir()
                except OSError:
                    break

    def __enter__(self) -> RunDirClaim:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200] if sys.argv else "python"}


def _write_claim(fd: int, info: dict[str, Any]) -> None:
    data = json.dumps(info).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def claim_run_dir(folder: str | os.PathLike) -> RunDirClaim:
    """Claim ``folder`` for one training process, before any model loads (see the module docstring).

    Creates it when missing; refuses (:class:`ppolab.errors.RunDirError`) a non-empty folder ppolab did not make,
    naming what is in it, and a folder another live process holds, naming that process. Whether the folder
    already holds a run (resume or refuse) is :func:`ppolab.run.checkpoints.resume_checkpoint`'s decision, made
    after."""
    import fcntl

    from ppolab.errors import RunDirError

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise RunDirError(f"trainer.run_dir={str(folder)!r} is a file, not a folder; give a new folder")
    entries = [e for e in _entries(folder) if e != CLAIM_FILE]
    if entries and not is_ppolab_dir(folder):
        raise RunDirError(f"trainer.run_dir={str(folder)!r} is not empty and is not a ppolab run "
                          f"({_describe(entries)}); ppolab writes runs only into a new or empty folder, or one of its "
                          "own runs — give a new trainer.run_dir; nothing in it was changed")
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / CLAIM_FILE, os.O_RDWR | os.O_CREAT, 0o666)  # the umask decides, as for every file
    except OSError as e:  # read-only, no permission, a file where a parent folder should be
        raise RunDirError(f"trainer.run_dir={str(folder)!r} cannot be written ({e.strerror or e}); give a folder "
                          "this user can write") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = read_claim(folder / CLAIM_FILE)
        os.close(fd)
        raise RunDirError(f"trainer.run_dir={str(folder)!r} is in use by {claim_holder(holder)}: two trainings never "
                          "write one run dir; wait for it to finish (then resume with trainer.resume=true) or give "
                          "another trainer.run_dir") from None
    raw = (folder / CLAIM_FILE).read_bytes()
    previous = read_claim(folder / CLAIM_FILE)
    stale = None
    if previous.get("pid") and "released" not in previous:  # its holder ended without releasing: killed
        alive = previous.get("host") == socket.gethostname() and pid_alive(int(previous["pid"]))
        stale = (f"{folder} was claimed by {claim_holder(previous)}, which ended without finishing"
                 + (" (that pid is now another process)" if alive else "") + "; taking the claim over")
    info = _me()
    _write_claim(fd, info)
    return RunDirClaim(folder, fd, stale, info, raw, made)


def new_run_dir(base: str | os.PathLike) -> Path:
    """Make and return ``base``, or ``base-2``, ``base-3``, … — the first name not taken (``mkdir`` without
    ``exist_ok`` is atomic, so two trainings started in the same second get different folders)."""
    base, k = Path(base), 1
    base.parent.mkdir(parents=True, exist_ok=True)
    while True:
        path = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            k += 1


#: What makes a directory a run directory: training into one of these without resuming would mix two runs.
#: (A ``config.json`` alone, metrics of step 0 only or a summary of 0 steps is a start stopped before step 1.)
RUN_ENTRIES = ("metrics.jsonl", "summary.json", "steps", "checkpoints")


def _run_entries(run_dir: str | os.PathLike) -> list[str]:
    """The entries of ``run_dir`` that show a training step happened there (see :data:`RUN_ENTRIES`)."""
    d = Path(run_dir)
    found = []
    if (d / "metrics.jsonl").is_file() and any(row.get("step", 0) for _, row in metrics_rows(d / "metrics.jsonl")):
        found.append("metrics.jsonl")  # step 0 alone is the validation before training
    if (d / "summary.json").is_file():
        try:
            steps = json.loads((d / "summary.json").read_text()).get("steps", 1)
        except (ValueError, AttributeError, RecursionError):  # unreadable: count it, a run may be behind it
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
