"""The README introduces and the docs hold the reference (issue 51): every link resolves, the map of the code names
every module, the two set-up commands are the ones ``.ci/run`` runs, and no placeholder is left."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAIN = ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e . && .venv/bin/python -m ppolab.train")
TESTS = ('python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e ".[dev]" && .venv/bin/python -m pytest')


def _links(page: Path) -> list[str]:
    text = re.sub(r"`[^`]*`", "", page.read_text(encoding="utf-8"))  # a link written as code is not a link
    return [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not m.startswith(("http://", "https://", "#"))]


def test_every_link_of_the_readme_and_the_docs_resolves():
    broken = [f"{p.relative_to(ROOT)} → {link}" for p in PAGES for link in _links(p)
              if not (p.parent / link.split("#")[0]).exists()]
    assert not broken, broken
    assert {p.name for p in PAGES[1:]} <= {link.split("/")[-1] for link in _links(README)}, "a docs page no one links"


def test_the_map_names_every_module():
    text = README.read_text(encoding="utf-8")
    table = text[text.index("## Where things are"):text.index("## More")]
    named = set(re.findall(r"[\w/]+\.py|[\w]+/|[\w]+\.json", table))
    modules = {p.name for p in (ROOT / "ppolab").glob("*.py")} | {p.name + "/" for p in (ROOT / "ppolab").iterdir()
                                                                    if (p / "__init__.py").is_file()}
    modules.discard("__init__.py")
    missing = sorted(m for m in modules if not any(n == m or n.endswith("/" + m) for n in named))
    assert not missing, f"README's map lacks {missing}"


def test_the_two_commands_are_there_once_and_ci_runs_the_test_command():
    text = README.read_text(encoding="utf-8")
    assert text.count(MAIN) == 1 and text.count(TESTS) == 1
    assert f"'{TESTS}'" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_no_placeholder_is_left_and_the_readme_stays_an_introduction():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\{[A-Z_]+\}|<owner>|<repo>|TODO", text), page.name
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 160
    image = re.search(r"!\[[^\]]*\]\(([^)]+)\)", README.read_text(encoding="utf-8"))
    assert image and (ROOT / image.group(1)).is_file()
