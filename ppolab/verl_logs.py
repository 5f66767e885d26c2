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
import sys
from pathlib import Path
from typing import Any

from ppolab.course import DATA
from ppolab.errors import FileFormatError, MissingFileError

#: The shipped example of a verl job's log: ppo_fire_tiny's metrics written by verl 0.9.1's own FileLogger
#: (tools/verl_log_example.py) — what the labs open when the learner names no log (``PPOLAB_VERL_LOG``).
EXAMPLE = DATA / "verl_logs" / "ppo_fire_tiny.jsonl"


def lab_log() -> Path:
    """The verl log a lab opens: ``$PPOLAB_VERL_LOG`` when set (a file logger JSONL or a TensorBoard folder), else
    :data:`EXAMPLE`."""
    import os

    return Path(os.environ["PPOLAB_VERL_LOG"]).expanduser() if os.environ.get("PPOLAB_VERL_LOG") else EXAMPLE


#: What a reader expects, said in every error.
EXPECTED = ("verl's file logger JSONL (trainer.logger=[console,file]: one {\"step\": n, \"data\": {...}} per line) "
            "or a TensorBoard folder (events.out.tfevents.* files, trainer.logger=[console,tensorboard])")


def _file_logger_rows(path: Path) -> dict[int, dict[str, Any]]:
    """step → metrics of a FileLogger JSONL, read line by line; a step logged twice (verl logs the validation
    before training at step 0 and may log a step's parts separately) merges, the later value winning."""
    from ppolab.rundir import json_lines

    rows: dict[int, dict[str, Any]] = {}
    for number, obj in json_lines(path, f"expected {EXPECTED}"):
        step = obj.get("step") if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), dict) or isinstance(step, bool) \
                or not isinstance(step, int):
            raise FileFormatError(f"{path}, line {number}: {json.dumps(obj)[:80]!r} is not a line of {EXPECTED}")
        rows.setdefault(step, {}).update(obj["data"])
    if not rows:
        raise FileFormatError(f"{path} holds no metrics: expected {EXPECTED}")
    return rows


def _near(folder: Path, pattern: str, depth: int = 3) -> list[Path]:
    """Files matching ``pattern`` in ``folder`` and up to ``depth`` − 1 folders below it — where verl puts them
    (``<root>/<project>/<experiment>.jsonl``, ``tensorboard_log/<project>/<experiment>/events…``) — never a walk of
    a whole tree someone pointed at by mistake."""
    return sorted(f for d in range(depth) for f in folder.glob("/".join(["*"] * d + [pattern])) if f.is_file())


def _tensorboard_rows(folder: Path) -> dict[int, dict[str, Any]]:
    """step → scalars of every event file under ``folder`` (TensorBoard's own reader)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise MissingFileError(f"{folder} is a TensorBoard folder, and reading it needs the tensorboard package "
                               "(pip install tensorboard, or ppolab's [gpu] extra)") from None
    rows: dict[int, dict[str, Any]] = {}
    for run_dir in sorted({p.parent for p in _near(folder, "events.out.tfevents.*")}):
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for event in acc.Scalars(tag):
                rows.setdefault(int(event.step), {})[tag] = float(event.value)
    if not rows:
        raise FileFormatError(f"{folder} holds TensorBoard event files without a scalar: expected {EXPECTED}")
    return rows


def read_verl_metrics(path: str | Path):
    """A verl job's metrics as a DataFrame indexed by step (verl's names as columns; a value that is not a number
    keeps its column as objects) from ``path``: a FileLogger JSONL, or a folder holding one TensorBoard log or
    ``.jsonl`` file logs. Anything else is one line naming the path and what was expected."""
    import pandas as pd

    p = Path(path).expanduser()
    if not p.exists():
        raise MissingFileError(f"{p} does not exist: give {EXPECTED}")
    if p.is_dir():
        if _near(p, "events.out.tfevents.*"):
            rows = _tensorboard_rows(p)
        else:
            logs = _near(p, "*.jsonl")
            if len(logs) != 1:
                raise FileFormatError(f"{p} holds {'no' if not logs else len(logs)} .jsonl file(s) and no "
                                      f"TensorBoard event file: give one of them — expected {EXPECTED}")
            rows = _file_logger_rows(logs[0])
    else:
        rows = _file_logger_rows(p)
    frame = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    frame.index = frame.index.astype("int64")
    frame.index.name = "step"
    return frame


def report(path: str | Path) -> list[str]:
    """The text a learner reads about a verl job's metrics, in the notebook's language: how many steps and metrics,
    §15's warning signs (as lab 15 shows them on a ppolab run), and the metric names ppolab has no description for
    (listed, not dropped)."""
    from ppolab.i18n import tr
    from ppolab.numbers.metrics import known_meaning, sign_text, warning_signs

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
    if unknown:
        lines.append(tr("metrics ppolab has no description for ({n}; the dashboard shows them all the same): "
                        "{names}").format(n=len(unknown), names=", ".join(unknown)))
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
