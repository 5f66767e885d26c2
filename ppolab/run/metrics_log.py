"""``metrics.jsonl``: one JSON object a training step (verl's metric names), read line by line and checked.

The recorder rewrites the whole file and renames it into place at each step (:mod:`ppolab.run.recorder`); its
rows are the commit log of a run (a recorded step is part of the run once its row is here: :mod:`ppolab.run.reader`).
A row that does not parse, lacks a whole ``step`` or repeats one is an error naming the file and line.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ppolab.run.files import REDO, json_lines

def metrics_rows(path: Path):
    """``(line number, row)`` of a metrics.jsonl, read line by line (a regular file only:
    :func:`ppolab.run.files.regular_file`);
    a line that does not parse is an error naming the file and line."""
    from ppolab.errors import FileFormatError

    seen: dict[int, int] = {}  # step → its line: the recorder logs each step once
    for number, row in json_lines(path, "fix or delete that line (its step's metrics are lost), or " + REDO):
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


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (:func:`metrics_rows`)."""
    return [row for _, row in metrics_rows(path)]


#: What this process has read of metrics logs, keyed by the file's resolved path and stat stamp (device, inode, size,
#: mtime): a log appended to, rewritten or replaced has another stamp and is read again. A ``Run`` is opened for
#: every check and every lab cell that names a run; without this each one parsed the whole log twice (~30 % of an
#: exercise check on a shipped run).
_CHECKED: OrderedDict[tuple, None] = OrderedDict()
_FRAMES: OrderedDict[tuple, Any] = OrderedDict()
_KEEP = 16
_LOCK = threading.Lock()


def _stamp(path: Path) -> tuple:
    st = path.stat()
    return str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _remember(store: OrderedDict, key: tuple, value: Any) -> None:
    with _LOCK:
        store[key] = value
        store.move_to_end(key)
        while len(store) > _KEEP:
            store.popitem(last=False)


def check_metrics_log(path: Path) -> None:
    """Every line of ``path`` parses: a torn line is reported when a run is opened, in constant memory (once per
    version of the file in a process)."""
    key = _stamp(path)
    if key in _CHECKED:
        return
    for _ in metrics_rows(path):
        pass
    _remember(_CHECKED, key, None)


def shared_metrics_frame(path: Path):
    """:func:`metrics_frame` of ``path``, parsed once per version of the file in this process and shared: a caller
    that changes the frame copies it first (``Run.metrics`` does)."""
    key = _stamp(path)
    with _LOCK:
        frame = _FRAMES.get(key)
    if frame is None:
        frame = metrics_frame(path)
        _remember(_FRAMES, key, frame)
    return frame


def metrics_frame(path: Path):
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
    for _, row in metrics_rows(path):
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


