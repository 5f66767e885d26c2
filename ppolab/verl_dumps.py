"""A verl job's rollout dumps, read as per-step group statistics: how many of its prompt groups carried a learning
signal, and how its scores and response lengths were spread — what lab 15's dashboard and ``ppolab logs`` show.

With ``trainer.rollout_data_dir=DIR`` verl 0.9.1 writes every training step's trajectories to ``DIR/<step>.jsonl``,
one JSON object a trajectory: ``input`` and ``output`` (the decoded prompt and response), ``gts`` (the ground truth),
``score`` (the summed reward), ``step`` — and, from its V1 trainer (``trainer/ppo/v1/trainer_base.py::
_log_rollout_data``), ``uid``: ``{prompt uid}_{session}_{index}``, the prompt's uid before the first ``_``. The
legacy trainer (``trainer/ppo/ray_trainer.py``) writes no uid: a group is then the trajectories of one prompt text.

A group whose responses all got the same score gives every one of them a group-relative advantage of 0 (chapter §6):
the step learns nothing from it. The statistics carry ppolab's own metric names for that
(``ppolab/signal/uniform_group_frac``, ``ppolab/signal/identical_group_frac``, as a ppolab run logs them), so lab
15's warning signs read a verl job's dumps as they read a ppolab run.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from ppolab.errors import FileFormatError, MissingFileError

#: What a dump folder holds, said in every error.
EXPECTED = ("a verl rollout dump folder (trainer.rollout_data_dir: one <step>.jsonl a training step, a JSON object a "
            "trajectory with input, output, score and step)")
#: A dump file's name: the step it holds.
DUMP_NAME = re.compile(r"^(\d{1,18})\.jsonl$")
#: The keys every trajectory line must have.
REQUIRED = ("input", "output", "score")
#: A dump file larger than this is refused (one step of a real job: ~10⁴ trajectories of a few kB).
MAX_FILE_BYTES = 512 * 2**20


def dump_files(folder: str | Path) -> dict[int, Path]:
    """``{step: file}`` for the ``<step>.jsonl`` files directly in ``folder`` (none: an empty dict)."""
    p = Path(folder).expanduser()
    return {int(m.group(1)): f for f in sorted(p.iterdir()) if f.is_file() and (m := DUMP_NAME.match(f.name))}


def is_dump_folder(folder: str | Path) -> bool:
    p = Path(folder).expanduser()
    return p.is_dir() and bool(dump_files(p)) and not any(
        f.suffix == ".jsonl" and not DUMP_NAME.match(f.name) for f in p.iterdir())


def _group(row: dict[str, Any]) -> str:
    uid = row.get("uid")
    if isinstance(uid, str) and uid:
        return uid.split("_", 1)[0]
    return "input:" + str(row["input"])


def read_rollout_dumps(folder: str | Path):
    """Every trajectory of a dump folder as a DataFrame: ``step``, ``group`` (the prompt's uid, or its text),
    ``score``, ``output`` and ``output_chars``. A file or line that is not verl's dump format is one error naming
    the file, the line and what was expected."""
    import pandas as pd

    p = Path(folder).expanduser()
    if not p.exists():
        raise MissingFileError(f"{p} does not exist: give {EXPECTED}")
    if not p.is_dir() or not dump_files(p):
        raise FileFormatError(f"{p} holds no <step>.jsonl file: expected {EXPECTED}")
    rows = []
    for step, f in dump_files(p).items():
        if f.stat().st_size > MAX_FILE_BYTES:
            raise FileFormatError(f"{f} is {f.stat().st_size:,} bytes, over the {MAX_FILE_BYTES:,} a dump file may "
                                  "be: not read")
        with open(f, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as e:
                    cut = "" if line.endswith("\n") else " — the file ends mid-line: truncated, or still being written"
                    raise FileFormatError(f"{f}, line {n}: not JSON ({type(e).__name__}){cut}: expected "
                                          f"{EXPECTED}") from None
                missing = [k for k in REQUIRED if not isinstance(row, dict) or k not in row]
                if missing:
                    raise FileFormatError(f"{f}, line {n}: no {', '.join(missing)}: expected {EXPECTED}")
                score = row["score"]
                if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                    raise FileFormatError(f"{f}, line {n}: score={str(score)[:40]!r} is not a finite number")
                if "step" in row and row["step"] != step:
                    raise FileFormatError(f"{f}, line {n}: step={str(row['step'])[:20]} in a file named for step "
                                          f"{step}: a file renamed or moved from another job?")
                output = str(row["output"])
                rows.append({"step": step, "group": _group(row), "score": float(score), "output": output,
                             "output_chars": len(output)})
    if not rows:
        raise FileFormatError(f"{p}: its <step>.jsonl files hold no trajectory: expected {EXPECTED}")
    return pd.DataFrame(rows)


def group_statistics(trajectories) -> Any:
    """Per step (a DataFrame indexed by step): ``ppolab/signal/uniform_group_frac`` (groups of ≥ 2 whose scores
    are all equal: group-relative advantage 0), ``ppolab/signal/identical_group_frac`` (groups whose responses are
    the same text), ``ppolab/dump/groups``, ``ppolab/dump/trajectories``, ``ppolab/dump/group_size`` (the median),
    ``ppolab/dump/score/{mean,std,min,max}`` and ``ppolab/dump/response_chars/{mean,max}``."""
    import pandas as pd

    out = {}
    for step, t in trajectories.groupby("step"):
        sized = [g for _, g in t.groupby("group", sort=False) if len(g) > 1]
        if not sized and len(t) > 1:  # one response a prompt: the whole step is the group (as ppolab's own metric)
            sized = [t]
        row = {
            "ppolab/dump/trajectories": float(len(t)),
            "ppolab/dump/groups": float(t["group"].nunique()),
            "ppolab/dump/group_size": float(t.groupby("group").size().median()),
            "ppolab/dump/score/mean": float(t["score"].mean()),
            "ppolab/dump/score/std": float(t["score"].std(ddof=0)),
            "ppolab/dump/score/min": float(t["score"].min()),
            "ppolab/dump/score/max": float(t["score"].max()),
            "ppolab/dump/response_chars/mean": float(t["output_chars"].mean()),
            "ppolab/dump/response_chars/max": float(t["output_chars"].max()),
        }
        if sized:
            row["ppolab/signal/uniform_group_frac"] = float(sum(
                g["score"].max() - g["score"].min() <= 1e-9 for g in sized) / len(sized))
            row["ppolab/signal/identical_group_frac"] = float(sum(
                g["output"].nunique() == 1 for g in sized) / len(sized))
        out[int(step)] = row
    frame = pd.DataFrame.from_dict(out, orient="index").sort_index()
    frame.index = frame.index.astype("int64")
    frame.index.name = "step"
    return frame
