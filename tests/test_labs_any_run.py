"""Every lab runs to its end, without a traceback, on any run ``ppolab.train`` writes (``PPOLAB_RUN``): a section
whose mechanism the run lacks prints one line naming the shipped run that has it, and the lab goes on.

In the matrices each lab is executed with ``PPOLAB_RUN`` set to a run trained here (3 steps, every step recorded, the
presets' shapes otherwise), seven labs to a kernel (:func:`run_lab`); a cell passes when it does not raise (the saved
outputs are the lab's own run's). The default selection executes lab 09 on a fresh GRPO run and reads its lacks
lines; ``-m anyrun`` runs every lab on a fresh run of every CPU preset — grpo_tiny, ppo_gae_tiny,
ppo_fire_tiny (2 ranks, rejection, padding rows, dynamic micro-batches), grpo_temp_tiny (temperature 0.7, an entropy
term) and grpo_tool_tiny (observation tokens attended outside response_mask) — and on a grpo_tiny run of a random
Llama (another model family, no learning signal): 114 lab runs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import FRESH

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted(p.stem for p in (ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
#: A lacks line, as the default selection reads it in lab 09 on a fresh GRPO run (which has no critic).
LACKS = re.compile(r'this run \(.+\) lacks .+; the shipped run \w+ has it — RUN = "\w+"')


@pytest.fixture(scope="session")
def fresh_run(trained_run):
    """``fresh_run(preset)``: a run of ``preset`` trained here at :data:`helpers.FRESH`, once per session (shared
    with the exercise matrix: tests/trained.py)."""
    return lambda preset: trained_run(preset, FRESH)


@pytest.fixture(scope="session")
def fresh_grpo(fresh_run) -> str:
    return fresh_run("grpo_tiny")


#: A code cell tagged so reads nothing of ``PPOLAB_RUN``: lab 00's cells that train the learner's own 8-step run
#: (and one in the background) and read it back. What they do is the same on every run under test, so the matrices
#: run them once (on grpo_tiny) and skip them on the other five fresh runs and the realistic one (~16 s a case here).
OWN_RUN_TAG = "own-run"


#: Run first in a kernel whose labs are checked for copyable answers (:func:`run_lab`): ``ppolab.exercises.check``
#: wrapped so every call also computes its exercise's truth with the call's own context — at the cell that asks —
#: and keeps the numbers it holds. The labs import ``check`` after it.
RECORD_TRUTHS = """\
import ppolab.exercises


def _install(ex):  # closures, not globals: each lab's %reset -f empties the user namespace
    plain = ex.check

    def numbers(x):
        if hasattr(x, "tolist"):
            x = x.tolist()
        if isinstance(x, bool) or x is None or isinstance(x, str):
            return []
        if isinstance(x, (int, float)):
            return [float(x)]
        if isinstance(x, dict):
            return [v for y in x.values() for v in numbers(y)]
        if isinstance(x, (list, tuple)):
            return [v for y in x for v in numbers(y)]
        return []

    def check(id, answer, **context):
        verdict = plain(id, answer, **context)
        try:
            e = ex.registry()[id]
            value = e.compute(**ex._accepted(e.compute, context))
        except Exception:  # a run that lacks the mechanism: no truth to copy
            return verdict
        ex._truths_seen.append({"id": id, "values": numbers(value)})
        return verdict

    ex._truths_seen = []
    ex.check = check


if not hasattr(ppolab.exercises, "_truths_seen"):
    _install(ppolab.exercises)
"""
TRUTHS_MARK = "TRUTHS-SEEN:"
#: (exercise, printed number to 4 decimals) → why a number the executed lab printed before the exercise is another
#: quantity that happens to lie within the exercise's tolerance on the run of the matrix (as
#: tests/test_no_copyable_answers.py's COINCIDENCES for the stored outputs).
EXECUTED_COINCIDENCES = {
    ("15.5", 0.2322): "the fresh grpo_tiny run's advantage mean per token at step 3 (lab 15's signal table) lies "
                      "0.07 % from ppo_fire_tiny's truth 0.23206 — 15.5 reads ppo_fire_tiny where the learner's run "
                      "logs no actor/entropy_loss",
    ("15.5", 0.232): "the same on the fresh grpo_tool_tiny run: a number of lab 15's signal table there (0.23197, "
                     "also shown rounded as 0.232) lies 0.04 % from ppo_fire_tiny's truth 0.23206, which 15.5 reads "
                     "where the learner's run logs no actor/entropy_loss",
}


def copyable_answers(combined, owner: list[tuple[str, int]]) -> list[str]:
    """Each exercise a lab asked (its truth recorded by :data:`RECORD_TRUTHS`) that a number printed before it — in the
    outputs of the lab's earlier cells, or in its markdown above — answers within the exercise's tolerance (an answer
    of several values only when every one of them is printed; integers are not offered: counts appear in any text
    about a run; the COINCIDENCES of tests/test_no_copyable_answers.py and :data:`EXECUTED_COINCIDENCES` excepted).
    The check the stored-outputs test cannot make for a lab that stores none (lab 18), on the run the lab ran on."""
    import json as _json

    import nbformat
    from test_no_copyable_answers import COINCIDENCES, NUMBER

    from ppolab.exercises import matches, registry

    reg = registry()
    last = "".join(o.get("text", "") for o in combined.cells[-1].get("outputs", []))
    seen = _json.loads(last.split(TRUTHS_MARK, 1)[1]) if TRUTHS_MARK in last else []
    markdown: dict[str, list[str]] = {}
    out = []
    for rec in seen:
        # the cell that asks: the one whose code calls check on the exercise
        calls = (f'check("{rec["id"]}"', f"check('{rec['id']}'")
        j = next((i for i, c in enumerate(combined.cells) if any(k in c.source for k in calls)), None)
        if j is None:
            continue
        lab, cell = owner[j]
        if lab not in markdown:
            markdown[lab] = [c.source if c.cell_type == "markdown" else ""
                             for c in nbformat.read(ROOT / "labs" / f"{lab}.ipynb", as_version=4).cells]
        text = "".join(markdown[lab][:max(cell, 0)])
        for k in range(j):
            if owner[k][0] == lab:
                for o in combined.cells[k].get("outputs", []):
                    data = o.get("data", {})
                    text += "".join(o.get("text", "")) + "".join(data.get(m, "") for m in
                                                                  ("text/plain", "text/markdown", "text/html"))
        shown = {float(m) for m in NUMBER.findall(text)}
        ex = reg[rec["id"]]
        values = [v for v in rec["values"] if abs(v - round(v)) > 1e-6]
        accepted = {v: [c for c in shown if (rec["id"], c) not in COINCIDENCES
                        and (rec["id"], round(c, 4)) not in EXECUTED_COINCIDENCES and matches(c, v, ex.rel, ex.abs)]
                    for v in values}
        # an answer of several values (a dict, a pair, a tensor) is checked as a whole: copyable when every one is
        if values and (all(accepted.values()) if len(rec["values"]) > 1 else any(accepted.values())):
            printed = sorted({c for a in accepted.values() for c in a})[:3]
            out.append(f"{rec['id']} ({lab}, cell {cell}): printed before it {printed} answer its truth {values[:3]}")
    return out


def run_lab(lab: str | tuple[str, ...], run: str, skip_own_run: bool = False,
            copy_check: bool = False) -> str:
    """Every code cell of ``labs/<lab>.ipynb`` (or of each lab of a tuple, in order) executed with
    ``PPOLAB_RUN=run`` in one kernel, the user namespace emptied (``%reset -f``) before each lab: fails with the lab,
    the cell and its traceback at the first cell that raises; returns one line per lab (its wall time).

    One kernel for the group, not one per notebook as nbval starts them: a kernel's start and the imports every lab
    begins with (torch, transformers, plotly, ppolab) cost about 4 s on 2 cores — 19 labs × 8 runs of the matrices
    paid them 150 times. What this matrix checks is that no cell raises on a run the lab was not written for (the
    root conftest makes every cell lax under ``PPOLAB_RUN``: the saved outputs are the lab's own run's); that each
    lab runs in a kernel of its own, from a clean start, the README command's nbval pass checks on the shipped runs.
    ``skip_own_run``: leave out the cells tagged :data:`OWN_RUN_TAG`. ``copy_check``: fail if a number printed
    before an exercise answers it (:func:`copyable_answers`)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    labs = (lab,) if isinstance(lab, str) else tuple(lab)
    combined = nbformat.v4.new_notebook()
    owner = []  # combined cell index → (lab, its cell index)
    if copy_check:
        combined.cells.append(nbformat.v4.new_code_cell(RECORD_TRUTHS))
        owner.append((labs[0], -1))
    for name in labs:
        nb = nbformat.read(ROOT / "labs" / f"{name}.ipynb", as_version=4)
        combined.cells.append(nbformat.v4.new_code_cell("%reset -f\nimport time as _t\n_T0_ = _t.time()"))
        owner.append((name, -1))
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and not (skip_own_run and OWN_RUN_TAG in cell.metadata.get("tags", [])):
                combined.cells.append(nbformat.v4.new_code_cell(cell.source))
                owner.append((name, i))
        combined.cells.append(nbformat.v4.new_code_cell(f"print('{name}: %.0f s' % (_t.time() - _T0_))"))
        owner.append((name, -1))
    if copy_check:
        combined.cells.append(nbformat.v4.new_code_cell(
            f"import json, ppolab.exercises\nprint({TRUTHS_MARK!r} + json.dumps(ppolab.exercises._truths_seen))"))
        owner.append((labs[-1], -1))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env["PPOLAB_RUN"] = run
    client = NotebookClient(combined, timeout=1200, resources={"metadata": {"path": str(ROOT / "labs")}})
    try:
        client.execute(env=env)
    except CellExecutionError as e:
        ran = [i for i, c in enumerate(combined.cells) if c.get("execution_count")]
        name, cell = owner[ran[-1]] if ran else (labs[0], -1)
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # the traceback's colours
        pytest.fail(f"{name} on {run}, cell {cell}:\n{text[-6000:]}")
    if copy_check:
        copied = copyable_answers(combined, owner)
        assert not copied, f"on {run}, a number printed before an exercise answers it:\n" + "\n".join(copied)
    return "".join(o.get("text", "") for c in combined.cells if "_T0_" in c.source and "print" in c.source
                   for o in c.get("outputs", []))


#: Labs per kernel in the matrices: a kernel's start and the first imports cost about 4 s on 2 cores, as much as a
#: short lab; in groups of seven (7, 7, 5 of the 19 labs) it is paid three times a run instead of 19, and the 21 cases
#: of the two matrices still spread over the workers.
GROUP = 7


def lab_groups(labs: list[str]) -> list[tuple[str, ...]]:
    """``labs`` in order, :data:`GROUP` at a time."""
    return [tuple(labs[i:i + GROUP]) for i in range(0, len(labs), GROUP)]


def group_id(group: tuple[str, ...]) -> str:
    """A matrix case's name for a group: its first and last lab numbers (``00-03``)."""
    return f"{group[0][:2]}-{group[-1][:2]}"


def lacks_lines(lab: str, run: str) -> list[str]:
    """The lab executed on ``run`` (nbclient; an error in any cell raises): every printed line that says what the
    run lacks."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "labs" / f"{lab}.ipynb", as_version=4)
    os.environ["PPOLAB_RUN"] = run
    try:
        NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(ROOT / "labs")}}).execute()
    finally:
        del os.environ["PPOLAB_RUN"]
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    return [ln for ln in text.splitlines() if " lacks " in ln and "RUN = " in ln]


def test_a_lab_the_run_lacks_says_so_in_one_line_per_section(fresh_grpo):
    lines = lacks_lines("09_clipped_value_loss", fresh_grpo)
    assert lines and all(LACKS.fullmatch(ln) for ln in lines), lines
    assert any("lacks a critic" in ln and 'RUN = "ppo_fire_tiny"' in ln for ln in lines), lines


#: The fresh runs every lab runs on (``-m anyrun``), one of every preset that trains on a CPU: ppo_fire_tiny's
#: rejection rewrites response_mask after stage 4 (lengths, entropy and probability gaps are logged over the mask as
#: generated) and it cuts micro-batches by a token budget; grpo_tool_tiny's observations change a forward's attention,
#: a stage's mask and a micro-batch split.
#: And every lab on a learner's own model of another family: grpo_tiny on a random Llama (tests/trained.py::
#: build_random_llama), where nothing is learned — every reward and advantage 0, no clip, no gradient.
#: The fresh runs whose labs also run the executed anti-copy check (:func:`run_lab`'s ``copy_check``).
COPY_CHECKED = ("grpo_tiny", "ppo_gae_tiny", "ppo_fire_tiny", "grpo_temp_tiny", "grpo_tool_tiny")
MATRIX = [(preset, group) for preset in ("grpo_tiny", "ppo_gae_tiny", "ppo_fire_tiny", "grpo_temp_tiny",
                                         "grpo_tool_tiny", "random_llama")
          for group in lab_groups(LABS)]


@pytest.mark.anyrun
@pytest.mark.spread
@pytest.mark.parametrize("preset, lab", MATRIX, ids=[f"{p}-{group_id(g)}" for p, g in MATRIX])
def test_every_lab_on_a_fresh_run(preset, lab, fresh_run, request):
    if "anyrun" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("every lab on six fresh runs (about 12 min on 2 cores): select it with -m anyrun")
    t = time.time()
    # the grpo_tiny and ppo_gae_tiny cases also execute the anti-copy check (every number printed before an exercise
    # against its truth on that run — ppo_gae_tiny's for the critic's exercises): the stored-outputs test cannot see
    # a lab that stores none
    run_lab(lab, request.getfixturevalue("fresh_llama_run") if preset == "random_llama" else fresh_run(preset),
            skip_own_run=preset != "grpo_tiny", copy_check=preset in COPY_CHECKED)
    print(f"{', '.join(lab)} on a fresh {preset} run: {time.time() - t:.0f} s")


def test_has_find_and_the_lacks_line(capsys):
    from ppolab.i18n import set_language
    from ppolab.numbers import find, has
    from ppolab.numbers.cases import clip_case, critic_case

    assert has("ppo_fire_tiny", "critic", shipped="ppo_fire_tiny") and not capsys.readouterr().out
    assert not has("grpo_tiny", "critic", shipped="ppo_fire_tiny")
    assert capsys.readouterr().out == ("this run (grpo_tiny) lacks a critic (critic_vpreds: "
                                       "algorithm.adv_estimator=gae); the shipped run ppo_fire_tiny has it — "
                                       'RUN = "ppo_fire_tiny"\n')
    assert find(critic_case, "grpo_tiny", shipped="ppo_fire_tiny", show=False) is None
    assert not capsys.readouterr().out
    case = find(clip_case, "ppo_fire_tiny", (24, 8), shipped="ppo_fire_tiny")
    assert (case["step"], case["opt_step"]) == (24, 8)
    assert capsys.readouterr().out == "case in this run: recorded step 24, optimizer step 8\n"
    set_language("zh")
    try:
        assert not has("grpo_tiny", "critic", shipped="ppo_fire_tiny")
        line = capsys.readouterr().out
        assert "缺少" in line and line.endswith(' — RUN = "ppo_fire_tiny"\n'), line
    finally:
        set_language("en")


def test_lab_pair_puts_the_run_in_its_configurations_place(monkeypatch):
    from ppolab.numbers import lab_pair

    monkeypatch.delenv("PPOLAB_RUN", raising=False)
    assert lab_pair(("grpo_tiny", "ppo_gae_tiny")) == ("grpo_tiny", "ppo_gae_tiny")
    monkeypatch.setenv("PPOLAB_RUN", "ppo_fire_tiny")
    assert lab_pair(("grpo_tiny", "ppo_gae_tiny")) == ("grpo_tiny", "ppo_fire_tiny")
    monkeypatch.setenv("PPOLAB_RUN", "grpo_tool_tiny")
    assert lab_pair(("grpo_tiny", "ppo_gae_tiny")) == ("grpo_tool_tiny", "ppo_gae_tiny")


#: The realistic-shape run the matrix reads: bench/realistic_shape.py at a quarter of its benchmark's rows (16 × 256
#: tokens, 2 ranks, 2 steps). It keeps what the labs read at a real width — the 151,936-token vocabulary, the BPE
#: tokenizer, the fused head's log-probs and entropy (4 rows × 257 positions a micro-batch over 151,936 tokens, no
#: logits made), one group of 4 rows for lab 13's bounded replay — with responses of
#: several lengths at step 1 (an EOS at token 141 in its first group), so lab 13's broken normaliser shows. About
#: 1 min on 2 cores (the model's SFT half of it); the script's default stays the 64 × 256 benchmark.
REALISTIC_SHAPE = ["--rows", "16", "--response-length", "256", "--ranks", "2", "--steps", "2"]


@pytest.fixture(scope="session")
def realistic_run(tmp_path_factory) -> str:
    """The run of ``bench/realistic_shape.py`` at :data:`REALISTIC_SHAPE`: ``PPOLAB_REALISTIC_RUN=DIR`` reuses one
    already made, else it is built here once for every xdist worker (``tests/trained.py``)."""
    from trained import build_once, shared_root

    given = os.environ.get("PPOLAB_REALISTIC_RUN")
    if given:
        if not (Path(given) / "config.json").is_file():
            pytest.fail(f"PPOLAB_REALISTIC_RUN={given!r} is not a ppolab run dir (no config.json)")
        return given

    def make(out: Path) -> None:
        subprocess.run([sys.executable, "bench/realistic_shape.py", "--out", str(out), *REALISTIC_SHAPE], cwd=ROOT,
                       check=True, timeout=3600)

    out = build_once(shared_root(tmp_path_factory, keep=False), "realistic-shape", make)
    return str(next(p.parent for p in out.rglob("config.json") if (p.parent / "steps").is_dir()))


@pytest.mark.realistic
@pytest.mark.spread
@pytest.mark.parametrize("lab", lab_groups(LABS), ids=group_id)
def test_every_lab_on_the_realistic_shape_run(lab, request):
    """Issue 23 §5 (c): every lab runs to its end on a real model's shape. Kept out of the README command by its
    marker; ``.ci/run`` selects it."""
    if "realistic" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("every lab on the realistic-shape run (about 4 min): select it with -m realistic")
    t = time.time()
    run_lab(lab, request.getfixturevalue("realistic_run"), skip_own_run=True)
    print(f"{', '.join(lab)} on the realistic-shape run: {time.time() - t:.0f} s")


def test_cells_the_matrices_run_once_read_nothing_of_the_run_under_test():
    """A cell tagged ``own-run`` is skipped on all but one run of the matrices: it must not read the lab's run (the
    names ``RUN``/``run`` or ``PPOLAB_RUN``), or a run it fails on would go unseen. Lab 00's training cells are
    tagged (else each matrix case trains them again)."""
    import nbformat

    tagged = {}
    for path in sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if OWN_RUN_TAG in cell.metadata.get("tags", []):
                tagged[(path.stem, i)] = cell.source
    assert any(lab == "00_start_here" and "live_training(" in src for (lab, _), src in tagged.items()), tagged.keys()
    for (lab, i), src in tagged.items():
        assert not re.search(r"(?<![.\w])(RUN|run|PPOLAB_RUN)\b(?!=)", src), f"{lab} cell {i}: tagged, reads the run"


def test_a_labs_first_cell_lists_every_shipped_run_where_it_lists_them():
    """Issue 52: cell 1 of six labs named two of the six shipped runs a learner can point RUN at."""
    import nbformat

    from ppolab.run.reader import SHIPPED_RUNS

    for path in sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb")):
        first = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code").source
        if "A shipped run (" in first and "…)" not in first:  # "(…, …)": a few named for the lab, on purpose
            missing = [name for name in SHIPPED_RUNS if f'"{name}"' not in first]
            assert not missing, f"{path.name}'s first cell lists shipped runs but not {missing}"


def test_the_executed_copy_check_fails_on_a_planted_printed_answer():
    """Issue 52: the anti-copy check of the executed labs (``run_lab(…, copy_check=True)``) names an exercise whose
    truth a cell before it printed — here a planted print in front of lab 18's 18.4 — and passes when nothing
    printed answers it."""
    import json

    import nbformat

    from ppolab.exercises import registry

    def executed(printed: str, truth: float) -> tuple:
        nb = nbformat.v4.new_notebook()
        cells = [("", None), (printed, 1), ("check('18.4', ...)", 2),
                 ("", json.dumps([{"id": "18.4", "values": [truth]}]))]
        for i, (text, extra) in enumerate(cells):
            cell = nbformat.v4.new_code_cell("check('18.4', answer, run=RUN)" if i == 2 else "")
            if i in (1, 2):
                cell["execution_count"] = extra
                cell["outputs"] = [nbformat.v4.new_output("stream", name="stdout", text=text + "\n")]
            if i == 3:
                cell["outputs"] = [nbformat.v4.new_output("stream", name="stdout", text=TRUTHS_MARK + extra + "\n")]
            nb.cells.append(cell)
        lab = "18_where_the_update_went"
        return nb, [(lab, -1), (lab, 3), (lab, 4), (lab, -1)]

    tol = registry()["18.4"]
    value = 0.4137
    planted = executed(f"loss of the step: {value * (1 + tol.rel / 10):.6g}", value)
    found = copyable_answers(*planted)
    assert len(found) == 1 and found[0].startswith("18.4 (18_where_the_update_went, cell 4)"), found
    assert copyable_answers(*executed("loss of the step: 0.9", value)) == []
    assert copyable_answers(*executed("40 rows, 7 optimizer steps", 7.0)) == []  # an integer truth is not offered
