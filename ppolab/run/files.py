"""The file rules of a run dir: every write atomic and with the umask's mode, every read bounded.

A file is written to ``.<name>.<random>.tmp`` in its own folder and renamed into place (:func:`atomic_write`), so a
run stopped at any moment — a learner interrupting a cell — keeps the last whole version of every file; a full disk
is one error naming the path and what to do. A reader opens only regular files of a bounded size
(:func:`regular_file`) and reads JSON lines one at a time (:func:`json_lines`). Only JSON and safetensors, never
pickle. This module imports nothing of ppolab's at module level, and torch only to write tensors.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable

#: A recorded step's files in ``steps/`` (``.safetensors`` and ``.json``) and a checkpoint's folder, by step number.
STEP_FILE = "step_{:06d}"
#: The folder of a run dir holding the tokenizer it was trained with.
TOKENIZER_DIR = "tokenizer"
#: What a reader advises for a run dir's file that is damaged (the recorder wrote it whole; something else broke it).
REDO = "re-record the run (python -m ppolab.train with a new trainer.run_dir)"


#: The largest JSON file a reader opens whole (a step's texts and plan are a few MB at a real batch).
MAX_JSON_BYTES = 256 * 2**20
#: The longest line a JSON-lines reader takes (characters): a step's metrics are a few kB on one line.
MAX_LINE_CHARS = 16 * 2**20


def regular_file(path: str | os.PathLike, limit: int | None = None,
                 todo: str = "a run's files are plain files; put the file the recorder wrote there") -> Path:
    """``path`` when it is a regular file (after links) of at most ``limit`` bytes, else
    :class:`ppolab.errors.FileFormatError` naming it: a link to ``/dev/zero``, a FIFO or a folder would be read until
    memory runs out, or block, before anything could say why."""
    import stat

    from ppolab.errors import FileFormatError, MissingFileError

    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise MissingFileError(f"{path} is missing") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a device, pipe or socket, not a file"
        raise FileFormatError(f"{path} is {kind}{' (through a link)' if path.is_symlink() else ''}: {todo}") from None
    if limit is not None and st.st_size > limit:
        raise FileFormatError(f"{path} is {st.st_size / 2**20:.0f} MB, more than the {limit / 2**20:.0f} MB a "
                              f"reader opens whole: not a file the recorder wrote") from None
    return path


def json_lines(path: str | os.PathLike, todo: str) -> Iterable[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of a JSON-lines file, read line by line from a regular file
    (:func:`regular_file`), so memory stays bounded whatever its size; a line that does not parse (a torn write, an
    edit) is :class:`ppolab.errors.FileFormatError` naming the file, the line and ``todo``. The one reader of
    metrics.jsonl and of a verl job's FileLogger file; each checks what its lines must hold."""
    from ppolab.errors import FileFormatError

    # utf-8-sig: a byte-order mark an editor put at the start is not a torn line
    with open(regular_file(path), encoding="utf-8-sig", errors="replace") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_CHARS + 1), ""), 1):
            if len(line) > MAX_LINE_CHARS:
                raise FileFormatError(f"{path}, line {number}: longer than {MAX_LINE_CHARS // 2**20} MB (a step's "
                                      f"line is a few kB), read no further: not a line ppolab or verl wrote; {todo}")
            if not line.strip():
                continue
            problem = None
            try:
                value = json.loads(line)
                problem = _lone_surrogate(line, value)
            except json.JSONDecodeError as e:
                problem = f"not valid JSON ({e.msg}), a torn or edited line"
            except (ValueError, RecursionError) as e:
                problem = _unreadable(e)
            if problem:
                raise FileFormatError(f"{path}, line {number}: {problem}; {todo}") from None
            yield number, value


def read_json(path: str | os.PathLike, todo: str = REDO) -> Any:
    """A JSON file (a regular file of at most :data:`MAX_JSON_BYTES`), or :class:`ppolab.errors.FileFormatError`
    naming it and ``todo``."""
    from ppolab.errors import FileFormatError

    path = regular_file(path, MAX_JSON_BYTES)
    try:
        text = path.read_text()
        value = json.loads(text)
        problem = _lone_surrogate(text, value)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FileFormatError(f"{path} does not parse as JSON ({e}); {todo}") from None
    except (ValueError, RecursionError) as e:
        problem = _unreadable(e)
    if problem:
        raise FileFormatError(f"{path}: {problem}; {todo}") from None
    return value


def _unreadable(e: ValueError | RecursionError) -> str:
    """Why JSON that parses cannot be read: nested past the recursion limit (json's C parser stops there) or a
    whole number past Python's digit limit for ``int()`` — neither anything ppolab or verl wrote."""
    if isinstance(e, RecursionError):
        return f"JSON nested deeper than {sys.getrecursionlimit()} levels, not a record ppolab or verl wrote"
    return f"a number Python will not read ({str(e).split(';')[0]}), not a record ppolab or verl wrote"


def _lone_surrogate(text: str, value: Any) -> str | None:
    """Why ``value`` (parsed from ``text``) is no text: a ``\\ud800`` escape with no pair decodes to a string that
    cannot be encoded, so pandas, pyarrow or a print raises far from the file. Checked only when ``text`` holds a
    surrogate escape."""
    if not re.search(r"\\u[dD][89a-fA-F]", text):
        return None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "a lone UTF-16 surrogate (an unpaired \\ud800…\\udfff escape), which is no text"
    return None


def json_kind(value: Any) -> str:
    """The JSON name of ``value``'s type: object, array, string, number, boolean, null."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


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


#: What a full disk (or quota) looks like from Python's I/O and from safetensors' Rust writer, which raises its own
#: exception type with the OS message inside.
_FULL = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122", "StorageFull")


def disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _FULL or any(t in str(e) for t in _FULL_TEXT)


def atomic_write(path: Path, write) -> None:
    """Write through ``write(tmp_path)`` then ``os.replace`` onto ``path`` (with the umask's mode, like ``open``).
    A full disk is an ``OSError(ENOSPC)`` naming the path, what is free there and what to do — the file keeps its
    last whole version."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        if disk_full(e):
            raise full_disk_error(path) from None
        raise
    os.close(fd)
    try:
        write(tmp)
        honour_umask(tmp)
        os.replace(tmp, path)
    except Exception as e:
        if disk_full(e):
            raise full_disk_error(path) from None
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def full_disk_error(path: Path) -> OSError:
    """The one error a full disk is: the path, the space free there, and what to do."""
    import shutil

    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free there"
    except OSError:
        free = "free space unknown"
    return OSError(errno.ENOSPC, f"no space left to write {path} ({free}): free space on that disk, or train into "
                                 "a trainer.run_dir on another one — the run stays whole up to its last step, and "
                                 "trainer.resume=true continues it from its latest checkpoint")


def json_safe(obj: Any) -> Any:
    """``obj`` as JSON can hold it: non-finite floats null, tensors lists, paths strings, keys strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # a tensor or an array: its numbers
        return json_safe(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON (non-finite floats become null)."""

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(json_safe(obj), f, indent=1)

    atomic_write(Path(path), write)


def write_tensors(path: str | os.PathLike, tensors: dict[str, Any],
                  metadata: dict[str, str] | None = None) -> None:
    """Atomically write tensors as safetensors (detached, contiguous, on the CPU).

    Each tensor is cloned: a batch often holds the same storage under two names (GRPO's returns are
    its advantages, rewards are scores without reward-side KL) and safetensors refuses shared memory.
    """
    from safetensors.torch import save_file

    clean = {k: v.detach().to("cpu").clone().contiguous() for k, v in tensors.items()}
    atomic_write(Path(path), lambda tmp: save_file(clean, tmp, metadata=metadata))


def file_stamp(path: Path) -> tuple[int, int, int, int, int]:
    """(device, inode, size, mtime, ctime) of ``path``: a file replaced, rewritten or copied in (``cp -p`` keeps the
    mtime, never the ctime) has another stamp."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

def leftover_temp_files(folder: Path) -> list[Path]:
    """The recorder's temporary files (``.<name>.<random>.tmp``) under ``folder``, and the ``.tokenizer.*.tmp/``
    folder of a tokenizer being saved: a process killed while writing leaves them; nothing reads them."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob(".*.tmp") if p.is_file() or p.is_dir() and not p.is_symlink()
                  and p.parent == folder and p.name.startswith(".tokenizer."))


def remove_leftovers(folder: Path) -> int:
    """Delete :func:`leftover_temp_files`; returns how many."""
    import shutil

    found = leftover_temp_files(folder)
    for p in found:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return len(found)


def describe_leftovers(paths: Iterable[Path]) -> str:
    paths = list(paths)
    return ", ".join(str(p) for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def near_files(folder: Path, pattern: str, depth: int = 3) -> list[Path]:
    """Files matching ``pattern`` in ``folder`` and up to ``depth`` − 1 folders below it — where verl puts them
    (``<root>/<project>/<experiment>.jsonl``, ``tensorboard_log/<project>/<experiment>/events…``) — never a walk of
    a whole tree someone pointed at by mistake. A file reached again through links (Hydra's and verl's ``latest``)
    counts once, by a name without a link where it has one; ``ppolab doctor verl``'s ``find_config`` counts so too."""
    found: dict[Path, Path] = {}  # real path → the name it is shown by
    real = folder.resolve()
    names = (f for d in range(depth) for f in folder.glob("/".join(["*"] * d + [pattern])) if f.is_file())
    for f in sorted(names, key=lambda f: (f.resolve() != real / f.relative_to(folder), f)):  # link-free names first
        found.setdefault(f.resolve(), f)
    return sorted(found.values())
