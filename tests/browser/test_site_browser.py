"""The static site (``tools/build_site.py``) in headless Chromium: lab 04's English and Chinese pages, opened from
``file://`` URLs with no server and no kernel.

Each page: no console error, no request that is not a local file, every figure drawn by plotly.js, and moving the
explorer's precomputed ε_high slider redraws it with the numbers the live explorer and ``ppolab.algos`` give for that
setting. The Chinese page's characters are drawn as glyphs (the check of ``test_lab_in_browser.py``). Screenshots:
``tests/browser/artifacts/site_en.png`` and ``site_zh.png``.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright
from test_lab_in_browser import _CJK_GLYPHS_JS, _launch, skip_without_cjk_font
from test_site import PAGES, _close, built_site, clipfrac_by_algos, live_clip_explorer

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
TIMEOUT_MS = 30_000

_FIGURES_DRAWN_JS = """
() => Array.from(document.querySelectorAll('.figure')).map(d => !!d.querySelector('.main-svg') && !!d.data)
"""

# The explorer's batch figure (its second) as plotly.js holds it, and the readout's pg_clipfrac.
_EXPLORER_JS = """
() => {
  const box = document.querySelector('.explorer');
  const figs = box.querySelectorAll('.figure[data-slot]');
  const gd = figs[1];
  const readout = box.querySelector('[data-hslot="0"]').textContent;
  const m = readout.match(/pg_clipfrac = ([0-9.]+)/);
  return {state: box.dataset.state, red: Array.from(gd.data[1].x || []), clipfrac: m ? parseFloat(m[1]) : null,
          slider: box.querySelector('[data-control="eps_high"] output').textContent};
}
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return built_site(tmp_path_factory)


@pytest.mark.parametrize("rel", PAGES)
@pytest.mark.slow  # the site build (20 s) runs in .ci/run's slow phase, keeping the README command under 10 minutes
def test_site_page_in_browser(site, chromium_path, rel):
    skip_without_cjk_font(rel)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / ("site_zh.png" if rel.startswith("zh/") else "site_en.png")
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = _launch(pw, chromium_path)
        page = browser.new_page(viewport={"width": 1300, "height": 1300})
        try:
            page.set_default_timeout(TIMEOUT_MS)
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto((site / rel).as_uri(), wait_until="load")
            page.wait_for_function("document.body.dataset.rendered === '1'", timeout=TIMEOUT_MS)

            drawn = page.evaluate(_FIGURES_DRAWN_JS)
            assert drawn and all(drawn), f"figures not drawn by plotly.js: {drawn}"
            assert page.locator(".explorer").count() == 1

            before = page.evaluate(_EXPLORER_JS)
            slider = page.locator('.explorer [data-control="eps_high"] input[type=range]')
            slider.scroll_into_view_if_needed()
            slider.focus()
            # ε_high one grid point up (0.07 → 0.1 unclips two tokens): a real input event, as a visitor's move
            slider.press("ArrowRight")
            page.wait_for_function(f"document.querySelector('.explorer').dataset.state !== {before['state']!r}")
            after = page.evaluate(_EXPLORER_JS)
            assert after["slider"] != before["slider"]

            # the live explorer at the same setting, and ppolab.algos on the recorded batch
            w = live_clip_explorer()
            idx = [int(i) for i in after["state"].split(",")]
            ex = re.search(r'data-explorer="(d\d+)"', (site / rel).read_text(encoding="utf-8")).group(1)
            controls = page.evaluate(f"() => JSON.parse(document.getElementById('{ex}').textContent).controls")
            setting = {c["name"]: c["values"][i] for c, i in zip(controls, idx)}
            for name, v in setting.items():
                w.controls[name].value = v
            assert _close(after["clipfrac"], w.state["pg_clipfrac"], 1e-6), (setting, after["clipfrac"])
            frac, ratios = clipfrac_by_algos(w, setting["eps_low"], setting["eps_high"], setting["opt_step"])
            assert _close(after["clipfrac"], frac, 1e-6)
            red = sorted(after["red"])
            assert len(red) == len(ratios) and all(_close(a, b) for a, b in zip(red, ratios)), (red, ratios)
            assert (before["clipfrac"], sorted(before["red"])) != (after["clipfrac"], red), \
                "moving ε_high did not change the figure"

            if rel.startswith("zh/"):
                body = page.locator("main").inner_text()
                assert re.search(r"[\u4e00-\u9fff]", body), "no Chinese text on the Chinese page"
                glyphs = page.evaluate(_CJK_GLYPHS_JS)
                assert glyphs["inked"] and glyphs["distinct"] and glyphs["not_box"], (
                    f"Chinese characters are not drawn as glyphs (apt-get install fonts-noto-cjk): {glyphs}")
            page.locator(".explorer").scroll_into_view_if_needed()
            page.screenshot(path=str(shot))
        except BaseException:
            with contextlib.suppress(PlaywrightError):
                page.screenshot(path=str(shot))
            raise
        finally:
            browser.close()
    assert not errors, f"console errors on {rel}: {errors}"
    remote = [u for u in requests if not u.startswith("file://")]
    assert not remote, f"{rel} requested other hosts: {remote}"
    assert any(u.endswith("/assets/plotly.min.js") for u in requests)
    print(f"site page {rel}: {len(drawn)} figures drawn; screenshot {shot}")
