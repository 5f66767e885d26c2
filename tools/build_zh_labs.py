"""Build the Chinese labs from the English ones and one translation file per lab.

    python tools/build_zh_labs.py            # write labs/zh/NN_*.ipynb and ppolab/exercises/zh/NN.json
    python tools/build_zh_labs.py --check    # build in memory; exit 1 listing what differs or is untranslated
    python tools/build_zh_labs.py --stub 07  # start (or top up) labs/zh/translations/07.json; no NN: every lab

The English notebook is the source of truth. A zh notebook is that notebook with

* every markdown cell's source replaced by its translation, looked up by the English cell id in
  ``labs/zh/translations/NN.json``::

      {"lab": "NN_topic.ipynb",
       "cells": {"<cell id>": {"en_sha1": "<first 12 hex of sha1(English source)>", "zh": "<markdown>"}},
       "exercises": {"NN.k": {"prompt": "...", "hints": ["...", ...]}}}

  ``en_sha1`` records which English text was translated: when the English cell changes, the entry is stale
  and ``--check`` prints the new English text for the translator;
* one line, :data:`LANG_LINE`, inserted into the lab's import cell — the first code cell with an import statement
  of ``ppolab`` (comments do not count) — right after that cell's last import statement, so the widgets and
  exercise checks built from then on speak Chinese;
* everything else copied: cell ids, code, metadata. The saved outputs of a code cell are kept from the committed
  zh notebook when its source did not change (``tools/lab_outputs.py labs/zh/NN_x.ipynb`` refreshes them),
  otherwise taken from the English notebook.

The ``exercises`` part (prompts and hints of ``ppolab/exercises/labNN.py`` in Chinese, as many hints as in
English) is written to ``ppolab/exercises/zh/NN.json``, which ``ppolab.exercises`` reads; the package never reads
``labs/``. A stub entry holds the English text; an entry without any Chinese character counts as untranslated.
"""
from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
ZH = LABS / "zh"
TRANSLATIONS = ZH / "translations"
EXERCISES_ZH = ROOT / "ppolab" / "exercises" / "zh"

# One statement would need two lines; the semicolon keeps the zh notebook exactly one line away from English.
LANG_LINE = 'from ppolab.i18n import set_language; set_language("zh")  # noqa: E702'
_CJK = re.compile(r"[\u3400-\u9fff]")
_PROSE_WORD = re.compile(r"[A-Za-z]{3,}[,.;:!?]?")


def sha(text: str) -> str:
    """The first 12 hex digits of sha1(text, utf-8): what ``en_sha1`` records."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def exercise_sha(prompt: str, hints: list[str] | tuple[str, ...]) -> str:
    """The optional ``en_sha1`` of an exercise entry: prompt and hints, one per line."""
    return sha("\n".join([prompt, *hints]))


def english_labs() -> dict[str, Path]:
    """Lab number ("00".."16") → English notebook."""
    return {p.name[:2]: p for p in sorted(LABS.glob("[0-9][0-9]_*.ipynb"))}


def untranslated(en: str, zh: str) -> bool:
    """A stub or a copy: English prose in (four plain words or more; code such as ``int(t['x'].sum())`` is
    not prose), no Chinese out."""
    return not _CJK.search(zh) and sum(bool(_PROSE_WORD.fullmatch(w)) for w in en.split()) >= 4


def language_line_at(cell_source: str) -> int | None:
    """Where :data:`LANG_LINE` goes in a code cell: the line index right after its last import statement, if the
    cell imports from ppolab (else None). After the imports, so that no import follows a statement (E402)."""
    try:
        body = ast.parse(cell_source).body
    except SyntaxError:  # a cell with IPython magics is no import cell
        return None
    imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [n.module or "" for n in imports if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in imports if isinstance(n, ast.Import) for a in n.names]
    if not any(m == "ppolab" or m.startswith("ppolab.") for m in names):
        return None
    return imports[-1].end_lineno


def with_language_line(nb: nbformat.NotebookNode) -> str:
    """Insert :data:`LANG_LINE` into ``nb``'s import cell (in place); returns that cell's id."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            i = language_line_at(cell.source)
            if i is not None:
                lines = cell.source.split("\n")
                cell.source = "\n".join(lines[:i] + [LANG_LINE] + lines[i:])
                return cell.id
    raise ValueError("no code cell imports ppolab: nowhere to set the language")


def lab_exercises(lab: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The English exercises of lab ``lab``: id → (prompt, hints)."""
    from ppolab.exercises import registry

    return {i: (ex.prompt, ex.hints) for i, ex in registry().items() if ex.lab == lab}


def load_translation(lab: str) -> dict | None:
    path = TRANSLATIONS / f"{lab}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def build_lab(lab: str, en_path: Path, problems: list[str]) -> tuple[nbformat.NotebookNode, dict]:
    """The zh notebook and the zh exercises of one lab; what is missing or stale goes to ``problems``
    (the English text stands in for it)."""
    nb = nbformat.read(en_path, as_version=4)
    trans = load_translation(lab)
    if trans is None:
        problems.append(f"{lab}: no translation file {TRANSLATIONS.relative_to(ROOT)}/{lab}.json "
                        f"(start one with tools/build_zh_labs.py --stub {lab})")
        trans = {"lab": en_path.name, "cells": {}, "exercises": {}}
    elif trans.get("lab") != en_path.name:
        problems.append(f"{lab}: translation file names lab {trans.get('lab')!r}, the English lab is {en_path.name}")
    cells = trans.get("cells", {})
    md_ids = set()
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        md_ids.add(cell.id)
        entry = cells.get(cell.id)
        if entry is None:
            problems.append(f"{lab}: markdown cell {cell.id} has no translation; English:\n{_indent(cell.source)}")
        elif entry.get("en_sha1") != sha(cell.source):
            problems.append(f"{lab}: translation of cell {cell.id} is stale (en_sha1 {entry.get('en_sha1')}, "
                            f"English now {sha(cell.source)}); English now:\n{_indent(cell.source)}")
        elif untranslated(cell.source, entry.get("zh", "")):
            problems.append(f"{lab}: cell {cell.id} is not translated yet (no Chinese in its entry)")
        else:
            cell.source = entry["zh"]
    for orphan in sorted(set(cells) - md_ids):
        problems.append(f"{lab}: translation of cell {orphan} matches no English markdown cell (delete it)")
    with_language_line(nb)

    zh_ex = {}
    given = trans.get("exercises", {})
    for ex_id, (prompt, hints) in lab_exercises(lab).items():
        entry = given.get(ex_id)
        if entry is None:
            problems.append(f"{lab}: exercise {ex_id} has no translation; English prompt:\n{_indent(prompt)}")
            continue
        zh_hints = list(entry.get("hints", []))
        if len(zh_hints) != len(hints):
            problems.append(f"{lab}: exercise {ex_id} has {len(zh_hints)} zh hints, English has {len(hints)}")
            continue
        if "en_sha1" in entry and entry["en_sha1"] != exercise_sha(prompt, hints):
            problems.append(f"{lab}: translation of exercise {ex_id} is stale; English now:\n"
                            + _indent("\n".join([prompt, *hints])))
            continue
        if any(untranslated(en, zh) for en, zh in zip([prompt, *hints], [entry.get("prompt", ""), *zh_hints])):
            problems.append(f"{lab}: exercise {ex_id} is not translated yet (no Chinese in its prompt or a hint)")
            continue
        zh_ex[ex_id] = {"prompt": entry["prompt"], "hints": zh_hints}
    for orphan in sorted(set(given) - set(lab_exercises(lab))):
        problems.append(f"{lab}: translation of exercise {orphan} matches no registered exercise (delete it)")
    return nb, zh_ex


def _indent(text: str) -> str:
    return "\n".join("    | " + line for line in text.split("\n"))


def keep_outputs(nb: nbformat.NotebookNode, old_path: Path) -> None:
    """Carry the saved outputs of unchanged code cells over from the committed zh notebook."""
    if not old_path.is_file():
        return
    old = {c.id: c for c in nbformat.read(old_path, as_version=4).cells if c.cell_type == "code"}
    for cell in nb.cells:
        prev = old.get(cell.id)
        if cell.cell_type == "code" and prev is not None and prev.source == cell.source:
            cell.outputs = copy.deepcopy(prev.outputs)
            cell.execution_count = prev.execution_count


def cells_key(nb: nbformat.NotebookNode) -> list[tuple[str, str, str]]:
    """What the up-to-date check compares: cell types, ids and sources (not outputs)."""
    return [(c.cell_type, c.id, c.source) for c in nb.cells]


def build(check: bool) -> int:
    problems: list[str] = []
    labs = english_labs()
    for lab, en_path in labs.items():
        nb, zh_ex = build_lab(lab, en_path, problems)
        out_nb, out_ex = ZH / en_path.name, EXERCISES_ZH / f"{lab}.json"
        ex_text = json.dumps(zh_ex, ensure_ascii=False, indent=1) + "\n"
        if check:
            if not out_nb.is_file():
                problems.append(f"{lab}: {out_nb.relative_to(ROOT)} is missing (run tools/build_zh_labs.py)")
            elif cells_key(nbformat.read(out_nb, as_version=4)) != cells_key(nb):
                problems.append(f"{lab}: {out_nb.relative_to(ROOT)} differs from a fresh build "
                                "(run tools/build_zh_labs.py)")
            if not out_ex.is_file() or out_ex.read_text(encoding="utf-8") != ex_text:
                problems.append(f"{lab}: {out_ex.relative_to(ROOT)} differs from a fresh build "
                                "(run tools/build_zh_labs.py)")
            continue
        keep_outputs(nb, out_nb)
        ZH.mkdir(parents=True, exist_ok=True)
        EXERCISES_ZH.mkdir(parents=True, exist_ok=True)
        text = nbformat.writes(nb)
        text += "" if text.endswith("\n") else "\n"  # as nbformat.write does
        if not out_nb.is_file() or out_nb.read_text(encoding="utf-8") != text:
            out_nb.write_text(text, encoding="utf-8")
            print(f"wrote {out_nb.relative_to(ROOT)}")
        if not out_ex.is_file() or out_ex.read_text(encoding="utf-8") != ex_text:
            out_ex.write_text(ex_text, encoding="utf-8")
            print(f"wrote {out_ex.relative_to(ROOT)}")
    names = {p.name for p in labs.values()}
    for stray in sorted(ZH.glob("*.ipynb")):
        if stray.name not in names:
            problems.append(f"{stray.relative_to(ROOT)} has no English lab (delete it)")
    for p in problems:
        print(p)
    print(f"{len(labs)} labs, {len(problems)} problem(s)")
    return 1 if problems else 0


def stub(labs_wanted: list[str]) -> None:
    """Write a translation file holding the English text, or add the entries an existing one lacks."""
    labs = english_labs()
    TRANSLATIONS.mkdir(parents=True, exist_ok=True)
    for lab in labs_wanted or sorted(labs):
        if lab not in labs:
            raise SystemExit(f"no English lab {lab}; the labs are {', '.join(labs)}")
        nb = nbformat.read(labs[lab], as_version=4)
        trans = load_translation(lab) or {"lab": labs[lab].name, "cells": {}, "exercises": {}}
        added = 0
        for cell in nb.cells:
            if cell.cell_type == "markdown" and cell.id not in trans["cells"]:
                trans["cells"][cell.id] = {"en_sha1": sha(cell.source), "zh": cell.source}
                added += 1
        for ex_id, (prompt, hints) in lab_exercises(lab).items():
            if ex_id not in trans.setdefault("exercises", {}):
                trans["exercises"][ex_id] = {"en_sha1": exercise_sha(prompt, hints), "prompt": prompt,
                                             "hints": list(hints)}
                added += 1
        path = TRANSLATIONS / f"{lab}.json"
        if added == 0 and path.is_file():
            print(f"{path.relative_to(ROOT)}: complete, left as it is")
            continue
        path.write_text(json.dumps(trans, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: {added} English entries added")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="build in memory; exit 1 if anything differs or lacks")
    ap.add_argument("--stub", nargs="*", metavar="NN", help="write/top up translation stubs (no NN: every lab)")
    args = ap.parse_args(argv)
    if args.stub is not None:
        stub(args.stub)
        return 0
    return build(args.check)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
