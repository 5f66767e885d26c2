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
import string
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
_DASH = re.compile(r"(?<!—)—(?!—)|[ \t]——|——[ \t]")  # the Chinese dash is ——, two em dashes, no spaces


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
    tight = _TAG.sub("", _CODE.sub("X", text))  # code as one letter, without the spaces prose() puts around it
    for m in _DASH.finditer(tight):
        out.append(f"dash (use —— without spaces): …{tight[max(0, m.start() - 8):m.end() + 8]}…")
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


# -- whole-sentence templates (i18n_zh.json keys with {field} placeholders) ----------------------------------

_FORMATTER = string.Formatter()


def placeholders(template: str) -> set[tuple[str, str, str]]:
    """{(field, conversion, spec)} of a str.format template; plotly's %{field} is not one (plotly fills it)."""
    out = set()
    for literal, field, spec, conv in _FORMATTER.parse(template):
        if field is not None and not literal.endswith("%"):
            out.add((field, conv or "", spec or ""))
    return out


def _samples(spec: str) -> tuple:
    """Sample values to fill a field whose format spec is `spec`, the likeliest first."""
    kind = spec[-1:] if spec else ""
    if kind in ("d", "n", "x", "X", "o", "b", "c"):
        return (3,)
    if kind in ("e", "E", "f", "F", "g", "G", "%"):
        return (0.0476,)
    if kind == "s":
        return ("mini-batch",)
    return (3, 0.0476, "mini-batch")


def render(template: str) -> str:
    """`template` filled with sample values derived from each field's spec (raises if none fits)."""
    values: dict[str, object] = {}
    for field, _, spec in sorted(placeholders(template)):
        name = re.split(r"[.\[]", field)[0]
        for v in _samples(spec):
            try:
                format(v, spec)
            except (ValueError, TypeError):
                continue
            values[name] = v
            break
        else:
            raise ValueError(f"no sample value fits {{{field}:{spec}}}")
    return _plotly_kept(template).format(**values).replace("\0", "%{").replace("\1", "}")


def _plotly_kept(template: str) -> str:
    """`template` with plotly's %{…} fields protected from str.format."""
    return re.sub(r"%\{([^{}]*)\}", lambda m: "\0" + m.group(1).replace("{", "").replace("}", "") + "\1", template)


def template_problems(en: str, zh: str) -> list[str]:
    """What is wrong with a zh template of the English template `en`: another placeholder set, a failure to
    render, or punctuation problems in the rendered Chinese (checked against the rendered English, so a fragment
    may still open what its English opens)."""
    if placeholders(en) != placeholders(zh):
        return [f"placeholders differ: en {sorted(placeholders(en))}, zh {sorted(placeholders(zh))}"]
    try:
        en_text, zh_text = render(en), render(zh)
    except (ValueError, KeyError, IndexError) as e:
        return [f"does not render: {e!r}"]
    return punct_problems(zh_text, en=en_text)


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
    assert punct_problems("练习 12.2 — 在纸上算") and punct_problems("练习 12.2 —— 在纸上算")
    assert punct_problems("练习 12.2——在纸上算；`a — b` 与 $x — y$ 不算") == []
    assert punct_problems("pg_clipfrac = 0.0333（4/120 个 token），首次在第 12 步。") == []
    assert punct_problems("负 advantage 的“漂移”，`a, b` 与 $f(x$ 不算。") == []
    # fragments concatenated by code may open what their English opens, no more
    assert punct_problems("（首次在步 ", en=" (first at step ") == []
    assert punct_problems("（首次在步（", en=" (first at step ")
    assert punct_problems("个 token）（", en=" tokens)")


# -- the zh edition -----------------------------------------------------------------------------------------

def test_zh_texts_exist() -> None:
    texts = list(zh_texts())
    assert len({w.split()[0] for w, _, _ in texts}) >= 20  # 19 labs + the UI
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


def test_template_checker_catches_planted_problems() -> None:
    en = "{label}: pg_clipfrac = {f:.4f} ({n}/{m} tokens)"
    assert template_problems(en, "{label}：pg_clipfrac = {f:.4f}（{n}/{m} 个 token）") == []
    assert template_problems(en, "{label}：pg_clipfrac = {f:.4f} ({n}/{m} 个 token）")  # mixed brackets
    assert template_problems(en, "{label}：pg_clipfrac = {f:.4f}（{n}/{m} 个 token")  # unmatched
    assert template_problems(en, "{label}:pg_clipfrac 为 {f:.4f}（{n}/{m} 个 token）") == []  # ':' not between CJK
    assert template_problems(en, "{label}：pg_clipfrac = {f:.3f}（{n}/{m} 个 token）")  # another spec
    assert template_problems(en, "{label}：pg_clipfrac = {f:.4f}（{n} 个 token）")  # a field lost
    assert template_problems("row {i}", "第 {i} 行") == []
    assert template_problems("{n:d} rows", "{n:d}  行") == []  # digits, not CJK, before the spaces
    assert template_problems("row {i}, position {j}", "第 {i} 行 , 位置 {j}")  # half-width comma between CJK
    assert render("row %{y}: {n:.2f}") == "row %{y}: 0.05"  # plotly's field stays for plotly


def test_templates_render_whole_in_chinese() -> None:
    table = json.loads(I18N.read_text(encoding="utf-8"))
    templates = {en: zh for en, zh in table.items() if placeholders(en) or placeholders(zh)}
    assert len(templates) >= 40  # the widgets' readouts are templates (issue 25), not f-strings
    bad = [f"{en[:70]!r}: {p}" for en, zh in templates.items() for p in template_problems(en, zh)]
    assert not bad, f"{len(bad)} template problems:\n" + "\n".join(bad[:60])


# -- no English prose inside LaTeX \text{} ----------------------------------------------------------------------

_TEXT = re.compile(r"\\text\{([^{}]*)\}")
_EN_WORD = re.compile(r"(?<![\w\\-])[A-Za-z][A-Za-z-]+(?![\w(])")  # a hyphenated name is one word


def latex_prose_problems(text: str) -> list[str]:
    r"""`\text{…}` spans of a zh text that hold English prose: two or more English words, or one word with a space
    around it that runs on into the formula (``\text{global }\Sigma``). A span with Chinese in it is Chinese prose
    (its English words are the glossary's terms, checked above); a single word is a symbol's name
    (``\text{score}_t``, ``\text{clip}``), a hyphenated one a mode's (``\text{seq-mean-token-mean: }``), and
    identifiers (``\text{ppo\_kl}``) are code."""
    out = []
    for m in _TEXT.finditer(text):
        body = m.group(1).replace(r"\_", "_")
        if re.search(_CJK, body):
            continue
        words = [w for w in _EN_WORD.findall(body) if "_" not in w]
        spaced = len(words) == 1 and body != body.strip() and not re.search(r"[:;,=]", body)
        if len(words) >= 2 or spaced:
            out.append(m.group(0))
    return out


def test_latex_prose_checker() -> None:
    assert latex_prose_problems(r"$\text{for every response token } t$") == [r"\text{for every response token }"]
    assert latex_prose_problems(r"$\text{global }\Sigma$ 与 $\text{local mini}$") == [r"\text{global }",
                                                                                      r"\text{local mini}"]
    assert latex_prose_problems(r"$\text{score}_t$、$\text{ppo\_kl}$、$\text{对每个 response token } t$") == []
    assert latex_prose_problems(r"$\text{seq-mean-token-mean: } L$") == []  # a loss_agg_mode's name


def test_no_english_prose_inside_latex_text() -> None:
    bad = [f"{where}: {p}" for where, text, _ in zh_texts() for p in latex_prose_problems(text)]
    assert not bad, f"{len(bad)} English \\text{{…}} spans:\n" + "\n".join(bad[:40])


# -- prose names each control as the Chinese UI labels it -------------------------------------------------------

WIDGETS = ROOT / "ppolab" / "widgets"


def control_labels() -> dict[str, str]:
    """{English label: Chinese label} of every widget control whose label the UI translates (``description=tr(…)``
    in ppolab/widgets, and the optimizer-step slider's default)."""
    table = json.loads(I18N.read_text(encoding="utf-8"))
    found = set()
    for path in WIDGETS.glob("*.py"):
        found |= set(re.findall(r'description=tr\("([^"]+)"\)', path.read_text(encoding="utf-8")))
    found.add("opt step")
    return {en: table[en] for en in sorted(found) if table.get(en, en) != en}


def control_name_problems(text: str, labels: dict[str, str]) -> list[str]:
    """English control labels that zh prose names as a control — in bold, in quotes, or followed by 滑块 / 按钮 /
    开关 / 下拉框 — where the Chinese UI shows its Chinese label."""
    body = prose(text)
    out = []
    for en, zh in labels.items():
        e = re.escape(en)
        if re.search(rf"\*\*{e}\*\*|“{e}”|(?<![\w-]){e}\s*(滑块|按钮|开关|下拉框|复选框)", body):
            out.append(f"{en!r} (the UI says {zh!r})")
    return out


def test_control_name_checker() -> None:
    labels = {"mistake on": "错误开启", "opt step": "optimizer step"}
    assert control_name_problems("点 **mistake on**，再移动 opt step 滑块", labels) == [
        "'mistake on' (the UI says '错误开启')", "'opt step' (the UI says 'optimizer step')"]
    assert control_name_problems("点 **错误开启**，再移动 optimizer step 滑块；`opt step` 是代码", labels) == []


def test_prose_names_controls_as_the_ui_does() -> None:
    labels = control_labels()
    assert {"mistake on", "replay every micro-batching", "stretch"} <= set(labels)
    bad = [f"{where}: {p}" for where, text, en in zh_texts() if en is None
           for p in control_name_problems(text, labels)]
    assert not bad, "\n".join(bad[:40])


# -- bold and italic render next to Chinese punctuation --------------------------------------------------------------
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)
# What is left of an emphasis marker once CommonMark has rendered the text: `**`, or a `*` touching a word on one side
_LEFT_MARKER = re.compile(r"\*\*|(?<![\s*])\*(?![\s*])|(?<=\s)\*(?=\S)|(?<=\S)\*(?=\s)")


def unrendered_emphasis(markdown: str) -> list[str]:
    """The emphasis markers CommonMark (markdown-it, as JupyterLab's renderer follows the same flanking rules) leaves
    as literal asterisks in ``markdown``: ``**加粗（注）**之后`` does not render — a closing ``**`` after a punctuation
    mark must be followed by a space or punctuation — while ``**加粗**（注）之后`` does. LaTeX and code are left out."""
    import html

    from markdown_it import MarkdownIt

    out = MarkdownIt("commonmark").render(_MATH.sub("X", markdown))
    out = re.sub(r"<code>.*?</code>|<pre>.*?</pre>", " ", out, flags=re.S)
    plain = html.unescape(re.sub(r"<[^>]+>", "", out))
    return [plain[max(0, m.start() - 16):m.end() + 16] for m in _LEFT_MARKER.finditer(plain)]


def test_emphasis_checker_catches_planted_problems() -> None:
    assert unrendered_emphasis("作为**假设（合成）**展示")
    assert unrendered_emphasis("看*这里（注）*之后")
    assert not unrendered_emphasis("作为**假设**（合成）展示，*斜体*也行；$a*b$ 与 `x**2` 不算")


@pytest.mark.parametrize("edition", ["en", "zh"])
def test_bold_and_italic_render_in_every_lab(edition: str) -> None:
    labs = ROOT / "labs" / ("zh" if edition == "zh" else "")
    bad = []
    for path in sorted(labs.glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "markdown":
                left = unrendered_emphasis("".join(cell["source"]))
                bad += [f"{path.name} cell {cell.get('id')}: …{s}…" for s in left]
    assert not bad, "emphasis markers that do not render (put the punctuation outside the markers):\n" + "\n".join(bad)
