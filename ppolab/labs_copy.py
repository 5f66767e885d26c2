"""``ppolab labs DIR``'s copy: the course's notebooks into a learner's folder, writing only what it makes.

DIR is the learner's: whatever sits at a notebook's name there — their edited copy, a link (to a drive not mounted
now, say), a folder — is theirs and is kept, never followed, never replaced. Each notebook is written to a temporary
of its own (a name no one can guess, created exclusively and never through a link), then published under its name
with ``os.link``, which fails rather than replace anything that appeared there meanwhile. A DIR that cannot hold the
notebooks is one line naming it and what to do (:class:`LabsFolderError`).
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from ppolab.course import LABS

#: Where hard links are missing (FAT/exFAT drives, some network shares) ``os.link`` fails with one of these.
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}
#: A notebook larger than this is not the course's (it ships < 1 MiB); it is only read in chunks anyway.
_CHUNK = 1 << 20


class LabsFolderError(Exception):
    """DIR cannot hold the course: the message is one line naming DIR and what to do."""


def copy_labs(dest: Path, zh: bool = False) -> tuple[list[str], list[str], list[str]]:
    """Copy the course's notebooks (``labs/`` or ``labs/zh/``) into ``dest``: (copied, already there, kept). Anything
    already at a notebook's name that is not a byte-identical regular file — the learner's edited notebook, a link,
    dangling or not, a folder — is the learner's: kept, never followed or overwritten (see :func:`why_kept`). ``dest``
    in ppolab's own labs folder is refused (:class:`LabsFolderError`)."""
    source = LABS / "zh" if zh else LABS
    if not source.is_dir():
        raise FileNotFoundError(f"{source} is not here: the labs ship with a checkout of ppolab and inside its wheel "
                                "(ppolab/_course) — reinstall ppolab, or git clone and pip install -e .")
    dest = Path(dest)
    real, own = dest.resolve(), LABS.resolve()
    if real == own or own in real.parents:
        # JupyterLab autosaves outputs into the notebooks it opens: here, the course's own (tracked in a checkout)
        raise LabsFolderError(f"{dest} {'is' if real == own else 'is inside'} ppolab's own labs folder {own}, whose "
                              "notebooks JupyterLab would save your outputs into: give `ppolab labs` another folder, "
                              "e.g. ppolab labs ~/ppo-course")
    try:
        dest.mkdir(parents=True, exist_ok=True)  # a link to a folder is fine: the learner chose that folder
    except OSError as e:
        raise LabsFolderError(_folder_problem(dest, e)) from None
    copied, same, kept = [], [], []
    for nb in sorted(source.glob("*.ipynb")):
        target = dest / nb.name
        try:
            there = os.lstat(target)
        except FileNotFoundError:
            there = None
        except OSError as e:
            raise LabsFolderError(_folder_problem(dest, e)) from None
        if there is None:
            try:
                made = _publish(nb, target)
            except OSError as e:
                raise LabsFolderError(_folder_problem(dest, e)) from None
            (copied if made else kept).append(nb.name)
        elif stat.S_ISREG(there.st_mode) and _same_bytes(nb, target):
            same.append(nb.name)
        else:
            kept.append(nb.name)
    if copied:
        _sync_folder(dest)
    return copied, same, kept


def why_kept(path: Path) -> str:
    """Why the learner's ``path`` (at a course notebook's name) was kept, for the summary line."""
    try:
        if os.path.islink(path):
            return f"a link to {os.readlink(path)}, not followed; remove the link to get the course's"
        if not os.path.isfile(path):
            return "not a regular file; move it away to get the course's"
    except OSError:
        pass
    return "it differs from the course's; delete it to get the course's again"


def _publish(nb: Path, target: Path) -> bool:
    """Write ``nb``'s bytes to ``target`` if nothing is there: False when something appeared there meanwhile (the
    learner's, kept). The temporary is ours alone (O_EXCL|O_NOFOLLOW under an unguessable name) and has the mode
    ``open`` would give, 0o666 less the umask, as every file ppolab writes."""
    fd, tmp = _temporary(target)
    renamed = False
    try:
        with os.fdopen(fd, "wb") as out, open(nb, "rb") as src:
            while chunk := src.read(_CHUNK):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, target)  # never replaces: EEXIST for anything at the name, a dangling link included
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in _NO_HARD_LINKS:
                raise
            # no hard links on this drive: a rename, after a last look (a link planted in this instant is replaced)
            if os.path.lexists(target):
                return False
            os.rename(tmp, target)
            renamed = True
        return True
    finally:
        if not renamed:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass


def _temporary(target: Path) -> tuple[int, str]:
    """A new file beside ``target`` that no one else made: ``.NAME.<random>.tmp`` (the pattern setup.py's wheel copy
    and the run dir's cleanup skip), created with O_EXCL|O_NOFOLLOW so a planted file or link is never opened."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = str(target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp"))
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name after 100 tries", str(target.parent))


def _same_bytes(nb: Path, target: Path) -> bool:
    """Whether ``target`` (a regular file when looked at) holds ``nb``'s bytes; read without following a link and
    without blocking, should it have become a FIFO since."""
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    with os.fdopen(fd, "rb") as theirs, open(nb, "rb") as ours:
        if not stat.S_ISREG(os.fstat(theirs.fileno()).st_mode):
            return False
        while True:
            a, b = ours.read(_CHUNK), theirs.read(_CHUNK)
            if a != b:
                return False
            if not a:
                return True


def _sync_folder(dest: Path) -> None:
    """fsync ``dest`` so the new names survive a crash too (best effort: not every file system can)."""
    try:
        fd = os.open(dest, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _folder_problem(dest: Path, e: OSError) -> str:
    """One line naming ``dest``, what is wrong with it and what to do."""
    code = e.errno
    shown = str(dest) if len(str(dest)) <= 400 else f"{str(dest)[:100]}…"
    if isinstance(e, FileExistsError) or code == errno.EEXIST:
        what = Path(e.filename) if e.filename else dest  # mkdir names the part of the path in the way
        where = shown if what == dest else f"{shown}: {what}"
        if os.path.islink(what):
            return (f"{where} is a link to {os.readlink(what)}, which is not a folder there now: mount it, or give "
                    "`ppolab labs` another folder")
        return f"{where} is a file, not a folder: give `ppolab labs` a folder, or a new name (it makes the folder)"
    if code == errno.ENOTDIR:
        blocker = next((p for p in [dest, *dest.parents] if p.exists() and not p.is_dir()), None)
        part = f" ({blocker} is a file)" if blocker is not None else ""
        return f"{shown}: a part of this path is a file, not a folder{part}: give `ppolab labs` another folder"
    if code == errno.ENAMETOOLONG:
        longest = max((len(os.fsencode(p)) for p in dest.parts), default=0)
        return (f"{shown}: the path is too long for the file system (255 bytes a name, the longest here has "
                f"{longest}; {len(os.fsencode(str(dest)))} bytes in all): give `ppolab labs` a shorter folder")
    if code in (errno.EACCES, errno.EPERM):
        return f"{shown} is not writable by you: give `ppolab labs` a folder of yours, or make it writable (chmod u+w)"
    if code == errno.EROFS:
        return f"{shown} is on a read-only file system: give `ppolab labs` a folder on a writable drive"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"{shown}: no space left on its drive: free some space, or give `ppolab labs` a folder elsewhere"
    return f"{shown}: {e.strerror or e}: give `ppolab labs` another folder"
