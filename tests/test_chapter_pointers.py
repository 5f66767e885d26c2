"""Every § pointer a learner reads names a section the chapter has (ppolab.chapter.SECTIONS): the package's strings
and docstrings, the Chinese table, both editions of the labs and their translations, the docs and the README."""
from __future__ import annotations

import re
from pathlib import Path

from ppolab.chapter import SECTIONS

ROOT = Path(__file__).resolve().parents[1]
#: "§4.1–4.4", "§11–§12", "§ 8": each number of a pointer or a range.
POINTER = re.compile(r"§\s?(\d+(?:\.\d+)?)(?:\s?[–-]\s?§?(\d+(?:\.\d+)?))?")


def learner_files() -> list[Path]:
    out = sorted((ROOT / "ppolab").rglob("*.py")) + sorted((ROOT / "ppolab").rglob("*.json"))
    out += sorted((ROOT / "labs").rglob("*.ipynb")) + sorted((ROOT / "labs").rglob("*.json"))
    out += sorted((ROOT / "labs").rglob("*.md")) + sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    return [p for p in out if ".ipynb_checkpoints" not in p.parts]


def unknown_pointers(text: str) -> list[str]:
    """``§N`` (with its line) of every pointer in ``text`` to a section the chapter lacks."""
    found = []
    for m in POINTER.finditer(text):
        for number in m.groups():
            if number and number not in SECTIONS:
                found.append(f"§{number} (line {text[:m.start()].count(chr(10)) + 1})")
    return found


def test_every_pointer_names_a_section_of_the_chapter():
    bad = {str(p.relative_to(ROOT)): found for p in learner_files()
           if (found := unknown_pointers(p.read_text(encoding="utf-8", errors="replace")))}
    assert not bad, f"§ pointers to sections the chapter does not have: {bad}"


def test_the_pointer_check_sees_a_planted_slip():
    assert unknown_pointers("the dual clip (§4.5)") == ["§4.5 (line 1)"]
    assert unknown_pointers("mistakes\n§16.9 the advantages are zero") == ["§16.9 (line 2)"]
    assert unknown_pointers("§4.1–4.6 and §11–§19") == ["§4.6 (line 1)", "§19 (line 1)"]
    assert not unknown_pointers("§4.1–4.4, §10.6, §16, mistake 9, §17")
