"""Fixtures for the real-browser tests: a headless JupyterLab server and Debian's Chromium.

The server runs on 127.0.0.1 with a random free port and token, in an isolated settings /
workspaces / runtime directory (autosave off, so running a lab in the browser never writes
outputs back into the committed notebook). It is killed in the fixture finalizer.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

SERVER_START_TIMEOUT_S = 60.0

# Candidate browser binaries, in order. PPOLAB_CHROMIUM overrides.
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    env = os.environ.get("PPOLAB_CHROMIUM")
    if env:
        path = env if Path(env).is_file() else shutil.which(env)
        if path:
            return path
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    for path in ("/usr/bin/chromium", "/usr/lib/chromium/chromium", "/snap/bin/chromium"):
        if Path(path).exists():
            return path
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LabServer:
    url: str  # http://127.0.0.1:PORT
    token: str
    root_dir: Path
    proc: subprocess.Popen
    log_path: Path

    def lab_url(self, rel_path: str) -> str:
        return f"{self.url}/lab/tree/{rel_path}?token={self.token}&reset"

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "<no log>"


def _write_lab_settings(settings_dir: Path) -> None:
    """User settings for the throwaway server: no autosave, no news/update prompt."""
    docmanager = settings_dir / "@jupyterlab" / "docmanager-extension"
    docmanager.mkdir(parents=True, exist_ok=True)
    (docmanager / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    apputils = settings_dir / "@jupyterlab" / "apputils-extension"
    apputils.mkdir(parents=True, exist_ok=True)
    (apputils / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True})
    )


def _wait_for_server(server: LabServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    status_url = f"{server.url}/api/status"
    last_err: Exception | None = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with code {server.proc.returncode}:\n{server.log_tail()}")
        req = urllib.request.Request(status_url, headers={"Authorization": f"token {server.token}"})
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    json.loads(resp.read())
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as err:
            last_err = err
        time.sleep(0.25)
    raise RuntimeError(
        f"jupyter lab did not answer {status_url} within {timeout_s:.0f} s "
        f"(last error: {last_err!r}):\n{server.log_tail()}"
    )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    # The server runs in its own process group (start_new_session) so its kernels go too.
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip(
            "no Chromium found (tried $PPOLAB_CHROMIUM, "
            + ", ".join(CHROMIUM_CANDIDATES)
            + ", /usr/bin/chromium); install it with `apt-get install -y chromium`"
        )
    return path


def lab_options(port: int, token: str, home: Path) -> list[str]:
    """The server's options: loopback only, ``port`` and ``token``, no browser, and the throwaway settings and
    workspaces under ``home`` (:func:`_write_lab_settings`)."""
    return [
        "--allow-root",
        "--no-browser",
        "--ServerApp.open_browser=False",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--LabApp.user_settings_dir={home / 'user-settings'}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}",
    ]


@contextlib.contextmanager
def running_lab(command: Callable[[list[str]], list[str]], root_dir: Path, home: Path, cwd: Path | None = None,
                env: dict[str, str] | None = None) -> Iterator[LabServer]:
    """A JupyterLab server started by ``command(options)`` (``options``: :func:`lab_options` with a free port and a
    random token), serving ``root_dir``, in its own process group, its log in ``home/jupyterlab.log``; yielded once
    ``/api/status`` answers, stopped (:func:`_stop`) on exit."""
    for d in ("user-settings", "workspaces", "runtime"):
        (home / d).mkdir(parents=True, exist_ok=True)
    _write_lab_settings(home / "user-settings")
    port = _free_port()
    token = secrets.token_hex(16)
    log_path = home / "jupyterlab.log"
    env = dict(os.environ if env is None else env)
    env["JUPYTER_RUNTIME_DIR"] = str(home / "runtime")
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command(lab_options(port, token, home)),
            cwd=cwd or root_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = LabServer(f"http://127.0.0.1:{port}", token, root_dir, proc, log_path)
    try:
        _wait_for_server(server, SERVER_START_TIMEOUT_S)
        yield server
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def start_lab():
    """:func:`running_lab`, for a test that starts its own server (``with start_lab(command, root_dir, home) as
    server``): a fixture, so test files need not import a conftest."""
    return running_lab


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory) -> LabServer:
    root_dir = Path(os.environ.get("PPOLAB_BROWSER_ROOT", REPO_ROOT)).resolve()
    home = tmp_path_factory.mktemp("jupyterlab")
    command = [sys.executable, "-m", "jupyterlab"]
    with running_lab(lambda options: [*command, *options, f"--ServerApp.root_dir={root_dir}"], root_dir, home) as srv:
        yield srv
