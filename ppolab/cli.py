"""The ``ppolab`` command: what the README does, by name.

    ppolab train [--preset P] [overrides…]   python -m ppolab.train
    ppolab labs DIR [--zh] [--no-start]       copy the course into DIR (never over a notebook you edited), then
                [-- LAB_ARGS…]                start this Python's JupyterLab there (LAB_ARGS: options for JupyterLab)
    ppolab site OUT [--labs 00,04]            tools/build_site.py: the course as a static website
    ppolab logs PATH                          python -m ppolab.verl_logs: a verl job's metrics, §15's warning signs
    ppolab doctor verl PATH [--metrics F]     python -m ppolab.doctor: a verl job's config in the chapter's arithmetic

Each subcommand hands its arguments to the module that does the work; this file only dispatches.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ppolab.course import COURSE_ROOT as REPO_ROOT, LABS  # torch-free: `ppolab train` speaks first
from ppolab.labs_copy import LabsFolderError, copy_labs, why_kept

__all__ = ["LABS", "copy_labs", "main"]  # LABS and copy_labs: re-exported, ppolab.labs_copy does the copying


def _labs(args: argparse.Namespace, lab_args: Sequence[str] = ()) -> int:
    """Copy the course into ``args.dir``, then run ``python -m jupyterlab [lab_args…] DIR`` with this interpreter:
    not ``jupyter lab``, which runs the first ``jupyter-lab`` on PATH — another environment's JupyterLab, whose
    kernel would be a Python without this ppolab. Returns JupyterLab's exit status."""
    if not args.dir.strip():  # `ppolab labs "$COURSE"` with $COURSE unset: not a wish to fill the current folder
        print("error: DIR is empty (an unset variable?): give `ppolab labs` a folder, e.g. ppolab labs ~/ppo-course",
              file=sys.stderr)
        return 1
    dest = Path(args.dir).expanduser()
    try:
        copied, same, kept = copy_labs(dest, args.zh)
    except (FileNotFoundError, LabsFolderError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{dest}: {len(copied)} notebook(s) copied, {len(same)} already there")
    for name in kept:
        print(f"  kept your {name} ({why_kept(dest / name)})")
    if args.no_start:
        return 0
    if importlib.util.find_spec("jupyterlab") is None:
        print(f"error: JupyterLab is not installed in {sys.executable}: `{sys.executable} -m pip install jupyterlab`, "
              f"or open {dest} with a JupyterLab whose kernel has ppolab", file=sys.stderr)
        return 1
    if _as_root() and not any("allow-root" in a or "allow_root" in a for a in lab_args):
        # a container or a cloud notebook runs as root, and JupyterLab then exits at once without this flag
        lab_args = [*lab_args, "--allow-root"]
        print("running as root: JupyterLab refuses to start as root without --allow-root, so ppolab passes it")
    sys.stdout.flush()  # the lines above before JupyterLab's own output when both go to one file or pipe
    lab = subprocess.Popen([sys.executable, "-m", "jupyterlab", *lab_args, str(dest)])
    try:  # `kill` of this process stops JupyterLab (and so its kernels) instead of leaving it running orphaned
        previous = signal.signal(signal.SIGTERM, lambda *_: lab.terminate())
    except ValueError:  # not the main thread: no handler
        previous = None
    try:
        while True:
            try:
                return lab.wait()
            except KeyboardInterrupt:  # JupyterLab got the Ctrl-C too: it asks to confirm, or stops; wait for it
                continue
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _site(argv: list[str]) -> int:
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_site", REPO_ROOT / "tools" / "build_site.py")
    if spec is None or not (REPO_ROOT / "tools" / "build_site.py").is_file():
        print("error: the site builder ships with a checkout of ppolab (tools/build_site.py)", file=sys.stderr)
        return 1
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="ppolab", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:8]))
    commands = ("train", "labs", "site", "logs", "doctor")
    parser.add_argument("command", choices=commands)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        parser.parse_args(argv[:1])  # prints help or names the unknown command, and exits
    command, rest = argv[0], argv[1:]
    if command == "train":  # its first line before torch and transformers load, as python -m ppolab.train says it
        print("ppolab: starting ppolab train — loading torch and transformers …", file=sys.stderr, flush=True)
        from ppolab.train import main as train_main

        return train_main(rest)
    if command == "site":
        return _site(rest)
    if command == "logs":
        from ppolab.verl_logs import main as logs_main

        return logs_main(rest)
    if command == "doctor":
        from ppolab.doctor import main as doctor_main

        return doctor_main(rest)
    labs = argparse.ArgumentParser(prog="ppolab labs", usage="ppolab labs [-h] [--zh] [--no-start] DIR [-- LAB_ARGS…]",
                                   description="copy the course into DIR and start JupyterLab",
                                   epilog="Arguments after -- go to JupyterLab as they are, e.g. "
                                          "`ppolab labs my-course -- --no-browser --port=8899`.")
    labs.add_argument("dir", help="a folder for your copy of the notebooks (made if missing)")
    labs.add_argument("--zh", action="store_true", help="the Chinese edition (labs/zh)")
    labs.add_argument("--no-start", action="store_true", help="copy only; do not start JupyterLab")
    lab_args: list[str] = []
    if "--" in rest:
        cut = rest.index("--")
        rest, lab_args = rest[:cut], rest[cut + 1:]
    return _labs(labs.parse_args(rest), lab_args)


if __name__ == "__main__":
    raise SystemExit(main())
