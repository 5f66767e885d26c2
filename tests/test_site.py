"""The course as a static website (``tools/build_site.py``), without a browser.

One build per test session (lab 04, English and Chinese: :func:`built_site`, shared with
``tests/browser/test_site_browser.py``), run as the README runs it, with an audit hook in the builder *and* in its
kernels (a ``sitecustomize`` on ``PYTHONPATH``) that logs every file opened or listed under ``labs/solutions``.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAB = "04"
PAGES = ("en/04_clipped_objective.html", "zh/04_clipped_objective.html")

_AUDIT = '''
import os, sys
_LOG = os.environ["PPOLAB_SITE_AUDIT_LOG"]
_SOL = os.path.realpath(os.environ["PPOLAB_SITE_SOLUTIONS"])
def _hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        try:
            p = os.path.realpath(os.fsdecode(args[0]))
        except Exception:
            return
        if p == _SOL or p.startswith(_SOL + os.sep):
            with open(_LOG, "a") as f:
                f.write(f"{os.getpid()} {event} {p}\\n")
sys.addaudithook(_hook)
'''


def built_site(tmp_path_factory) -> Path:
    """``python tools/build_site.py OUT --labs 04``, once per session (for every xdist worker: tests/trained.py);
    OUT/solutions_audit.log lists every access to labs/solutions by the builder or its kernels (empty: none)."""
    from trained import build_once, shared_root

    def make(folder: Path) -> None:
        out, hook_dir, log = folder / "site", folder / "site-audit", folder / "solutions_audit.log"
        hook_dir.mkdir()
        (hook_dir / "sitecustomize.py").write_text(_AUDIT)
        log.write_text("")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook_dir), os.environ.get("PYTHONPATH", "")]),
                   PPOLAB_SITE_AUDIT_LOG=str(log), PPOLAB_SITE_SOLUTIONS=str(REPO / "labs" / "solutions"))
        env.pop("PPOLAB_RUN", None)
        proc = subprocess.run([sys.executable, "tools/build_site.py", str(out), "--labs", LAB], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"build failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        (out / "solutions_audit.log").write_text(log.read_text())
        print(proc.stdout)

    return build_once(shared_root(tmp_path_factory, keep=False), f"site-{LAB}", make) / "site"


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    return built_site(tmp_path_factory)


class _Refs(HTMLParser):
    """Every URL a page would load (script/img/iframe/source src, link href, CSS url()) and every <a href>."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        for key in ("src", "srcset", "data", "poster"):
            if a.get(key):
                self.loads.append(a[key])
        if tag == "link" and a.get("href"):
            self.loads.append(a["href"])
        if a.get("style"):
            self.loads += re.findall(r"url\(([^)]*)\)", a["style"])


def _remote(url: str) -> bool:
    return bool(re.match(r"^\s*(https?:)?//", url, re.I))


@pytest.mark.slow  # the site build (20 s) runs in .ci/run's slow phase, keeping the README command under 10 minutes
def test_site_layout_and_no_other_host(site):
    report = json.loads((site / "build.json").read_text())
    assert not report["errors"], report["errors"]
    assert set(report["pages"]) == set(PAGES)
    assert report["unknown_tex"] == [], f"TeX commands the MathML converter does not know: {report['unknown_tex']}"
    # plotly.js once for the site, every page loads it from there
    assert (site / "assets" / "plotly.min.js").stat().st_size > 1_000_000
    assert not [p for p in site.rglob("*.js") if p.name != "plotly.min.js" and p.stat().st_size > 100_000]
    for name in (*PAGES, "index.html"):
        text = (site / name).read_text(encoding="utf-8")
        refs = _Refs()
        refs.feed(text)
        remote = [u for u in refs.loads if _remote(u)]
        assert not remote, f"{name} loads from another host: {remote}"
        assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", text), f"{name}: a remote CSS import"
        for link in refs.links:  # links in the text may leave the site (Binder, GitHub); local ones must exist
            if _remote(link) or link.startswith(("#", "mailto:")):
                continue
            target = (site / name).parent / link.split("#")[0]
            assert target.exists(), f"{name}: broken link {link}"
        if name != "index.html":
            assert refs.loads.count("../assets/plotly.min.js") == 1, name
            assert "<math" in text, f"{name}: no math rendered"
            assert "$$" not in re.sub(r"<(pre|script)[^>]*>.*?</\1>", "", text, flags=re.S), f"{name}: raw TeX left"
    css = (site / "assets" / "site.css").read_text()
    assert not _remote(" ".join(re.findall(r"url\(([^)]*)\)", css)))
    index = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="en/04_clipped_objective.html"' in index and 'href="zh/04_clipped_objective.html"' in index
    assert "00 start here" in index and "从这里开始" in index  # both languages' tables, unbuilt labs unlinked


@pytest.mark.slow  # the site build (20 s) runs in .ci/run's slow phase, keeping the README command under 10 minutes
def test_builder_never_reads_solutions(site):
    """Neither the builder nor the kernels it started opened or listed labs/solutions; no solution text is on the
    site; the exercises are there with their prompts and the note that checking needs the live lab."""
    audit = (site / "solutions_audit.log").read_text()
    assert audit == "", f"labs/solutions was read during the build:\n{audit}"
    for tool in ("build_site.py", "site_kernel.py", "site_math.py"):
        assert "solutions" not in re.sub(r'""".*?"""|#.*', "", (REPO / "tools" / tool).read_text(), flags=re.S), tool
    solution = (REPO / "labs" / "solutions" / f"{LAB}.py").read_text()
    import nbformat

    nb = nbformat.read(next((REPO / "labs").glob(f"{LAB}_*.ipynb")), as_version=4)
    in_lab = "\n".join(c.source for c in nb.cells)
    lines = {ln.strip() for ln in solution.splitlines()
             if len(ln.strip()) > 25 and not ln.strip().startswith("#") and ln.strip() not in in_lab}
    assert lines, "no solution line to look for"
    en = (site / PAGES[0]).read_text(encoding="utf-8")
    zh = (site / PAGES[1]).read_text(encoding="utf-8")
    import html as _html
    plain = _html.unescape(re.sub(r"<[^>]+>", "", en))
    leaked = [ln for ln in lines if ln in plain]
    assert not leaked, f"solution lines on the page: {leaked[:3]}"
    from ppolab.exercises import registry

    ids = sorted(i for i in registry() if i.startswith(LAB + "."))
    for page, note in ((en, "Checking an answer needs the live lab"), (zh, "检查答案需要 live lab")):
        for i in ids:
            assert f'id="ex-{i}"' in page, f"exercise {i} missing"
        assert page.count(note) == len(ids)
        assert page.count('class="ex-prompt"') == len(ids)


def _explorer(page: Path) -> dict:
    text = page.read_text(encoding="utf-8")
    eid = re.search(r'class="explorer" data-explorer="(d\d+)"', text).group(1)
    blob = re.search(rf'<script type="application/json" id="{eid}">(.*?)</script>', text, re.S).group(1)
    return json.loads(blob.replace("<\\/", "</"))


def live_clip_explorer():
    """Lab 04's explorer as the lab opens it (exercise 04.2's case in ppo_fire_tiny)."""
    from ppolab.exercises.lab04 import predict_case
    from ppolab.widgets import clip_explorer

    case = predict_case("ppo_fire_tiny")
    return clip_explorer("ppo_fire_tiny", step=case["step"], opt_step=case["opt_step"])


def clipfrac_by_algos(w, eps_low: float, eps_high: float, opt_step: int) -> tuple[float, list[float]]:
    """pg_clipfrac and the sorted ratios of the clipped tokens, from ppolab.algos on the recorded batch."""
    from ppolab.algos import masked_mean, ppo_clip_terms
    from ppolab.widgets.common import actor_config, optimizer_step_batch, resolve_run

    b = optimizer_step_batch(w.record, opt_step)
    c = actor_config(resolve_run("ppo_fire_tiny")).clip_ratio_c
    terms = ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], eps_low, eps_high, c)
    m = b["response_mask"] > 0
    clipped = (terms["clipped"] > 0) & m
    return float(masked_mean(terms["clipped"].float(), b["response_mask"])), sorted(terms["ratio"][clipped].tolist())


def _close(a: float, b: float, rel: float = 2e-5) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


@pytest.mark.slow  # the site build (20 s) runs in .ci/run's slow phase, keeping the README command under 10 minutes
def test_precomputed_explorer_equals_live_explorer(site):
    """Every grid point of lab 04's page: its readout's pg_clipfrac and its clipped tokens' ratios are the live
    explorer's for that setting, and what ppolab.algos computes on the recorded batch."""
    ex = _explorer(site / PAGES[0])
    names = [c["name"] for c in ex["controls"]]
    assert names == ["eps_low", "eps_high", "opt_step"]
    grids = [c["values"] for c in ex["controls"]]
    assert all(len(g) >= 3 for g in grids)
    w = live_clip_explorer()
    pool = ex["pool"]
    seen = set()
    for key, st in ex["states"].items():
        idx = [int(i) for i in key.split(",")]
        low, high, k = (g[i] for g, i in zip(grids, idx))
        for name, v in zip(names, (low, high, k)):
            w.controls[name].value = v
        readout = pool[st["html"][0]]
        shown = float(re.search(r"pg_clipfrac = <b>([0-9.]+)</b>", readout).group(1))
        assert _close(shown, w.state["pg_clipfrac"], 1e-6), (key, shown, w.state["pg_clipfrac"])
        frac, ratios = clipfrac_by_algos(w, low, high, k)
        assert _close(shown, frac, 1e-6), (key, shown, frac)
        batch = st["figs"][1]["data"]
        red = sorted(pool[batch[1]["x"]]) if "x" in batch[1] else []
        assert len(red) == len(ratios) and all(_close(a, b) for a, b in zip(red, ratios)), key
        x = w.figures["batch"].data[1].x  # a numpy buffer (or None when nothing is clipped)
        live_red = sorted([] if x is None else x.tolist() if hasattr(x, "tolist") else list(x))
        assert all(_close(a, b) for a, b in zip(red, live_red)), key
        seen.add(round(shown, 6))
    assert len(seen) > 3, "the grid's settings do not change pg_clipfrac: the sweep did not move the explorer"


# ------------------------------------------------------------------ misuse: the builder's own folder (issue 36)
def _builder(monkeypatch, fail: set[Path] = frozenset()):
    """tools/build_site imported in-process, its kernel replaced by reading the notebook unexecuted (fast), and a
    dead kernel for the notebooks named in ``fail``."""
    import importlib

    import nbformat

    monkeypatch.syspath_prepend(str(REPO / "tools"))
    bs = importlib.import_module("build_site")

    def execute(nb_path, spec, timeout=0):
        if Path(nb_path) in fail:
            from nbclient.exceptions import DeadKernelError
            raise DeadKernelError("Kernel died")
        return nbformat.read(nb_path, as_version=4)

    monkeypatch.setattr(bs, "execute", execute)
    return bs


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_folder_of_the_users_is_never_written_into(tmp_path, monkeypatch, capsys):
    bs = _builder(monkeypatch)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "index.html").write_text("my own page")
    before = _tree(out)
    assert bs.main([str(out), "--labs", "04"]) == 2
    assert _tree(out) == before
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "not a site this builder wrote" in err[0], err


@pytest.mark.parametrize("labs, shown", [("99", "no lab 99"), ("4x", "'4x'"), ("04,", "''")])
def test_bad_labs_are_refused_before_anything_is_written(tmp_path, monkeypatch, capsys, labs, shown):
    bs = _builder(monkeypatch)
    out = tmp_path / "site"
    assert bs.main([str(out), "--labs", labs]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--labs" in err[0] and shown in err[0], err


def test_a_dead_kernel_names_its_lab_and_the_rest_is_built(tmp_path, monkeypatch, capsys):
    zh = next((REPO / "labs" / "zh").glob("04_*.ipynb"))
    bs = _builder(monkeypatch, fail={zh})
    out = tmp_path / "site"
    assert bs.main([str(out), "--labs", "04,11"]) == 1
    report = json.loads((out / "build.json").read_text())
    assert list(report["failed"]) == ["zh/04"] and "DeadKernelError" in report["failed"]["zh/04"]
    assert {"en/04_clipped_objective.html", "zh/11_loss_aggregation.html"} <= set(report["pages"])
    index = (out / "index.html").read_text()
    assert "构建失败" in index and "zh/04_clipped_objective.html" not in index and "zh/11_" in index
    assert "zh/04" in capsys.readouterr().out


def test_a_site_of_its_own_is_rebuilt_but_a_changed_page_stops_it(tmp_path, monkeypatch, capsys):
    bs = _builder(monkeypatch)
    out = tmp_path / "site"
    assert bs.main([str(out), "--labs", "11"]) in (0, 1)
    assert bs.main([str(out), "--labs", "11"]) in (0, 1), capsys.readouterr().err  # its own files: replaced
    page = out / "en" / "11_loss_aggregation.html"
    page.write_text(page.read_text() + "<!-- my note -->")
    before = _tree(out)
    assert bs.main([str(out), "--labs", "11"]) == 2
    assert _tree(out) == before
    assert "11_loss_aggregation.html changed since the last build" in capsys.readouterr().err


def test_a_link_inside_its_own_site_is_refused_and_what_it_leads_to_untouched(tmp_path, monkeypatch, capsys):
    """A previous build whose assets/ was replaced by a link to a folder of the user's: the build would write its
    assets through the link, over the user's own site.css."""
    bs = _builder(monkeypatch)
    out, mine = tmp_path / "site", tmp_path / "my-assets"
    assert bs.main([str(out), "--labs", "11"]) in (0, 1)
    mine.mkdir()
    (mine / "site.css").write_text("my own css")
    for f in (out / "assets").iterdir():
        f.unlink()
    (out / "assets").rmdir()
    (out / "assets").symlink_to(mine)
    assert bs.main([str(out), "--labs", "11"]) == 2
    assert _tree(mine) == {"site.css": b"my own css"}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{out / 'assets'} is a link (to {mine})" in err[0], err


def test_an_out_that_cannot_be_written_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    bs = _builder(monkeypatch)
    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    # as root every folder is writable: the test says which one is not, as chmod 555 does for a user
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != locked and access(p, mode))
    assert bs.main([str(locked / "site"), "--labs", "11"]) == 2
    assert not (locked / "site").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{locked} is read-only for this user" in err[0], err


def test_an_out_that_is_a_link_to_nowhere_is_one_line(tmp_path, monkeypatch, capsys):
    bs = _builder(monkeypatch)
    out = tmp_path / "site"
    out.symlink_to(tmp_path / "nowhere")
    assert bs.main([str(out), "--labs", "11"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "which does not exist" in err[0], err


@pytest.mark.parametrize("stop_at", ["the first page", "the index"])
def test_a_build_stopped_midway_is_built_again_by_the_same_command(tmp_path, monkeypatch, capsys, stop_at):
    """Ctrl-C (or a kill) during a first build, or during a rebuild after its pages were rewritten: build.json names
    every file with its old or new hash before the file is replaced, so the same command builds again — and a file
    of the user's in OUT still stops it."""
    bs = _builder(monkeypatch)
    out = tmp_path / "site"
    real_put = bs._Ledger.put

    def stopping_put(self, rel, text):
        if (stop_at == "the first page" and rel.endswith(".html") and "/" in rel) or rel == "index.html":
            real_put(self, rel, text)  # the file is whole in place, then the interrupt arrives
            raise KeyboardInterrupt
        real_put(self, rel, text)

    monkeypatch.setattr(bs._Ledger, "put", stopping_put)
    with pytest.raises(KeyboardInterrupt):
        bs.main([str(out), "--labs", "11"])
    monkeypatch.setattr(bs._Ledger, "put", real_put)
    assert bs.main([str(out), "--labs", "11"]) in (0, 1), capsys.readouterr().err
    report = json.loads((out / "build.json").read_text())
    assert "en/11_loss_aggregation.html" in report["pages"] and "pending" not in report
    (out / "notes.txt").write_text("mine")
    assert bs.main([str(out), "--labs", "11"]) == 2
    assert "notes.txt was not written by a build" in capsys.readouterr().err
