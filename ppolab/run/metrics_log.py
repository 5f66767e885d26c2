"""``metrics.jsonl``: one JSON object a training step (verl's metric names), read line by line and checked.

The recorder rewrites the whole file and renames it into place at each step (:mod:`ppolab.run.recorder`); its
rows are the commit log of a run (a recorded step is part of the run once its row is here: :mod:`ppolab.run.reader`).
A row that does not parse, lacks a whole ``step`` or repeats one is an error naming the file and line.
"""
from __future__ import annotations

import math
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


def check_metrics_log(path: Path) -> None:
    """Every line of ``path`` parses: a torn line is reported when a run is opened, in constant memory."""
    for _ in metrics_rows(path):
        pass


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


