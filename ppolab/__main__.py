"""``python -m ppolab …`` is the ``ppolab`` command (ppolab/cli.py), for an environment whose scripts folder is not
on PATH."""
from ppolab.cli import main

raise SystemExit(main())
