"""Write data/verl_logs/ppo_fire_tiny.jsonl: the metrics of the shipped run ppo_fire_tiny, logged step by step through
verl 0.9.1's own ``FileLogger`` (``verl/utils/tracking.py``, as ``trainer.logger=[console,file]`` runs it) — the
example a lab opens as "your verl job" when no log of the learner's is given.

    pip download verl==0.9.1 --no-deps -d /tmp/verl091 && (cd /tmp/verl091 && unzip -q verl-0.9.1-py3-none-any.whl)
    .venv/bin/pip install orjson
    PYTHONPATH=/tmp/verl091 .venv/bin/python tools/verl_log_example.py

tests/parity/test_verl_logs_parity.py writes it again with verl's class and compares the bytes.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "data" / "runs" / "ppo_fire_tiny"
OUT = ROOT / "data" / "verl_logs" / "ppo_fire_tiny.jsonl"


def verl_tracking():
    """verl's ``utils/tracking.py``, loaded from its file (it imports nothing of verl's at module level)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("verl's source is not on the path: see this script's docstring")
    source = Path(list(spec.submodule_search_locations)[0]) / "utils" / "tracking.py"
    module_spec = importlib.util.spec_from_file_location("verl_tracking_0_9_1", source)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def log_run(logger, run_dir: Path = RUN, extra: dict | None = None):
    """Every logged step of ``run_dir`` through ``logger.log(data, step)`` — as verl's trainer calls it, with the
    metrics the step computed (a NaN of ppolab's frame is a metric that step did not log) — then ``finish()``."""
    from ppolab.run.reader import Run

    run = Run(run_dir)
    for step, row in run.metrics.iterrows():
        data = {k: float(v) for k, v in row.items() if not isinstance(v, str) and v == v}
        logger.log(data={**data, **(extra or {})}, step=int(step))
    logger.finish()
    return run


def write(out: Path = OUT) -> Path:
    """The example, written to ``out`` by verl's FileLogger (which takes its path from VERL_FILE_LOGGER_PATH)."""
    before = os.environ.get("VERL_FILE_LOGGER_PATH")
    os.environ["VERL_FILE_LOGGER_PATH"] = str(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        log_run(verl_tracking().FileLogger("ppolab", "ppo_fire_tiny"))
    finally:
        if before is None:
            os.environ.pop("VERL_FILE_LOGGER_PATH")
        else:
            os.environ["VERL_FILE_LOGGER_PATH"] = before
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
