"""Execute lab notebooks and keep only the outputs nbval checks.

    python tools/lab_outputs.py labs/*.ipynb

Every cell whose first line is ``# NBVAL_CHECK_OUTPUT`` keeps its text output (stream and text/plain
results) and its execution count, so ``pytest --nbval-lax`` compares a fresh run against it; every other
output — widgets, plotly bundles of megabytes — is dropped, and widget state is not saved.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

MARK = "# NBVAL_CHECK_OUTPUT"


def _text_only(outputs: list) -> list:
    kept = []
    for out in outputs:
        if out.get("output_type") == "stream":
            kept.append(out)
        elif out.get("output_type") == "execute_result" and "text/plain" in out.get("data", {}):
            out["data"] = {"text/plain": out["data"]["text/plain"]}
            out["metadata"] = {}
            kept.append(out)
        elif out.get("output_type") == "error":
            raise RuntimeError(f"a checked cell raised: {out.get('ename')}: {out.get('evalue')}")
    return kept


def refresh(path: Path, timeout: int = 300) -> int:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    checked = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if cell.source.lstrip().startswith(MARK):
            cell.outputs = _text_only(cell.outputs)
            checked += 1
        else:
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return checked


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {refresh(Path(name))} checked cells kept")
