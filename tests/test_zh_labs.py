"""The Chinese labs (labs/zh) are built from the English ones by tools/build_zh_labs.py: a fresh build equals the
committed notebooks, every English markdown cell has an up-to-date translation, code cells are the English code
plus the one line that sets the language, and every exercise has a Chinese prompt and as many hints as in English."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("build_zh_labs", ROOT / "tools" / "build_zh_labs.py")
build_zh_labs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_zh_labs)

ENGLISH = build_zh_labs.english_labs()


def test_build_check_is_clean(capsys):
    code = build_zh_labs.main(["--check"])
    out = capsys.readouterr().out
    assert code == 0, out[-6000:]


@pytest.mark.parametrize("lab", sorted(ENGLISH))
def test_code_cells_are_the_english_ones_plus_the_language_line(lab):
    en = nbformat.read(ENGLISH[lab], as_version=4)
    zh_path = ROOT / "labs" / "zh" / ENGLISH[lab].name
    assert zh_path.is_file(), f"{zh_path} missing: run tools/build_zh_labs.py"
    zh = nbformat.read(zh_path, as_version=4)
    assert [(c.cell_type, c.id) for c in zh.cells] == [(c.cell_type, c.id) for c in en.cells]
    changed = [(e.source, z.source) for e, z in zip(en.cells, zh.cells)
               if e.cell_type == "code" and e.source != z.source]
    assert len(changed) == 1, f"{lab}: {len(changed)} code cells differ from English (one, the import cell, may)"
    e_lines, z_lines = changed[0][0].split("\n"), changed[0][1].split("\n")
    assert [ln for ln in z_lines if ln != build_zh_labs.LANG_LINE] == e_lines
    assert z_lines.count(build_zh_labs.LANG_LINE) == 1
    # the language is set before any check() or explorer runs: the import cell is the first cell that uses ppolab
    first_use = next(i for i, c in enumerate(zh.cells) if build_zh_labs.LANG_LINE in c.source)
    earlier = [c.source for c in zh.cells[:first_use] if c.cell_type == "code"]
    assert not any("check(" in s or "_explorer(" in s for s in earlier)


def test_every_exercise_has_a_chinese_prompt_and_as_many_hints():
    from ppolab.exercises import registry

    for ex_id, ex in registry().items():
        path = ROOT / "ppolab" / "exercises" / "zh" / f"{ex.lab}.json"
        zh = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        assert ex_id in zh, f"{ex_id}: no Chinese prompt/hints in {path.relative_to(ROOT)}"
        assert zh[ex_id]["prompt"] and len(zh[ex_id]["hints"]) == len(ex.hints), ex_id


def test_a_stale_translation_is_reported(tmp_path, monkeypatch, capsys):
    """The check fails (and shows the new English) when an English cell changed after it was translated."""
    lab = "00"
    trans = json.loads((build_zh_labs.TRANSLATIONS / f"{lab}.json").read_text(encoding="utf-8"))
    cell_id = next(iter(trans["cells"]))
    trans["cells"][cell_id]["en_sha1"] = "000000000000"
    (tmp_path / f"{lab}.json").write_text(json.dumps(trans, ensure_ascii=False), encoding="utf-8")
    monkeypatch.setattr(build_zh_labs, "TRANSLATIONS", tmp_path)
    problems: list[str] = []
    build_zh_labs.build_lab(lab, ENGLISH[lab], problems)
    assert any(cell_id in p and "stale" in p for p in problems), problems


# -- the same numbers in both editions ------------------------------------------------------------------------------
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?=st\b|nd\b|rd\b|th\b|(?![\w]))")
_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty".split())}


def numbers_of(text: str, english: bool = False) -> set[str]:
    """The numbers a text states: its digits (16, 0.07, the 16th), and in English its number words (four, all-zero)."""
    found = set(_NUMBER.findall(text))
    if english:
        found |= {_WORDS[w.lower()] for w in re.findall(r"[A-Za-z]+", text) if w.lower() in _WORDS}
    return found


@pytest.mark.parametrize("lab", sorted(build_zh_labs.english_labs()))
def test_each_translated_cell_states_the_numbers_of_its_english_cell(lab):
    en = {c.id: c.source for c in nbformat.read(build_zh_labs.english_labs()[lab], as_version=4).cells
          if c.cell_type == "markdown"}
    cells = (build_zh_labs.load_translation(lab) or {}).get("cells", {})
    bad = []
    for cid, entry in cells.items():
        if cid in en:
            missing = numbers_of(en[cid]) - numbers_of(entry["zh"])
            extra = numbers_of(entry["zh"]) - numbers_of(en[cid], english=True)
            if missing or extra:
                bad.append(f"cell {cid}: only in English {sorted(missing)}, only in Chinese {sorted(extra)}")
    assert not bad, f"lab {lab}: the editions state different numbers:\n" + "\n".join(bad)
