"""``ppolab labs DIR`` from the wheel, end to end: in the fresh venv of ``tests/test_wheel.py`` (ppolab installed from a
wheel of this checkout, not editable), from a folder outside the repository, ``ppolab labs course -- <options>``
copies the course and starts JupyterLab (headless: no browser, a free port and a known token, passed after ``--``).
Headless Chromium opens ``course/04_clipped_objective.ipynb`` in it, runs every cell through the UI (Run → Run All
Cells) and waits for the kernel to go idle; then:

* every code cell ran (an execution count in its prompt: Run All stops at the first error) and no output is an error
  (no stderr output with a traceback or an ``ename:`` line);
* the lab's explorer rendered: a plotly figure (``.js-plotly-plot``) drawn, no widget front-end error;
* the server and the kernel are the venv's Python (its ``ppolab``, not the checkout's), although the test
  environment's ``jupyter-lab`` comes first on PATH;
* ``kill`` of the ``ppolab`` process stops JupyterLab and its kernel, and ``ppolab`` exits.

As the venv takes torch and friends from the test environment (``tests/wheel_env.py``), it takes JupyterLab from
there too: its assets and the widget/plotly front-end extensions live in that environment's ``share/jupyter``, which
the venv finds through ``JUPYTERLAB_DIR`` and ``JUPYTER_PATH`` (``pip install jupyterlab`` into the venv would put
them in its own). Marked ``slow`` (``-m slow``; ``.ci/run`` runs it) and ``browser``; skips, with the reason, where
Playwright or Chromium is missing. Screenshot: ``tests/browser/artifacts/labs_command_04.png``.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api", reason="Playwright is not installed: pip install -e '.[dev]' "
                    "(and apt-get install -y chromium)")

from playwright.sync_api import Error as PlaywrightError  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402
from test_lab_in_browser import (  # noqa: E402
    _WIDGET_ERRORS,
    _lab_page,
    _launch,
    _run_all_cells,
    _wait_kernel_ready,
    _wait_notebook_idle,
)
from wheel_env import clean_env  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]

LAB = "04_clipped_objective.ipynb"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
RUN_TIMEOUT_MS = 120_000  # kernel start + every cell of lab 04 on a 2-core machine
STOP_TIMEOUT_S = 30.0

# Every code cell: its prompt, whether it has source, and its stderr outputs (JupyterLab renders an error output, the
# traceback or "ename: evalue", as application/vnd.jupyter.stderr too). textContent, not innerText: a cell scrolled
# out of view (content-visibility) still counts.
_CELLS_JS = """
() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell')).map(c => ({
  prompt: (c.querySelector('.jp-InputPrompt') || {}).textContent || '',
  source: ((c.querySelector('.jp-InputArea-editor .cm-content') || {}).textContent || '').trim().length > 0,
  stderr: Array.from(c.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
    .map(o => o.textContent),
}))
"""

_PLOTLY_DRAWN_JS = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p.querySelector('.main-svg')).length
"""

_ENAME = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", re.MULTILINE)


def _processes() -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, argv) of every process readable under /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        out[int(entry)] = (int(stat.rsplit(")", 1)[1].split()[1]), [a for a in argv if a])
    return out


def _descendants(pid: int) -> dict[int, list[str]]:
    """pid -> argv of every process below ``pid`` (JupyterLab's kernels run in sessions of their own: a kill of the
    process group would miss them)."""
    procs, found, todo = _processes(), {}, [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, argv) in procs.items():
            if ppid == parent and child not in found:
                found[child] = argv
                todo.append(child)
    return found


def _one(procs: dict[int, list[str]], module: str) -> list[str]:
    """The argv of the one process in ``procs`` that runs ``python -m module``."""
    hits = [argv for argv in procs.values() if argv[1:3] == ["-m", module]]
    assert len(hits) == 1, f"expected one process running -m {module} below ppolab, found {hits} in {procs}"
    return hits[0]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has exited
    except OSError:
        return True


def test_ppolab_labs_starts_jupyterlab_and_lab_04_runs_there(wheel_venv, chromium_path, start_lab, tmp_path):
    outside = tmp_path / "elsewhere"  # pytest's temporary folder: outside the repository
    outside.mkdir()
    home = tmp_path / "jupyter"
    share = Path(sys.prefix) / "share" / "jupyter"
    env = clean_env(
        JUPYTERLAB_DIR=str(share / "lab"),
        JUPYTER_PATH=str(share),
        JUPYTER_CONFIG_DIR=str(home / "config"),  # no user config or kernels of this machine's
        JUPYTER_DATA_DIR=str(home / "data"),
        # another environment's JupyterLab first on PATH (the test's: its jupyter-lab runs its own Python, which
        # imports the checkout's ppolab): `ppolab labs` must start the venv's Python's JupyterLab all the same
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    venv_bin = str(wheel_venv / "bin")
    ppolab = wheel_venv / "bin" / "ppolab"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "labs_command_04.png"
    console_errors: list[str] = []
    procs: dict[int, list[str]] = {}
    t0 = time.monotonic()

    with start_lab(lambda options: [str(ppolab), "labs", "course", "--", *options], outside / "course", home,
                   cwd=outside, env=env) as server:
        try:
            assert (outside / "course" / LAB).is_file(), f"ppolab labs did not copy {LAB}:\n{server.log_tail()}"
            assert "notebook(s) copied" in server.log_tail(), server.log_tail()
            lab_argv = _one(_descendants(server.proc.pid), "jupyterlab")
            assert lab_argv[0].startswith(venv_bin), f"JupyterLab runs {lab_argv[0]}, not the venv's python"
            t_server = time.monotonic() - t0

            with sync_playwright() as pw:
                browser = _launch(pw, chromium_path)
                page = None
                try:
                    page = _lab_page(browser, RUN_TIMEOUT_MS, console_errors)
                    page.goto(server.lab_url(LAB), wait_until="domcontentloaded")
                    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(state="visible")
                    _wait_kernel_ready(page, server, LAB, RUN_TIMEOUT_MS)
                    procs = _descendants(server.proc.pid)
                    kernel_argv = _one(procs, "ipykernel_launcher")
                    assert kernel_argv[0].startswith(venv_bin), (
                        f"the kernel runs {kernel_argv[0]}, not the venv's python (it would not import the wheel's "
                        "ppolab)")

                    _run_all_cells(page)
                    _wait_notebook_idle(page, RUN_TIMEOUT_MS)
                    t_run = time.monotonic() - t0

                    cells = page.evaluate(_CELLS_JS)
                    assert cells, "no code cell on the page"
                    errors = [(i, text[-1500:]) for i, c in enumerate(cells) for text in c["stderr"]
                              if "Traceback" in text or _ENAME.search(text)]
                    assert not errors, f"error output(s) in {LAB} (cell index, text): {errors}"
                    not_run = [i for i, c in enumerate(cells) if c["source"] and not re.search(r"\[\d+\]", c["prompt"])]
                    assert not not_run, f"code cells that did not run (Run All stops at an error): {not_run}"
                    page.wait_for_function(_PLOTLY_DRAWN_JS, timeout=15_000)
                    body = page.locator("body").text_content() or ""
                    for msg in _WIDGET_ERRORS:
                        assert msg not in body, f"widget front-end error on the page: {msg!r}"
                    page.screenshot(path=str(screenshot))
                except BaseException:
                    if page is not None:
                        with contextlib.suppress(PlaywrightError):
                            page.screenshot(path=str(screenshot))
                    print(f"console errors: {console_errors[-10:]}\nserver log:\n{server.log_tail()}")
                    raise
                finally:
                    browser.close()

            # `kill PID` of ppolab alone (not its process group): JupyterLab stops, its kernel with it, ppolab exits
            procs = procs or _descendants(server.proc.pid)
            os.kill(server.proc.pid, signal.SIGTERM)
            rc = server.proc.wait(timeout=STOP_TIMEOUT_S)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while time.monotonic() < deadline and not all(_gone(pid) for pid in procs):
                time.sleep(0.2)
            left = {pid: argv for pid, argv in procs.items() if not _gone(pid)}
            assert not left, f"still running after ppolab was killed: {left}\n{server.log_tail()}"
            assert rc == 0, f"ppolab labs exited {rc} after SIGTERM:\n{server.log_tail()}"
            assert "Shutting down" in server.log_tail(), server.log_tail()
        finally:
            for pid in procs:  # nothing of this test's left running, whatever failed (start_lab kills the group)
                if not _gone(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    print(f"ppolab labs: server up in {t_server:.1f} s, lab 04 run in {t_run - t_server:.1f} s, "
          f"total {time.monotonic() - t0:.1f} s; screenshot {screenshot}")
