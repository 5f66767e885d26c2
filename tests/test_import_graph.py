"""The package's import graph has no circle: data flows one way (algos → … → trainer → labs' widgets), so every
module can be read, tested and replaced below the ones that use it.

Every ``import`` counts, the ones inside functions too (a lazy import hides a circle from the interpreter, not from
a reader). An edge goes to the module named: ``from ppolab.run.files import read_json`` is an edge to
``ppolab.run.files``, ``from ppolab import errors`` one to ``ppolab.errors``, ``from ppolab import train`` (a function
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
    assert len(graph) > 50 and graph["ppolab.run.reader"], "the graph was not read"
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
    may not take ``_n_opt_steps`` from ``ppolab.numbers.steps``, nor ``ppolab.numbers`` from ``ppolab.run``)."""
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


# ------------------------------------------------------------------------------------------- floors, bottom to top
#: The package's floors in the order data flows through them: a module imports only from its own floor or those
#: below (module prefixes; the longest prefix that matches decides). The trainer writes a run dir and the numbers
#: layer reads it: numbers sit below ``ppolab.train`` (which runs a whole training) and never reach it, and what
#: trains short runs for a lab (the ablations, part II's training grade) is the floor above both.
FLOORS = (
    ("foundations", ("ppolab.errors", "ppolab.course", "ppolab.i18n", "ppolab.vocab", "ppolab.rng", "ppolab.progress",
                     "ppolab.batching", "ppolab.config", "ppolab.algos", "ppolab.tokenizer", "ppolab.labs_copy",
                     "ppolab.verl_config", "ppolab.verl_versions", "ppolab.verl_dumps", "ppolab.verl_checkpoints",
                     "ppolab.run.files",
                     "ppolab.run.metrics_log", "ppolab.run.identity",
                     "ppolab.run.claim", "ppolab.run")),
    ("models, data and rollout", ("ppolab.models", "ppolab.data", "ppolab.rewards", "ppolab.tools", "ppolab.batch",
                                  "ppolab.roles", "ppolab.distributed", "ppolab.rollout", "ppolab.eval",
                                  "ppolab.sft", "ppolab.watch", "ppolab.metrics", "ppolab.chapter",
                                  "ppolab.update_plan", "ppolab.batch")),
    ("the update", ("ppolab.worker", "ppolab.run.checkpoints", "ppolab.run.step")),
    ("the trainer and its run dir", ("ppolab.trainer", "ppolab.run.recorder", "ppolab.run.reader")),
    ("numbers (reading runs)", ("ppolab.replay", "ppolab.numbers", "ppolab.verl_logs")),
    ("training a run", ("ppolab.train", "ppolab.background")),
    ("experiments (short runs for a lab)", ("ppolab.experiments",)),
    ("views and checks", ("ppolab.widgets", "ppolab.exercises", "ppolab.doctor", "ppolab.cli", "ppolab.__main__",
                          "ppolab")),
)


def floor_of(module: str) -> int:
    best, found = -1, None
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    assert found is not None, f"{module} is on no floor: add it to FLOORS"
    return found


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """``a → b`` for every import from a floor below to one above: a reader that trains, a formula that reads runs."""
    return [f"{a} ({FLOORS[floor_of(a)][0]}) → {b} ({FLOORS[floor_of(b)][0]})"
            for a in sorted(graph) for b in sorted(graph[a]) if floor_of(b) > floor_of(a)]


def test_every_import_points_down_the_floors():
    found = arrows_up(import_graph())
    assert not found, "imports running back up the floors:\n  " + "\n  ".join(found)


def test_the_floor_check_sees_a_reader_that_trains(tmp_path):
    graph = import_graph()
    assert not arrows_up(graph)
    planted = {**graph, "ppolab.numbers.kl": graph["ppolab.numbers.kl"] | {"ppolab.train"}}
    assert arrows_up(planted) == ["ppolab.numbers.kl (numbers (reading runs)) → ppolab.train (training a run)"]
