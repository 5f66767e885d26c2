"""A verl job's own logged metrics, read into the frame lab 15's dashboard and §15's warning signs read.

verl 0.9.1 logs a step's metrics through ``utils/tracking.py``: with ``trainer.logger=[console,file]`` its
``FileLogger`` writes one JSON object ``{"step": n, "data": {name: value, …}}`` per line to ``VERL_FILE_LOGGER_PATH``
(or ``VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``); with ``tensorboard`` its ``_TensorboardAdapter``
writes scalars under ``TENSORBOARD_DIR`` (default ``tensorboard_log/<project>/<experiment>``). The metric names are
verl's, the same ppolab logs, so the frame goes to ``ppolab.widgets.metrics_dashboard(metrics=frame)`` and to
``ppolab.numbers.metrics.warning_signs(frame)`` as a ppolab run's does.

    python -m ppolab.verl_logs PATH       # a text report: steps, metrics, §15's warning signs, unknown names
"""
from __future__ import annotations

import json
import struct
import sys
import warnings
from pathlib import Path
from typing import Any

from ppolab.course import DATA
from ppolab.errors import FileFormatError, MissingFileError, RunWarning
from ppolab.run.files import near_files
from ppolab.verl_dumps import group_statistics, is_dump_folder, read_rollout_dumps

#: The shipped example of a verl job's log: ppo_fire_tiny's metrics written by verl 0.9.1's own FileLogger
#: (tools/verl_log_example.py) — what the labs open when the learner names no log (``PPOLAB_VERL_LOG``).
EXAMPLE = DATA / "verl_logs" / "ppo_fire_tiny.jsonl"


def lab_log() -> Path:
    """The verl log a lab opens: ``$PPOLAB_VERL_LOG`` when set (a file logger JSONL or a TensorBoard folder), else
    :data:`EXAMPLE`."""
    import os

    return Path(os.environ["PPOLAB_VERL_LOG"]).expanduser() if os.environ.get("PPOLAB_VERL_LOG") else EXAMPLE


#: The largest step a log may name: the frame's index (and TensorBoard's ``Event.step``) is an int64.
MAX_STEP = 2**63 - 1
#: The report lists at most this many of the metric names ppolab has no description for, within
#: :data:`LISTED_CHARS` characters (a line stays under ~300), then counts the rest.
LISTED_NAMES = 10
LISTED_CHARS = 150
#: A name (or a step) in a message is cut to this many characters: a report line stays readable.
SHOWN_CHARS = 60


def _clip(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: What a reader expects, said in every error.
EXPECTED = ("verl's file logger JSONL (trainer.logger=[console,file]: one {\"step\": n, \"data\": {...}} per line), "
            "a TensorBoard folder (events.out.tfevents.* files, trainer.logger=[console,tensorboard]) or a rollout "
            "dump folder (trainer.rollout_data_dir: <step>.jsonl files)")


def _file_logger_rows(path: Path, notes: list[str]) -> dict[int, dict[str, Any]]:
    """step → metrics of a FileLogger JSONL, read line by line; a step logged twice (verl logs the validation
    before training at step 0 and may log a step's parts separately) merges, the later value winning. A value that
    is a JSON object or array (verl logs scalars) is skipped, with a line in ``notes`` naming it."""
    from ppolab.run.files import json_kind, json_lines

    rows: dict[int, dict[str, Any]] = {}
    skipped = 0
    for number, obj in json_lines(path, f"expected {EXPECTED}"):
        step = obj.get("step") if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), dict) or isinstance(step, bool) \
                or not isinstance(step, int):
            raise FileFormatError(f"{path}, line {number}: {json.dumps(obj)[:80]!r} is not a line of {EXPECTED}")
        if not 0 <= step <= MAX_STEP:
            raise FileFormatError(f"{path}, line {number}: step {_clip(str(step))} is out of range (a step counts "
                                  f"from 0 and fits an int64, at most {MAX_STEP}): not a line verl wrote")
        data = obj["data"]
        for key in [k for k, v in data.items() if isinstance(v, (dict, list))]:
            skipped += 1
            if skipped <= LISTED_NAMES:  # a file of them would bury the report
                notes.append(f"{path}, line {number}: {_clip(key)!r} is a JSON {json_kind(data[key])}, not a "
                             "number: skipped")
            del data[key]
        rows.setdefault(step, {}).update(data)
    if skipped > LISTED_NAMES:
        notes.append(f"{path}: … and {skipped - LISTED_NAMES:,} more values that are not numbers, skipped")
    if not rows:
        raise FileFormatError(f"{path} holds no metrics: expected {EXPECTED}")
    return rows


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        for _ in range(8):
            n = (n >> 1) ^ 0x82F63B78 if n & 1 else n >> 1
        table.append(n)
    return table


_CRC32C = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C of ``data``, rotated and offset (TensorFlow's ``crc32c::Mask``)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _damage(path: Path) -> tuple[int, int] | None:
    """Where the TFRecord framing of an event file breaks, as (whole records before it, byte offset); None when
    the file is whole. TensorBoard's reader stops at a torn or garbled record without a word — the steps after it
    vanish — so each file's framing is walked first: every record is ``length (8 bytes) · its checksum (4) · data ·
    the data's checksum (4)``. The length's checksum is checked (cheap: 8 bytes a record), the data's is left to
    TensorBoard's reader (pure Python there, and here it would read every byte twice)."""
    from ppolab.run.files import regular_file

    size = regular_file(path).stat().st_size
    records = offset = 0
    with open(path, "rb") as f:
        while offset < size:
            header = f.read(12)
            if len(header) < 12:
                return records, offset
            (length,), (check,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
            if _masked_crc32c(header[:8]) != check or offset + 12 + length + 4 > size:
                return records, offset
            offset += 12 + length + 4
            f.seek(offset)
            records += 1
    return None


def _readable_event_files(folder: Path) -> tuple[list[Path], list[str]]:
    """The event files under ``folder`` TensorBoard can read at least in part, and one line for each damaged one
    (or FileFormatError when none can be read)."""
    readable, notes = [], []
    for f in near_files(folder, "events.out.tfevents.*"):
        damage = _damage(f)
        if damage is None:
            readable.append(f)
        elif damage[0] == 0:
            notes.append(f"{f}: not a TensorBoard event file (no whole record from its first byte), skipped")
        else:
            readable.append(f)
            notes.append(f"{f}: damaged at byte {damage[1]:,}, after {damage[0]} whole record(s) (a copy cut short, "
                         "or a job still writing it): the steps before it are read, the rest skipped")
    if not readable:
        more = f" (and {len(notes) - 1} more damaged file(s))" if len(notes) > 1 else ""
        raise FileFormatError(f"{folder} holds no readable TensorBoard event file: {notes[0]}{more}; expected "
                              f"{EXPECTED}")
    return readable, notes


def _tensorboard_rows(folder: Path, files: list[Path]) -> dict[int, dict[str, Any]]:
    """step → scalars of the event files ``files`` under ``folder``, read a folder at a time by TensorBoard's own
    reader (which orders the files of a restarted job)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise MissingFileError(f"{folder} is a TensorBoard folder, and reading it needs the tensorboard package "
                               "(pip install tensorboard, or ppolab's [gpu] extra)") from None
    rows: dict[int, dict[str, Any]] = {}
    for run_dir in sorted({p.parent for p in files}):
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for event in acc.Scalars(tag):
                if not 0 <= int(event.step) <= MAX_STEP:
                    raise FileFormatError(f"{run_dir}: scalar {_clip(tag)!r} is logged at step {event.step}, and a "
                                          f"step counts from 0: not an event file verl wrote")
                rows.setdefault(int(event.step), {})[tag] = float(event.value)
    if not rows:
        raise FileFormatError(f"{folder} holds TensorBoard event files without a scalar: expected {EXPECTED}")
    return rows


def read_verl_metrics(path: str | Path):
    """A verl job's metrics as a DataFrame indexed by step (verl's names as columns; a value that is not a number
    keeps its column as objects) from ``path``: a FileLogger JSONL, or a folder holding one TensorBoard log or
    ``.jsonl`` file logs — or its rollout dumps (``trainer.rollout_data_dir``), read as per-step group statistics
    (:func:`ppolab.verl_dumps.group_statistics`). Anything else is one line naming the path and what was expected.
    A damaged TensorBoard event file beside readable ones, or a JSONL value that is an object or array, is named in a
    :class:`ppolab.errors.RunWarning` (and in ``frame.attrs["skipped"]``, one line each) and the rest is read."""
    import pandas as pd

    p = Path(path).expanduser()
    if not p.exists():
        raise MissingFileError(f"{p} does not exist: give {EXPECTED}")
    notes: list[str] = []
    if p.is_dir() and is_dump_folder(p):  # trainer.rollout_data_dir: per-step group statistics (ppolab.verl_dumps)
        frame = group_statistics(read_rollout_dumps(p))
        frame.attrs["skipped"] = []
        return frame
    if p.is_dir():
        if near_files(p, "events.out.tfevents.*"):
            files, notes = _readable_event_files(p)
            rows = _tensorboard_rows(p, files)
        else:
            logs = near_files(p, "*.jsonl")
            if len(logs) != 1:
                raise FileFormatError(f"{p} holds {'no' if not logs else len(logs)} .jsonl file(s) and no "
                                      f"TensorBoard event file: give one of them — expected {EXPECTED}")
            rows = _file_logger_rows(logs[0], notes)
    else:
        rows = _file_logger_rows(p, notes)
    frame = pd.DataFrame(list(rows.values()), index=list(rows)).sort_index()  # rows of dicts: from_dict's orient=
    # "index" gives the same frame, ~1.5x slower on a job that logs 100,000 names
    frame.index = frame.index.astype("int64")
    frame.index.name = "step"
    frame.attrs["skipped"] = notes
    for note in notes:
        warnings.warn(note, RunWarning, stacklevel=2)
    return frame


def report(path: str | Path) -> list[str]:
    """The text a learner reads about a verl job's metrics, in the notebook's language: how many steps and metrics,
    §15's warning signs (as lab 15 shows them on a ppolab run), and the metric names ppolab has no description for
    (listed, not dropped)."""
    from ppolab.i18n import tr
    from ppolab.numbers.metrics import known_meaning, sign_text, warning_signs

    with warnings.catch_warnings():  # the report says them itself, below
        warnings.simplefilter("ignore", RunWarning)
        frame = read_verl_metrics(path)
    try:  # the shipped example by its place in the project, not this machine's absolute path
        shown = Path(path).resolve().relative_to(EXAMPLE.parents[2])
    except ValueError:
        shown = path
    unknown = sorted(c for c in frame.columns if known_meaning(c) is None)
    signs = warning_signs(frame)
    lines = [tr("{path}: {n} logged steps ({first}–{last}), {m} metrics").format(
                 path=shown, n=len(frame), first=frame.index.min(), last=frame.index.max(), m=frame.shape[1]),
             tr("warning signs (chapter §15):") + (" " + tr("none found") if not signs else "")]
    lines += [f"  - {sign_text(s)}" for s in signs]
    lines += frame.attrs.get("skipped", [])  # each names its damaged file (English, as errors are)
    if unknown:  # a job may log thousands of its own names: the first few, and how many more
        listed = [_clip(unknown[0])]
        for name in unknown[1:LISTED_NAMES]:
            if len(", ".join([*listed, _clip(name)])) > LISTED_CHARS:
                break
            listed.append(_clip(name))
        names = ", ".join(listed)
        if len(unknown) > len(listed):
            names += " " + tr("… and {n} more").format(n=f"{len(unknown) - len(listed):,}")
        lines.append(tr("metrics ppolab has no description for ({n}; the dashboard shows them all the same): "
                        "{names}").format(n=f"{len(unknown):,}", names=names))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: python -m ppolab.verl_logs PATH   (PATH: {EXPECTED})", file=sys.stderr)
        return 2
    try:
        print("\n".join(report(args[0])))
    except (FileFormatError, MissingFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
