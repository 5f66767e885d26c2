"""Imported at start-up by every Python process the tests start (the root conftest.py puts this folder first on
``PYTHONPATH``): notebook kernels, nbval subprocesses, pytest-xdist workers, the JupyterLab server.

jsonschema (through nbformat, which plotly's FigureWidget imports) loads its optional IRI format checker,
``rfc3987_syntax``, at import; that module builds 38 Lark parsers on the spot — about 2.5 s of CPU in every kernel
that draws a widget (measured: labs 00–06 on a fresh run under nbval, 68 s with it, 50 s without; jsonschema issue
#1428). No notebook, schema or lab here checks an IRI, and jsonschema skips a checker whose module cannot be
imported, so the tests' processes go without it. A learner's kernel is untouched."""
import sys

sys.modules.setdefault("rfc3987_syntax", None)  # None in sys.modules: `import rfc3987_syntax` raises ImportError
