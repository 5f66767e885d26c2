"""The wheel's venv, built once a session for every test that uses the wheel from outside the repository
(``tests/test_wheel.py``, ``tests/browser/test_labs_command.py``; the ``wheel_venv`` fixture of tests/conftest.py).

The wheel is built from this checkout and installed (not editable) into a fresh venv. The venv takes ppolab from the
wheel alone; its other packages (torch, transformers, jupyterlab, …) come from the test's own environment through a
``.pth`` line, so nothing is installed from an index. The path line does not run that environment's editable-install
hook, so no checkout can shadow the wheel (``test_wheel.py`` asserts it)."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would point the venv at the checkout (``PYTHONPATH``) or at a run
    (``PPOLAB_RUN*``), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PPOLAB_RUN", "PYTHONPATH"))}
    env.update(extra)
    return env


def run(cmd: list, cwd: Path, timeout: int = 600, env: dict[str, str] | None = None) -> str:
    """``cmd``'s stdout; fails the test with its command line and the tails of its output unless it exits 0."""
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env=clean_env() if env is None else env)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def make_wheel_venv(folder: Path) -> Path:
    """Build the wheel into ``folder/dist`` and install it into the fresh venv ``folder/venv`` (returned)."""
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", folder / "dist",
         ROOT], cwd=folder)
    wheel = next((folder / "dist").glob("ppolab-*.whl"))
    env_dir = folder / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    purelib = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=folder).strip()
    Path(purelib, "ppolab_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], cwd=folder)
    print(f"wheel {wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB")
    return env_dir


def wheel_venv(tmp_path_factory) -> Path:
    """The venv of :func:`make_wheel_venv`, made once for this session's test files and pytest-xdist workers."""
    from trained import build_once, shared_root

    return build_once(shared_root(tmp_path_factory, keep=False), "wheel-venv", make_wheel_venv) / "venv"
