"""The Chinese edition speaks the chapter's language (issue 25).

Every zh text a learner reads — translated markdown cells, exercise prompts and hints in
`labs/zh/translations/*.json`, `labs/zh/README.md` and the Chinese values of `ppolab/i18n_zh.json` — must not
use a term form that `labs/GLOSSARY.md` lists as "not allowed", and must follow the glossary's punctuation
rules. The disallowed forms are parsed from the glossary's table, so the table and this test cannot drift.
Code spans, fenced code, LaTeX and HTML tags are exempt: they hold identifiers and formulas, not prose.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "labs" / "GLOSSARY.md"
TRANSLATIONS = ROOT / "labs" / "zh" / "translations"
I18N = ROOT / "ppolab" / "i18n_zh.json"
README = ROOT / "labs" / "zh" / "README.md"

CJK = "\u3400-\u4dbf\u4e00-\u9fff"
_CJK = f"[{CJK}]"
_NOT_ALLOWED_HEADER = "不允许"

_CODE = re.compile(
    r"```.*?```"            # fenced code
    r"|`[^`]*`"           # inline code
    r"|\$\$.*?\$\$"         # display LaTeX
    r"|\$[^$\n]+\$"         # inline LaTeX
    r"|<code>.*?</code>"    # HTML code (UI strings)
    r"|\\\(.*?\\\)",        # \( … \) LaTeX
    re.S,
)
_TAG = re.compile(r"<[^>\n]+>")
_HALF_BETWEEN = re.compile(rf"(?<={_CJK})[ \t]*([,:;()])[ \t]*(?={_CJK})")
_SPACE_BETWEEN = re.compile(rf"(?<={_CJK})[ \t]+(?={_CJK})")
_ASCII_QUOTED = re.compile(rf'"[^"\n]*{_CJK}[^"\n]*"')


def prose(text: str) -> str:
    """`text` with code spans, fenced code, LaTeX and HTML tags replaced by a neutral placeholder."""
    return _TAG.sub("", _CODE.sub(" X ", text))


def disallowed_forms(glossary: str | None = None) -> dict[str, str]:
    """{form: English term} for every form in the glossary table's "不允许" column."""
    text = GLOSSARY.read_text(encoding="utf-8") if glossary is None else glossary
    forms: dict[str, str] = {}
    col = None
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if col is None:
            if _NOT_ALLOWED_HEADER in cells:
                col = cells.index(_NOT_ALLOWED_HEADER)
            continue
        if set(cells[0]) <= set("-: ") or len(cells) <= col:
            continue
        for form in re.findall(r"`([^`]+)`", cells[col]):
            forms[form] = cells[0]
    return forms


def term_problems(text: str, forms: dict[str, str]) -> list[str]:
    """Disallowed term forms used in the prose of `text`."""
    body = prose(text)
    return [f"{form!r} (glossary: {term})" for form, term in forms.items() if form in body]


def _bracket_counts(body: str) -> tuple[int, int]:
    """(full-width open − close, half-width open − close)."""
    return body.count("（") - body.count("）"), body.count("(") - body.count(")")


def punct_problems(text: str, en: str | None = None) -> list[str]:
    """Punctuation problems in the prose of a zh `text`.

    `en` is the English source when `text` is a fragment that code concatenates with others (an i18n value):
    a fragment may then open or close as many brackets as its English does, but no more, and a fragment whose
    English is balanced must be balanced in one kind of bracket.
    """
    body = prose(text)
    out = []
    for m in _HALF_BETWEEN.finditer(body):
        out.append(f"half-width {m.group(1)!r} between Chinese characters: …{body[max(0, m.start() - 8):m.end() + 8]}…")
    for m in _SPACE_BETWEEN.finditer(body):
        out.append(f"space between Chinese characters: …{body[max(0, m.start() - 8):m.end() + 8]}…")
    for m in _ASCII_QUOTED.finditer(body):
        out.append(f"ASCII quotes around Chinese text: {m.group(0)[:40]}")
    if "「" in body or "」" in body:
        out.append("「」 quotes (use “…”)")
    full, half = _bracket_counts(body)
    if en is None or sum(_bracket_counts(prose(en))) == 0:
        if full or half:
            out.append(f"unmatched or mixed brackets (（−）= {full}, (−) = {half})")
    elif full + half != sum(_bracket_counts(prose(en))):
        out.append(f"fragment opens/closes {full + half} brackets, its English {sum(_bracket_counts(prose(en)))}")
    return out


def zh_texts() -> Iterator[tuple[str, str, str | None]]:
    """(where, zh text, English source if the text is a concatenated UI fragment) for every zh text."""
    for path in sorted(TRANSLATIONS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for cid, cell in data.get("cells", {}).items():
            yield f"{path.name} cell {cid}", cell["zh"], None
        for eid, ex in data.get("exercises", {}).items():
            if ex.get("prompt"):
                yield f"{path.name} {eid} prompt", ex["prompt"], None
            for i, hint in enumerate(ex.get("hints", [])):
                yield f"{path.name} {eid} hint {i + 1}", hint, None
    yield "labs/zh/README.md", README.read_text(encoding="utf-8"), None
    for en, zh in json.loads(I18N.read_text(encoding="utf-8")).items():
        yield f"i18n_zh.json {en[:50]!r}", zh, en


# -- the checkers themselves --------------------------------------------------------------------------------

_SAMPLE_GLOSSARY = """
| English | 中文版写法 | 不允许 | 本章计数 |
|---|---|---|---|
| advantage | advantage | `优势` | advantage 44 · 优势 0 |
| loss-side KL | loss-side KL | `损失侧`、`loss 侧` | loss-side 8 |
"""


def test_disallowed_forms_parse_the_table() -> None:
    assert disallowed_forms(_SAMPLE_GLOSSARY) == {"优势": "advantage", "损失侧": "loss-side KL",
                                                   "loss 侧": "loss-side KL"}
    real = disallowed_forms()
    for form in ("优势", "比率", "熵", "掩码", "优化步", "损失侧", "rollout 锚点", "clip 比例"):
        assert form in real, form


def test_term_checker_catches_a_planted_term() -> None:
    forms = disallowed_forms(_SAMPLE_GLOSSARY)
    assert term_problems("负优势的 token 被裁剪", forms)
    assert term_problems("先看损失侧 KL", forms)
    assert not term_problems("负 advantage 的 token 被裁剪；loss-side KL", forms)
    assert not term_problems("代码里写 `优势` 也无妨", forms)  # code spans are exempt


def test_punct_checker_catches_planted_problems() -> None:
    assert punct_problems("首次在步 12, 数值 0.9") == []  # a comma between a digit and Chinese is not flagged
    assert punct_problems("一个,两个")
    assert punct_problems("先算这个:再算那个")
    assert punct_problems("见上(第一节)")
    assert punct_problems("4/120 个 token）")  # unmatched
    assert punct_problems("（首次在步 12，0.9)")  # mixed pair
    assert punct_problems("关闭 对开启 而 两个 汉字")
    assert punct_problems('这叫"漂移"')
    assert punct_problems("这叫「漂移」")
    assert punct_problems("pg_clipfrac = 0.0333（4/120 个 token），首次在第 12 步。") == []
    assert punct_problems("负 advantage 的“漂移”，`a, b` 与 $f(x$ 不算。") == []
    # fragments concatenated by code may open what their English opens, no more
    assert punct_problems("（首次在步 ", en=" (first at step ") == []
    assert punct_problems("（首次在步（", en=" (first at step ")
    assert punct_problems("个 token）（", en=" tokens)")


# -- the zh edition -----------------------------------------------------------------------------------------

def test_zh_texts_exist() -> None:
    texts = list(zh_texts())
    assert len({w.split()[0] for w, _, _ in texts}) >= 19  # 18 labs + the UI
    assert len(texts) > 500


def test_zh_uses_only_glossary_terms() -> None:
    forms = disallowed_forms()
    bad = [f"{where}: {p}" for where, text, _ in zh_texts() for p in term_problems(text, forms)]
    assert not bad, f"{len(bad)} disallowed terms (labs/GLOSSARY.md):\n" + "\n".join(bad[:60])


def test_zh_punctuation() -> None:
    bad = [f"{where}: {p}" for where, text, en in zh_texts() for p in punct_problems(text, en)]
    assert not bad, f"{len(bad)} punctuation problems (labs/GLOSSARY.md, 标点):\n" + "\n".join(bad[:60])


@pytest.mark.parametrize("cid, bad", [("fa8dd30a", "直到第二次"), ("5ca92f18", "向前传播")])
def test_meaning_fixes_stay_fixed(cid: str, bad: str) -> None:
    for path in TRANSLATIONS.glob("*.json"):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        if cid in cells:
            assert bad not in cells[cid]["zh"]
            return
    pytest.fail(f"cell {cid} not found")
