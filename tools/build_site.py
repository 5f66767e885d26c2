"""Build the course as a static website: every lab readable and explorable in a browser, no install, no kernel.

    python tools/build_site.py OUT                 # all 19 labs, English and Chinese, plus the landing page
    python tools/build_site.py OUT --labs 04,11    # only some labs (both languages)

Each lab notebook (``labs/NN_*.ipynb``, ``labs/zh/NN_*.ipynb``) is executed here against the shipped runs
(nbclient, this venv's kernel, the notebook's folder as working directory — as nbval runs it) and written as one
HTML page: markdown with math as MathML (``tools/site_math.py``, drawn by the browser, no CDN), highlighted code,
printed outputs, tables and every plotly figure. Widgets need a kernel, so the build's kernel shows each one as a
static snapshot of its figures and readouts, and sweeps the lab's main explorer over a small grid of its controls'
values (``EXPLORERS`` below; ``tools/site_kernel.py``): the live explorer itself recomputes every grid point through
``ppolab.numbers`` / ``ppolab.algos``, and the page switches between the stored results with a few lines of
JavaScript. plotly.js is written once (``OUT/assets/plotly.min.js``) and every page loads it from there: the site
works from ``file://`` or any plain file server and asks no other host for anything.

Exercises show their prompt and a note that checking an answer needs the live lab; the builder never reads
``labs/solutions/`` (the notebooks ship unanswered). ``OUT/build.json`` records what was built, how long it took,
each page's size and the SHA-256 of every file the build wrote.

OUT is the builder's own: it builds into a new or empty folder, or into a site it built before, and there it replaces
only the files its last build wrote and nobody changed since (build.json's hashes). Anything else in OUT — a user's
``index.html``, a page edited by hand — stops the build before it writes a byte, naming the file. build.json names
each file's new hash before the file is replaced (``_Ledger``), so a build stopped midway (Ctrl-C, a kill) is built
again by the same command. Every argument is
checked before anything is written. A lab whose kernel dies or whose execution fails is named, the others are built,
and the index marks it as failed (exit status 1).
"""
from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from site_kernel import EXERCISE_MIME, REF_MIME, SNAP_MIME  # noqa: E402
from site_math import UNKNOWN, to_mathml  # noqa: E402

#: Each lab's main explorer and the grid its page precomputes: the first widget the lab displays whose controls
#: include all of these names (an explorer's ``controls`` keys, or a hand-built box's control descriptions), and
#: for each control either the values to set or how many (options: the opening one and the first others;
#: sliders: evenly spaced over the range, on the slider's step, plus the opening value). Every combination is
#: computed, so keep the product small.
EXPLORERS: dict[str, dict[str, Any]] = {
    "00": {"metric": 100},  # every logged metric: a small figure each
    "01": {"row": 4},
    "02": {"C": [1.0, 1.2, 1.5, 2.0], "level": 2},
    "03": {"opt_step": 4, "row": 3},
    "04": {"eps_low": [0.03, 0.1, 0.2], "eps_high": [0.03, 0.1, 0.2], "opt_step": 3},
    "05": {"clip_ratio_c": [1.2, 1.5, 2.0, 3.0], "opt_step": 3},
    "06": {"entropy_coeff": 3, "kl_loss_coef": 3, "loss_agg_mode": 5},
    "07": {"temperature": [0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0]},
    "08": {"kl_type": 6, "init_kl_coef": 4},
    "09": {"cliprange_value": [0.0, 0.05, 0.1, 0.2, 0.5, 1.0], "update": 3},
    "10": {"row": 5},
    "11": {"loss": 4, "loss_scale_factor": 3},
    "12": {"rollout_n": [1, 2, 4, 8], "ppo_mini_batch_size": [4, 8, 16, 32]},
    "13": {"micro_batch_size": 4, "loss_agg_mode": 5},
    "15": {"metric": 100},
    "16": {"mistake": 9, "on": 2},
    "18": {"opt_step": 4, "term": 4},
}

PLOTLY_ASSET = "assets/plotly.min.js"
CELL_TIMEOUT_S = 600

TEXT = {
    "en": {
        "lang": "en", "other": "中文", "home": "ppolab — all labs",
        "title": "ppolab: PPO / GRPO by touching the tensors",
        "explorer": "Explorer, precomputed on this page",
        "precomputed": "This page holds the explorer's figures for {n} settings of {controls}; the other controls "
                       "stay as the lab opens them. The numbers are the ones the live explorer shows for the same "
                       "setting (each was computed by it, from the recorded run). Any other value needs the live "
                       "lab: {live}.",
        "fixed": "(fixed here)",
        "widget": "A widget, shown as it stood after this cell ran; move its controls in the live lab: {live}.",
        "exercise": "Exercise {id}",
        "exercise_note": "Checking an answer needs the live lab ({live}): write your answer in place of "
                         "<code>...</code> and run the cell; <code>check</code> computes the truth from the run and "
                         "answers with a hint.",
        "live": "JupyterLab (<code>pip install torch==2.13.0 -e \".[dev]\" &amp;&amp; jupyter lab labs/</code>)",
        "binder": " or <a href=\"{url}\">Binder</a>",
        "landing_intro": "Nineteen notebooks, one per part of the chapter. Each page below is the lab executed "
                         "against the runs shipped with the project: every figure is drawn from tensors recorded "
                         "during real training, and each lab's main explorer can be moved over a few precomputed "
                         "settings. To change anything else, run the lab: {live}.",
        "not_built": "(not built in this site)",
        "failed": "(its build failed: see build.json)",
        "built": "Built {date} in {secs:.0f} s; {size}.",
    },
    "zh": {
        "lang": "zh-Hans", "other": "English", "home": "ppolab — 全部 lab",
        "title": "ppolab：在真实张量上理解 PPO / GRPO",
        "explorer": "Explorer（本页已预先计算）",
        "precomputed": "本页存有该 explorer 在 {controls} 的 {n} 种取值组合下的图与读数；其余控件保持 lab "
                       "打开时的取值。这些数字与 live explorer 在同一设置下显示的完全相同（每一个都由它从记录的 "
                       "run 算出）。其他取值请在 live lab 中计算：{live}。",
        "fixed": "（此处固定）",
        "widget": "一个 widget，显示的是这个 cell 运行后的样子；要移动它的控件，请打开 live lab：{live}。",
        "exercise": "练习 {id}",
        "exercise_note": "检查答案需要 live lab（{live}）：把 <code>...</code> 换成你的答案并运行 cell；"
                         "<code>check</code> 会从 run 当场算出真值并给出提示。",
        "live": "JupyterLab（<code>pip install torch==2.13.0 -e \".[dev]\" &amp;&amp; jupyter lab labs/zh/</code>）",
        "binder": " 或 <a href=\"{url}\">Binder</a>",
        "landing_intro": "19 个 notebook，每个对应本章的一部分。下面每一页都是在项目自带的 run 上执行后的 lab："
                         "每张图都来自真实训练时记录的张量，每个 lab 的主 explorer 可以在几组预先计算的设置之间切换。"
                         "要改动其他任何东西，请运行 lab：{live}。",
        "not_built": "（本站未构建）",
        "failed": "（构建失败：见 build.json）",
        "built": "构建于 {date}，用时 {secs:.0f} 秒；{size}。",
    },
}


class SiteError(Exception):
    """A misuse the builder refuses before writing anything: one line naming the argument, folder or file."""


# ---------------------------------------------------------------------------------------------- labs
def lab_notebooks(labs: list[str] | None) -> dict[str, dict[str, Path]]:
    """NN → {"en": path, "zh": path} for the labs asked for (all when None)."""
    out: dict[str, dict[str, Path]] = {}
    for lang, folder in (("en", REPO / "labs"), ("zh", REPO / "labs" / "zh")):
        for p in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
            nn = p.name[:2]
            if labs is None or nn in labs:
                out.setdefault(nn, {})[lang] = p
    if labs is not None:
        missing = sorted(set(labs) - set(out))
        if missing:
            raise SiteError(f"build_site: --labs: no lab {', '.join(missing)} (the labs are "
                            f"{', '.join(sorted({p.name[:2] for p in (REPO / 'labs').glob('[0-9][0-9]_*.ipynb')}))})")
    return out


def page_name(nb_path: Path) -> str:
    return nb_path.stem + ".html"


# ------------------------------------------------------------------------------------------ execution
def execute(nb_path: Path, spec: dict | None, timeout: int = CELL_TIMEOUT_S) -> Any:
    """The notebook executed in a fresh kernel, with the site hooks installed by a first cell (removed after)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(nb_path, as_version=4)
    setup = nbformat.v4.new_code_cell(
        f"import sys; sys.path.insert(0, {str(TOOLS)!r}); import site_kernel; "
        f"site_kernel.install({json.dumps(json.dumps({'controls': spec or {}}))})")
    setup.id = "site0000"
    nb.cells.insert(0, setup)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(nb_path.parent)}})
    client.execute()
    nb.cells.pop(0)
    return nb


# ------------------------------------------------------------------------------------------- markdown
_FENCE = re.compile(r"^(```|~~~)")
_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$(?!\s)((?:[^$\n]|\n(?!\n))+?)(?<![\s\\])\$(?!\d)", re.S)


def _protect_math(src: str) -> tuple[str, list[str]]:
    """Math spans replaced by placeholders, outside code fences and inline code."""
    maths: list[str] = []

    def repl(m: re.Match) -> str:
        tex, display = (m.group(1), True) if m.group(1) is not None else (m.group(2), False)
        maths.append(to_mathml(tex, display=display))
        return f"\ue000MATH{len(maths) - 1}\ue001"

    in_fence = False
    lines = src.split("\n")
    result, buf = [], []
    for line in lines:
        if _FENCE.match(line.strip()):
            if not in_fence and buf:
                result.append(_math_in_text("\n".join(buf), repl))
                buf = []
            in_fence = not in_fence
            result.append(line)
            continue
        (result if in_fence else buf).append(line)
    if buf:
        result.append(_math_in_text("\n".join(buf), repl))
    return "\n".join(result), maths


def _math_in_text(text: str, repl) -> str:
    parts = re.split(r"(`+[^`]*?`+)", text)  # inline code spans stay as written
    return "".join(p if p.startswith("`") else _MATH.sub(repl, p) for p in parts)


_MD = None


def markdown(src: str, link_map: dict[str, str] | None = None, base: Path = REPO / "labs") -> str:
    global _MD
    if _MD is None:
        from markdown_it import MarkdownIt

        _MD = MarkdownIt("commonmark", {"html": True, "linkify": False}).enable("table").enable("strikethrough")
    text, maths = _protect_math(src)
    out = _MD.render(text)
    out = re.sub("\ue000MATH(\\d+)\ue001", lambda m: maths[int(m.group(1))], out)
    return rewrite_links(out, link_map or {}, base)


#: Where relative links to the repository's files point: ``--repo-url`` / ``$PPOLAB_REPO_URL``, else GitHub Actions'
#: repository (set by :func:`build`); None: such links lose their href (the site has no copy of those files).
REPO_URL: str | None = None


def rewrite_links(out: str, link_map: dict[str, str], base: Path = REPO / "labs") -> str:
    """Links to built lab notebooks point to their pages; other relative links to the repository's files on
    GitHub (``REPO_URL``), or to nothing when it is unknown."""
    def repl(m: re.Match) -> str:
        href = html.unescape(m.group(1))
        if re.match(r"^[a-z]+:|^#|^//", href):
            return m.group(0)
        path, _, frag = href.partition("#")
        name = path if path in link_map else Path(path).name if "/" not in path else None
        if name in link_map:
            return f'href="{html.escape(link_map[name])}{"#" + frag if frag else ""}"'
        target = os.path.relpath(os.path.normpath(base / path), REPO).replace(os.sep, "/")
        if REPO_URL and not target.startswith(".."):
            return f'href="{html.escape(REPO_URL.rstrip("/") + "/" + target)}"'
        return f'data-repo-path="{html.escape(target)}"'

    return re.sub(r'href="([^"]*)"', repl, out)


def inline_markdown(src: str) -> str:
    s = markdown(src).strip()
    return re.sub(r"^<p>(.*)</p>$", r"\1", s, flags=re.S)


# ---------------------------------------------------------------------------------------------- outputs
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _pre(text: str, cls: str) -> str:
    return f'<pre class="{cls}">{html.escape(_ANSI.sub("", text))}</pre>'


class Page:
    """One page's figures (as JSON blobs) and explorers, collected while the cells are rendered."""

    def __init__(self, lang: str, live: str) -> None:
        self.lang, self.live = lang, live
        self.blobs: list[str] = []
        self.n_figures = 0
        self.n_explorers = 0
        self.snaps: dict[str, dict] = {}
        self.explorer_notes: list[str] = []

    def blob(self, obj: Any) -> str:
        bid = f"d{len(self.blobs)}"
        payload = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
        self.blobs.append(f'<script type="application/json" id="{bid}">{payload}</script>')
        return bid

    def figure(self, fig: dict, extra: str = "") -> str:
        self.n_figures += 1
        return f'<div class="figure" data-fig="{self.blob(fig)}"{extra}></div>'


def render_outputs(outputs: list, page: Page, exercise: dict | None = None) -> str:
    parts = []
    for o in outputs:
        kind = o.get("output_type")
        if kind == "stream":
            text = o.get("text", "")
            if exercise is not None and exercise.get("prompt") and exercise["prompt"].strip() in text:
                text = text.replace(exercise["prompt"].strip(), "").strip("\n")
                if not text.strip():
                    continue
            parts.append(_pre(text, "stream " + o.get("name", "stdout")))
        elif kind == "error":
            parts.append(_pre("\n".join(o.get("traceback", [])) or f"{o.get('ename')}: {o.get('evalue')}", "error"))
        elif kind in ("execute_result", "display_data"):
            if exercise is not None and kind == "execute_result":
                continue  # the check's "not answered yet": the page says how to check instead
            parts.append(render_data(o.get("data", {}), page))
    return "".join(parts)


def render_data(data: dict, page: Page) -> str:
    if SNAP_MIME in data or EXERCISE_MIME in data:
        return ""  # collected beforehand
    if REF_MIME in data:
        snap = page.snaps.get(str(data[REF_MIME]["ref"]))
        if snap is None:
            return ""
        if "explorer" in snap:
            return render_explorer(snap["explorer"], page)
        return f'<div class="widget">{render_tree(snap["tree"], page)}' \
               f'<p class="note">{TEXT[page.lang]["widget"].format(live=page.live)}</p></div>'
    if "application/vnd.plotly.v1+json" in data:
        from site_kernel import compact

        fig = compact(data["application/vnd.plotly.v1+json"])
        fig.get("layout", {}).pop("template", None)
        return page.figure({"data": fig.get("data", []), "layout": fig.get("layout", {})})
    if "text/html" in data:
        return f'<div class="html-output">{_join(data["text/html"])}</div>'
    if "image/png" in data:
        return f'<img alt="" src="data:image/png;base64,{_join(data["image/png"]).strip()}">'
    if "image/svg+xml" in data:
        return _join(data["image/svg+xml"])
    if "text/markdown" in data:
        return f'<div class="md-output">{markdown(_join(data["text/markdown"]))}</div>'
    if "text/plain" in data:
        return _pre(_join(data["text/plain"]), "result")
    return ""


def _join(x: Any) -> str:
    return "".join(x) if isinstance(x, list) else str(x)


def render_tree(node: dict, page: Page, explorer: dict | None = None) -> str:
    t = node["t"]
    if t == "box":
        title = f'<div class="wtitle">{html.escape(node["title"])}</div>' if node.get("title") else ""
        inner = "".join(render_tree(c, page, explorer) for c in node["c"])
        return f'<div class="wbox {node["dir"]}">{title}{inner}</div>'
    if t == "fig":
        if explorer is not None and "slot" in node:
            return f'<div class="figure" data-slot="{node["slot"]}"></div>'
        return page.figure(node["fig"])
    if t == "html":
        if explorer is not None and "slot" in node:
            return f'<div class="whtml" data-hslot="{node["slot"]}">{node["v"]}</div>'
        return f'<div class="whtml">{node["v"]}</div>'
    if t == "out":
        return f'<div class="wout">{render_outputs(node["outputs"], page)}</div>'
    if t == "button":
        return f'<button disabled class="wbutton">{html.escape(node["d"])}</button>'
    if t == "ctl":
        if explorer is not None and "cslot" in node:
            for i, c in enumerate(explorer["controls"]):
                if c["cslot"] == node["cslot"]:
                    return _live_control(i, c)
        fixed = f' <span class="fixed">{TEXT[page.lang]["fixed"]}</span>' if explorer is not None else ""
        return (f'<span class="ctl"><span class="ctl-label">{html.escape(node["d"])}</span> '
                f'<span class="ctl-value">{html.escape(node["v"])}</span>{fixed}</span>')
    return ""


def _live_control(i: int, c: dict) -> str:
    label = html.escape(c["label"])
    name = html.escape(c["name"])
    if c["kind"] == "options":
        opts = "".join(f'<option value="{j}"{" selected" if j == c["start"] else ""}>{html.escape(lab)}</option>'
                       for j, lab in enumerate(c["labels"]))
        return (f'<label class="ctl live" data-control="{name}">{label} '
                f'<select data-ci="{i}">{opts}</select></label>')
    return (f'<label class="ctl live" data-control="{name}">{label} '
            f'<input type="range" data-ci="{i}" min="0" max="{len(c["values"]) - 1}" step="1" value="{c["start"]}">'
            f' <output>{html.escape(c["labels"][c["start"]])}</output></label>')


def render_explorer(ex: dict, page: Page) -> str:
    page.n_explorers += 1
    page.n_figures += sum(1 for _ in _fig_nodes(ex["tree"]))
    eid = page.blob({"controls": ex["controls"], "pool": ex["pool"], "states": ex["states"]})
    t = TEXT[page.lang]
    controls = ", ".join(
        f"<code>{html.escape(c['label'])}</code> ∈ {{{', '.join(html.escape(v) for v in c['labels'])}}}"
        for c in ex["controls"])
    note = t["precomputed"].format(n=len(ex["states"]), controls=controls, live=page.live)
    page.explorer_notes.append(note)
    return (f'<div class="explorer" data-explorer="{eid}"><div class="explorer-head">{t["explorer"]}</div>'
            f'<p class="note">{note}</p>{render_tree(ex["tree"], page, ex)}</div>')


def _fig_nodes(node: dict):
    if node["t"] == "fig":
        yield node
    for c in node.get("c", ()):
        yield from _fig_nodes(c)


# ------------------------------------------------------------------------------------------------ pages
_EXERCISE_LINE = re.compile(r"^\s*#\s*EXERCISE\s+(\d\d\.\d+)")


def _highlight(code: str) -> str:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    return highlight(code, PythonLexer(), HtmlFormatter(nowrap=True))


def render_notebook(nb: Any, lang: str, live: str, link_map: dict[str, str], base: Path = REPO / "labs"
                    ) -> tuple[str, Page]:
    page = Page(lang, live)
    for cell in nb.cells:  # widget snapshots first: a ref is rendered where the widget was displayed
        for o in cell.get("outputs", []):
            if SNAP_MIME in o.get("data", {}):
                page.snaps.update(o["data"][SNAP_MIME])
    body = []
    t = TEXT[lang]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            body.append(f'<section class="cell md">{markdown(cell.source, link_map, base)}</section>')
            continue
        if cell.cell_type != "code":
            continue
        m = _EXERCISE_LINE.match(cell.source)
        exercise = None
        if m:
            exercise = {"id": m.group(1)}
            for o in cell.get("outputs", []):
                if EXERCISE_MIME in o.get("data", {}):
                    exercise.update(o["data"][EXERCISE_MIME])
        code = f'<pre class="code hl">{_highlight(cell.source)}</pre>' if cell.source.strip() else ""
        outs = render_outputs(cell.get("outputs", []), page, exercise)
        if exercise is not None:
            prompt = exercise.get("prompt", "")
            body.append(
                f'<section class="cell exercise" id="ex-{exercise["id"]}"><div class="ex-head">'
                f'{t["exercise"].format(id=exercise["id"])}</div>'
                + (f'<div class="ex-prompt">{inline_markdown(prompt)}</div>' if prompt else "")
                + f'{code}<div class="outputs">{outs}</div>'
                f'<p class="note">{t["exercise_note"].format(live=live)}</p></section>')
        else:
            body.append(f'<section class="cell code">{code}<div class="outputs">{outs}</div></section>')
    return "\n".join(body), page


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI","Noto Sans","Noto Sans CJK SC","Source Han Sans SC",
"PingFang SC","Microsoft YaHei",sans-serif;max-width:1100px;margin:0 auto;padding:0 1.2em 4em;line-height:1.5;
color:#1b1f24}
header.top{display:flex;gap:1em;align-items:baseline;border-bottom:1px solid #ddd;padding:.6em 0;margin-bottom:1em}
header.top .sp{flex:1}
a{color:#0b5cad}
pre{overflow-x:auto;padding:.5em .7em;border-radius:4px;font-size:13px;line-height:1.35;margin:.3em 0}
pre.code{background:#f6f8fa;border:1px solid #e3e6ea}
pre.stream,pre.result{background:#fff;border-left:3px solid #cfd6dd}
pre.stderr{border-left-color:#e0b000;color:#6b5400}
pre.error{background:#fff0f0;border-left:3px solid #c00}
.cell{margin:.6em 0}
.md table,.html-output table,.whtml table{border-collapse:collapse;font-size:13px;margin:.4em 0}
.md td,.md th,.html-output td,.html-output th,.whtml td,.whtml th{border:1px solid #d0d7de;padding:2px 6px}
.html-output{overflow-x:auto}
.note{font-size:13px;color:#444;background:#f4f8fc;border-left:3px solid #6aa0d8;padding:.4em .7em;margin:.4em 0}
.exercise{border:1px solid #e0c36b;background:#fffcf0;border-radius:6px;padding:.5em .8em}
.ex-head,.explorer-head{font-weight:600}
.explorer{border:1px solid #9cc3e6;border-radius:6px;padding:.5em .8em;margin:.6em 0}
.widget{border:1px dashed #c9d1d9;border-radius:6px;padding:.4em .8em;margin:.6em 0}
.wbox.h{display:flex;flex-wrap:wrap;gap:.4em 1.4em;align-items:center}
.wbox.v>*{margin:.2em 0}
.ctl{display:inline-flex;gap:.4em;align-items:center;font-size:14px}
.ctl-label{font-weight:600}
.fixed{color:#888;font-size:12px}
.figure{min-height:60px}
math{font-size:1.12em}
math[display=block]{margin:.5em 0;overflow-x:auto}
table.course td,table.course th{border:1px solid #d0d7de;padding:3px 8px}
table.course{border-collapse:collapse}
"""

JS = r"""
(function(){
  var cfg={responsive:true,displaylogo:false};
  function data(id){return JSON.parse(document.getElementById(id).textContent);}
  function fig(f){return {data:f.data||[],layout:Object.assign({autosize:true},f.layout||{})};}
  document.querySelectorAll('.figure[data-fig]').forEach(function(div){
    var f=fig(data(div.dataset.fig)); Plotly.newPlot(div,f.data,f.layout,cfg);
  });
  document.querySelectorAll('.explorer').forEach(function(box){
    var ex=data(box.dataset.explorer), pool=ex.pool;
    var idx=ex.controls.map(function(c){return c.start;});
    var inputs=box.querySelectorAll('[data-ci]');
    function show(){
      var st=ex.states[idx.join(',')];
      if(!st) return;
      box.querySelectorAll('.figure[data-slot]').forEach(function(div){
        var s=st.figs[+div.dataset.slot];
        var traces=s.data.map(function(t){var o={};for(var k in t)o[k]=pool[t[k]];return o;});
        var layout=Object.assign({autosize:true},JSON.parse(JSON.stringify(pool[s.layout])));
        Plotly.react(div,traces,layout,cfg);
      });
      box.querySelectorAll('[data-hslot]').forEach(function(el){el.innerHTML=pool[st.html[+el.dataset.hslot]];});
      inputs.forEach(function(el){
        var c=ex.controls[+el.dataset.ci], out=el.parentNode.querySelector('output');
        if(out) out.textContent=c.labels[idx[+el.dataset.ci]];
      });
      box.dataset.state=idx.join(',');
    }
    inputs.forEach(function(el){
      el.addEventListener('input',function(){idx[+el.dataset.ci]=+el.value;show();});
    });
    show();
  });
  document.body.dataset.rendered='1';
})();
"""


def _html_page(title: str, lang: str, body: str, nav: str, root: str, blobs: list[str] = ()) -> str:
    scripts = f'<script src="{root}{PLOTLY_ASSET}"></script>' if blobs else ""
    return (f'<!DOCTYPE html>\n<html lang="{TEXT[lang]["lang"]}"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{html.escape(title)}</title><link rel="stylesheet" href="{root}assets/site.css"></head>'
            f'<body><header class="top">{nav}</header><main>{body}</main>{"".join(blobs)}{scripts}'
            f'<script src="{root}assets/site.js"></script></body></html>\n')


# --------------------------------------------------------------------------------------------- landing
def course_table(lang: str, built: dict[str, dict[str, Path]], all_labs: dict[str, dict[str, Path]],
                 failed: set[str] = frozenset()) -> str:
    """The table of labs/README.md (labs/zh/README.md), links pointing to the built pages; a lab in ``failed``
    ("NN") is marked as such instead of linked."""
    readme = (REPO / "labs" / ("zh/README.md" if lang == "zh" else "README.md")).read_text(encoding="utf-8")
    rows = [line for line in readme.splitlines() if line.startswith("|")]
    head, body = rows[:2], rows[2:]
    out = []
    for line in body:
        m = re.search(r"\]\((\d\d)_[^)]*\.ipynb\)", line)
        if not m:
            continue
        nn = m.group(1)
        if nn in failed:
            line = re.sub(r"\[([^\]]*)\]\([^)]*\.ipynb\)", lambda mm: f"{mm.group(1)} {TEXT[lang]['failed']}", line)
        elif nn in built and lang in built[nn]:
            line = re.sub(r"\]\(([^)]*\.ipynb)\)", lambda mm: f"]({lang}/{Path(mm.group(1)).stem}.html)", line)
        else:
            line = re.sub(r"\[([^\]]*)\]\([^)]*\.ipynb\)", lambda mm: f"{mm.group(1)} {TEXT[lang]['not_built']}",
                          line)
        out.append(line)
    pages = {f"{lang}/{p[lang].stem}.html": f"{lang}/{p[lang].stem}.html" for p in built.values() if lang in p}
    table = markdown("\n".join(head + out), pages)
    return table.replace("<table>", '<table class="course">', 1)


def live_text(lang: str, binder: str | None, nb_rel: str | None = None) -> str:
    t = TEXT[lang]
    s = t["live"]
    if binder:
        url = binder + (f"?urlpath=lab/tree/{nb_rel}" if nb_rel else "?urlpath=lab/tree/labs")
        s += t["binder"].format(url=html.escape(url))
    return s


def human(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


# ------------------------------------------------------------------------------------------------ main
def default_binder() -> str | None:
    """The Binder launch URL for this repository's public GitHub path: ``PPOLAB_BINDER_URL``, else derived from
    GitHub Actions' ``GITHUB_REPOSITORY``; None when neither is known (the pages then name only JupyterLab)."""
    if os.environ.get("PPOLAB_BINDER_URL"):
        return os.environ["PPOLAB_BINDER_URL"]
    repo = os.environ.get("GITHUB_REPOSITORY")
    return f"https://mybinder.org/v2/gh/{repo}/HEAD" if repo else None


def executed(nb_path: Path, spec: dict | None, cache: Path | None) -> Any:
    """:func:`execute`, or the copy a previous build left in ``cache`` when it is newer than the notebook, the
    kernel hooks and its explorer's grid (for re-rendering pages without re-running the labs)."""
    import nbformat

    if cache is None:
        return execute(nb_path, spec)
    hit, key = cache / nb_path.name, json.dumps(spec, sort_keys=True)
    newest = max(nb_path.stat().st_mtime, (TOOLS / "site_kernel.py").stat().st_mtime)
    if hit.exists() and hit.stat().st_mtime > newest:
        nb = nbformat.read(hit, as_version=4)
        if nb.metadata.get("ppolab_site_spec") == key:
            return nb
    nb = execute(nb_path, spec)
    nb.metadata["ppolab_site_spec"] = key
    cache.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, hit)
    return nb


def default_repo_url() -> str | None:
    if os.environ.get("PPOLAB_REPO_URL"):
        return os.environ["PPOLAB_REPO_URL"]
    repo = os.environ.get("GITHUB_REPOSITORY")
    server = os.environ.get("GITHUB_SERVER_URL", "https://github.com")
    return f"{server}/{repo}/blob/{os.environ.get('GITHUB_SHA', 'HEAD')}" if repo else None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


#: The suffix of a file being written into OUT (renamed into place when whole): a build's own, removed by the next.
TMP_SUFFIX = ".site-tmp"


class _Ledger:
    """Every file a build puts into OUT goes through :meth:`put`: the file's new SHA-256 is added to build.json's
    ``pending`` (renamed into place) *before* the file is, and the file itself is written to a temporary name and
    renamed. So a build stopped at any point (Ctrl-C, a kill) leaves only files that build.json names with their
    hash — old or new — and the same command builds again (:func:`check_out` accepts either)."""

    def __init__(self, out: Path, written: dict[str, str]):
        self.out, self.files, self.pending = out, dict(written), {}

    def _write(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + TMP_SUFFIX)
        tmp.write_bytes(data)  # a new file: the umask's mode, like any file the user makes
        os.replace(tmp, path)

    def put(self, rel: str, text: str) -> None:
        data = text.encode("utf-8")
        self.pending[rel] = hashlib.sha256(data).hexdigest()
        self._write(self.out / "build.json", json.dumps({"files": self.files, "pending": self.pending},
                                                         indent=1).encode("utf-8"))
        (self.out / rel).parent.mkdir(parents=True, exist_ok=True)
        self._write(self.out / rel, data)

    def finish(self, report: dict) -> None:
        """build.json as the finished build's report; ``files`` every file of OUT, now all this build's or kept."""
        report["files"] = {f.relative_to(self.out).as_posix(): _sha256(f) for f in sorted(self.out.rglob("*"))
                           if f.is_file() and f.name != "build.json"}
        self._write(self.out / "build.json", json.dumps(report, indent=1, ensure_ascii=False).encode("utf-8"))


def check_out(out: Path) -> dict[str, str]:
    """The files of OUT that a previous build wrote, by relative path → SHA-256 (empty for a new or empty folder).
    Raises :class:`SiteError` for an OUT that is a file, or holds anything a build of ours did not write or that
    changed since — the builder replaces no one else's file."""
    if out.exists() and not out.is_dir():
        raise SiteError(f"build_site: OUT {out} is a file, not a folder: give a new or empty folder")
    if out.is_symlink() and not out.exists():
        raise SiteError(f"build_site: OUT {out} is a link to {os.readlink(out)}, which does not exist: make that "
                        "folder first, or give a new or empty folder")
    if not out.exists() or not any(out.iterdir()):
        return {}
    record = out / "build.json"
    for tmp in sorted(out.rglob("*" + TMP_SUFFIX)):  # a stopped build's half-written file: never a user's
        if tmp.is_file() and not tmp.is_symlink():
            tmp.unlink()
    pending: dict[str, str] = {}
    try:
        data = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else None
        written = data["files"]
        pending = data.get("pending") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        written = None
    if not isinstance(pending, dict):
        written = None
    if not isinstance(written, dict):
        raise SiteError(f"build_site: OUT {out} is not empty and not a site this builder wrote (no build.json with "
                        f"its files): give a new or empty folder")
    for f in sorted(out.rglob("*")):
        if f.is_symlink():  # a build writes plain files in its own folders; through a link it would write elsewhere
            raise SiteError(f"build_site: {f} is a link (to {os.readlink(f)}), not a file or folder a build of "
                            "this site wrote: remove the link, or give another OUT")
        if f.is_dir():
            continue
        rel = f.relative_to(out).as_posix()
        if rel == "build.json":
            continue
        if rel not in written and rel not in pending:
            raise SiteError(f"build_site: {f} was not written by a build of this site: move it, or give another OUT")
        if _sha256(f) not in (written.get(rel), pending.get(rel)):  # a stopped build left the old or the new one
            raise SiteError(f"build_site: {f} changed since the last build wrote it: move it, or give another OUT")
    return {rel: sha for rel, sha in {**written, **pending}.items() if (out / rel).is_file()}


def check_args(out: Path, labs: list[str] | None, cache: Path | None
               ) -> tuple[dict[str, dict[str, Path]], dict[str, str]]:
    """Every argument checked before a byte is written: the labs asked for exist, OUT and the cache are usable
    folders. Returns the labs to build (:func:`lab_notebooks`) and OUT's files of earlier builds
    (:func:`check_out`)."""
    written = check_out(out)
    if cache is not None and cache.exists() and not cache.is_dir():
        raise SiteError(f"build_site: --cache {cache} is a file, not a folder")
    for what, folder in (("OUT", out), ("--cache", cache)):
        if folder is None:
            continue
        inside = [folder, *(sorted(folder.rglob("*")) if folder.is_dir() else [])]  # a build rewrites its files too
        here = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
        stuck = [p for p in (inside if folder.exists() else [here])
                 if not os.access(p, os.W_OK | (os.X_OK if p.is_dir() else 0))]
        if stuck:
            raise SiteError(f"build_site: {what} {folder} cannot be written ({stuck[0]} is read-only for this user): "
                            "give a folder you can write, or make it writable")
    return lab_notebooks(labs), written


def build(out: Path, labs: list[str] | None = None, binder: str | None = None, log=print,
          cache: Path | None = None, repo_url: str | None = None) -> dict:
    import plotly.offline
    from pygments.formatters import HtmlFormatter

    global REPO_URL
    todo, written = check_args(out, labs, cache)  # before anything is written
    REPO_URL = repo_url
    t0 = time.time()
    os.environ.pop("PPOLAB_RUN", None)  # the labs' own shipped runs
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    out.mkdir(parents=True, exist_ok=True)
    ledger = _Ledger(out, written)
    ledger.put("assets/plotly.min.js", plotly.offline.get_plotlyjs())
    ledger.put("assets/site.css", CSS + HtmlFormatter().get_style_defs(".hl"))
    ledger.put("assets/site.js", JS)
    ledger.put(".nojekyll", "")

    all_labs = lab_notebooks(None)
    report: dict[str, Any] = {"pages": {}, "errors": {}, "failed": {}}
    for nn, by_lang in todo.items():
        for lang, nb_path in by_lang.items():
            t1 = time.time()
            spec = EXPLORERS.get(nn)
            try:
                nb = executed(nb_path, spec, cache / lang if cache else None)
            except Exception as e:  # a dead kernel, a timeout: name the lab, build the others
                reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                report["failed"][f"{lang}/{nn}"] = reason
                log(f"{lang}/{page_name(nb_path)}: FAILED — {reason}")
                continue
            link_map = {p[lang].name: page_name(p[lang]) for p in todo.values() if lang in p}
            link_map.update({f"../{p['en'].name}": f"../en/{page_name(p['en'])}" for p in todo.values() if "en" in p})
            rel = nb_path.relative_to(REPO).as_posix()
            live = live_text(lang, binder, rel)
            body, page = render_notebook(nb, lang, live, link_map, nb_path.parent)
            other = "zh" if lang == "en" else "en"
            nav = (f'<a href="../index.html">{TEXT[lang]["home"]}</a><span class="sp"></span>'
                   + (f'<a href="../{other}/{page_name(by_lang[other])}">{TEXT[lang]["other"]}</a>'
                      if other in by_lang else ""))
            title = next((c.source.splitlines()[0].lstrip("# ") for c in nb.cells if c.cell_type == "markdown"),
                         nb_path.stem)
            dest = out / lang / page_name(nb_path)
            ledger.put(f"{lang}/{page_name(nb_path)}", _html_page(title, lang, body, nav, "../", page.blobs))
            errors = [o.get("ename", "") + ": " + o.get("evalue", "")[:200] for c in nb.cells
                      for o in c.get("outputs", []) if o.get("output_type") == "error"]
            if errors:
                report["errors"][f"{lang}/{nn}"] = errors
            if spec and not page.n_explorers:
                report["errors"].setdefault(f"{lang}/{nn}", []).append(
                    f"no displayed widget has the controls {sorted(spec)}: the explorer was not precomputed")
            report["pages"][f"{lang}/{page_name(nb_path)}"] = {
                "seconds": round(time.time() - t1, 1), "bytes": dest.stat().st_size,
                "figures": page.n_figures, "explorers": page.n_explorers, "explorer_notes": page.explorer_notes}
            log(f"{lang}/{page_name(nb_path)}: {time.time() - t1:.0f} s, {human(dest.stat().st_size)}, "
                f"{page.n_figures} figures, {page.n_explorers} explorer(s)"
                + (f", {len(errors)} cell error(s)" if errors else ""))

    secs = time.time() - t0
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    failed = {k.split("/")[1] for k in report["failed"]}
    langs = []
    for lang in ("en", "zh"):
        t = TEXT[lang]
        langs.append(f'<section lang="{t["lang"]}"><h2>{t["title"]}</h2>'
                     f'<p>{t["landing_intro"].format(live=live_text(lang, binder))}</p>'
                     f'{course_table(lang, todo, all_labs, failed)}</section>')
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    foot = (f'<p class="note">{TEXT["en"]["built"].format(date=stamp, secs=secs, size=human(size))} '
            f'{TEXT["zh"]["built"].format(date=stamp, secs=secs, size=human(size))}</p>')
    index = _html_page("ppolab", "en", "".join(langs) + foot, '<b>ppolab</b>', "")
    ledger.put("index.html", index)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    report.update(seconds=round(secs, 1), bytes=size, labs=sorted(todo),
                  unknown_tex=sorted(UNKNOWN))
    # what this build wrote (and the earlier builds' files it kept), so the next build knows what it may replace
    ledger.finish(report)
    log(f"site {out}: {len(report['pages'])} pages + index in {secs:.0f} s, {human(size)}"
        + (f"; cell errors in {', '.join(report['errors'])}" if report["errors"] else "")
        + (f"; FAILED: {', '.join(report['failed'])}" if report["failed"] else ""))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output folder: new, empty, or a site this builder wrote (it replaces "
                        "only its own unchanged files)")
    parser.add_argument("--labs", help="comma-separated lab numbers, e.g. 04,11 (default: all)")
    parser.add_argument("--binder", default=default_binder(),
                        help="Binder launch URL without ?urlpath (default: $PPOLAB_BINDER_URL or, in GitHub Actions, "
                             "https://mybinder.org/v2/gh/$GITHUB_REPOSITORY/HEAD)")
    parser.add_argument("--cache", type=Path, help="keep executed notebooks here and reuse them while newer than "
                        "their lab (re-rendering pages without re-running the labs)")
    parser.add_argument("--repo-url", default=default_repo_url(),
                        help="where links to the repository's files point, e.g. "
                             "https://github.com/OWNER/REPO/blob/main (default: $PPOLAB_REPO_URL or, in GitHub "
                             "Actions, this commit on GitHub)")
    args = parser.parse_args(argv)
    labs = None
    if args.labs is not None:
        parts = [x.strip() for x in args.labs.split(",")]
        bad = [x for x in parts if not re.fullmatch(r"\d{1,2}", x)]
        if bad or not parts:
            print(f"build_site: --labs {args.labs!r}: give lab numbers separated by commas, e.g. 04,11 "
                  f"(not {', '.join(map(repr, bad)) or 'nothing'})", file=sys.stderr)
            return 2
        labs = [f"{int(x):02d}" for x in parts]
    try:
        report = build(args.out, labs, args.binder, cache=args.cache, repo_url=args.repo_url)
    except SiteError as e:
        print(e, file=sys.stderr)
        return 2
    return 1 if report["errors"] or report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
