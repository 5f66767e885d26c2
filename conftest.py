"""Repository-wide pytest setup.

pyproject's addopts pass ``--nbval-sanitize-with=tests/nbval_sanitize.cfg``; nbval opens that
path relative to the working directory, so resolve it against the repository root to let
pytest run from anywhere (``cd labs && python -m pytest 04_clipped_objective.ipynb``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


#: Start-up code for every process the tests start (tests/kernel_env/sitecustomize.py: it spares each notebook kernel
#: a 2.5 s import no test uses). Set at import, before pytest-xdist starts its workers, so they and their children
#: inherit it; a PYTHONPATH the user set comes after it.
KERNEL_ENV = Path(__file__).resolve().parent / "tests" / "kernel_env"
if str(KERNEL_ENV) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(KERNEL_ENV), os.environ.get("PYTHONPATH")]))

#: Most pytest-xdist workers ``-n auto`` starts: each holds torch, a model and a notebook kernel (about 1.5 GB).
MAX_WORKERS = 4


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker a core, at most :data:`MAX_WORKERS`; one core runs in this process (no workers)."""
    cores = usable_cores()
    return 0 if cores < 2 else min(cores, MAX_WORKERS)


def pytest_configure(config):
    opt = getattr(config.option, "nbval_sanitize_with", None)
    if opt and not Path(opt).is_absolute() and not Path(opt).exists():
        candidate = Path(config.rootpath) / opt
        if candidate.exists():
            config.option.nbval_sanitize_with = str(candidate)
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1 and not hasattr(config, "workerinput"):
        # Each worker (and the kernels and ranks it starts) gets its share of the cores: torch's default of a thread
        # a core in every worker made two workers spend 46 % more CPU time than one process for a 20 % shorter run.
        # Set before the workers start, so they and their children inherit it; a value the user set is kept.
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // workers)))


def machine_lines() -> list[str]:
    """The machine, so a failure on another CPU can be read: floating-point results of recomputations depend on
    the CPU's vector unit, the BLAS code path and the thread count."""
    import platform

    lines = []
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        model = platform.processor() or "?"
    lines.append(f"cpu: {model} | {os.cpu_count()} logical cores | {platform.machine()}")
    try:
        import torch

        lines.append(f"torch {torch.__version__}: capability {torch.backends.cpu.get_cpu_capability()}, "
                     f"{torch.get_num_threads()} intra-op / {torch.get_num_interop_threads()} inter-op threads, "
                     f"mkl {torch.backends.mkl.is_available()}, mkldnn {torch.backends.mkldnn.is_available()}")
    except Exception as exc:  # noqa: BLE001 — a header must never stop the run
        lines.append(f"torch: not importable ({exc})")
    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR", "ATEN_CPU_CAPABILITY",
                                      "MKL_ENABLE_INSTRUCTIONS") if k in os.environ}
    lines.append(f"numeric env: {env or 'defaults'}")
    return lines


def pytest_sessionstart(session):
    # written even under -q (a report header is not)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for line in machine_lines():
            reporter.write_line(line)


#: The Chinese labs the README command runs under nbval, a smoke test of the zh edition (its widgets' Chinese UI and
#: the capstone's Chinese report). The zh notebooks share every code cell with the English ones, so the others are
#: ``slow``: ``.ci/run`` runs all eighteen after the README command.
ZH_DEFAULT_LABS = ("04_clipped_objective.ipynb", "17_capstone_one_step.ipynb")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Under ``--dist loadgroup`` every test marked with a group carries it in its node id (pytest-xdist appends
    ``@group`` after our collection hook marks it). Without it a notebook's cells would be split over workers, each
    cell running in a kernel that never ran the ones before: stop with the reason instead of a wall of NameErrors."""
    if not (hasattr(session.config, "workerinput") and session.config.getoption("loadgroup", False)):
        return
    ungrouped = [item.nodeid for item in session.items
                 if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if ungrouped:
        import xdist

        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__}: --dist loadgroup did not group "
            f"{len(ungrouped)} tests (first: {ungrouped[0]}); install the versions pyproject's dev extra allows "
            f"(pip install -e '.[dev]'), or run with -n 0")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection reads the markers
def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (long matrices: every estimator, two-rank runs, resolving the GPU extra, the Chinese
    labs but :data:`ZH_DEFAULT_LABS`) are skipped unless the marker expression names them (``-m slow``; ``.ci/run``
    runs them after the README command).

    With ``PPOLAB_RUN`` set every lab opens on that run, so the saved outputs of the cells marked
    ``# NBVAL_CHECK_OUTPUT`` (numbers of the lab's own shipped run) cannot match: every cell is lax then — it must
    still run without error."""
    for item in items:
        path = Path(str(getattr(item, "path", "")))
        if path.suffix == ".ipynb" and path.parent.name == "zh" and path.name not in ZH_DEFAULT_LABS:
            item.add_marker(pytest.mark.slow)
        # pytest-xdist (--dist loadgroup): a file's tests run on one worker — a notebook's cells share one kernel, a
        # module's fixtures are built once — but the cases of a `spread` matrix stay ungrouped: loadgroup schedules
        # an ungrouped test on its own.
        if not (item.get_closest_marker("xdist_group") or item.get_closest_marker("spread")):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    if "slow" not in (config.getoption("markexpr") or ""):
        skip = pytest.mark.skip(reason="slow: select it with -m slow (.ci/run does)")
        for item in items:
            if item.get_closest_marker("slow"):
                item.add_marker(skip)
    # The longest cases first (pytest-xdist hands out cases in this order, each to the next free worker): a case that
    # mostly waits (pip's resolver) overlaps the CPU-bound ones, and the realistic-shape labs (~3 min each) do not end
    # the session on one worker while the other idles. A stable sort: the rest keep their order.
    items.sort(key=lambda item: 0 if item.get_closest_marker("waits") else 1 if item.get_closest_marker("realistic")
               else 2)
    if not os.environ.get("PPOLAB_RUN"):
        return
    for item in items:
        options = getattr(item, "options", None)
        if isinstance(options, dict) and "check" in options and hasattr(item, "cell"):
            options["check"] = False
