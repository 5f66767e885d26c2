"""The package's import graph has no circle: data flows one way (algos → … → trainer → labs' widgets), so every
module can be read, tested and replaced below the ones that use it.

Every ``import`` counts, the ones inside functions too (a lazy import hides a circle from the interpreter, not from
a reader). An edge goes to the module named: ``from ppolab.rundir import read_json`` is an edge to
``ppolab.rundir``, ``from ppolab import errors`` one to ``ppolab.errors``, ``from ppolab import train`` (a function
the package re-exports) one to the package ``ppolab`` itself.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ppolab"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module → the package modules it imports (anywhere in its code)."""
    mods = modules(root)
    top = root.name

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for name in names:
                target = owner(name) if name.split(".")[0] == top else None
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 50 and graph["ppolab.record"], "the graph was not read"
    found = circles(graph)
    assert not found, "import circles: " + "; ".join(
        " ⇄ ".join(c) + " (" + ", ".join(f"{a} → {sorted(graph[a] & set(c))}" for a in c) + ")" for c in found)


def test_the_circle_finder_finds_a_circle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n")  # a lazy, relative import
    (pkg / "c.py").write_text("import pkg.a\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert circles(graph) == [["pkg.a", "pkg.sub.b"]]


def private_imports(root: Path = PACKAGE) -> list[str]:
    """``from ppolab.X import _name`` where the importing module is not in X's own package: a private name used
    across packages (``ppolab.widgets.clip`` may take ``_box`` from ``ppolab.widgets.common``; ``ppolab.exercises``
    may not take ``_n_opt_steps`` from ``ppolab.numbers.steps``, nor ``ppolab.record`` from ``ppolab.rundir``)."""
    out = []
    for mod, path in modules(root).items():
        home = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(root.name):
                source_home = node.module.rpartition(".")[0]
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__") and (
                            source_home != home or home == root.name):
                        out.append(f"{mod}: from {node.module} import {a.name}")
    return out


def test_no_private_name_is_imported_across_packages(tmp_path):
    assert not private_imports(), private_imports()
    planted = tmp_path / "pkg"
    (planted / "a").mkdir(parents=True)
    (planted / "b").mkdir()
    for f in ("__init__.py", "a/__init__.py", "b/__init__.py", "a/x.py", "a/y.py"):
        (planted / f).write_text("")
    (planted / "a" / "y.py").write_text("from pkg.a.x import _ok\n")  # within a package: allowed
    (planted / "b" / "z.py").write_text("from pkg.a.x import _helper\n")
    assert private_imports(planted) == ["pkg.b.z: from pkg.a.x import _helper"]
