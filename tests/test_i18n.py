"""The widgets and exercise checks speak the notebook's language: ``set_language("zh")`` turns every title, axis
label, trace name, annotation, control description and readout of every explorer into Chinese, leaving only
config keys, metric names, numbers and a short list of terms the chapter itself writes in English."""
from __future__ import annotations

import functools
import re

import ipywidgets as W
import plotly.graph_objects as go
import pytest

import ppolab.exercises as exercises
import ppolab.i18n as i18n
import ppolab.widgets as widgets
from ppolab.i18n import get_language, set_language, tr

# Words the chapter (and so the Chinese labs) writes in English; everything else English must be an identifier
# (config key, metric name, file::function — it has _ / . or ::), a function call "exp(", or a number.
ALLOWED = {
    "token", "tokens", "mini-batch", "micro-batch", "batch", "epoch", "prompt", "response", "rollout",
    "PPO", "GRPO", "GAE", "KL", "LoRA", "verl", "ppolab", "vLLM", "IS", "bf16", "fp32", "NaN", "inf", "log", "exp",
    "clip", "min", "max", "mean", "std", "Var", "sech", "ref", "old", "rollout_is", "autograd", "dual-clip",
    "clip-higher", "DAPO", "REINFORCE", "padding", "Bernoulli", "dual", "lab", "actor", "critic", "logits",
    "logprob", "rank", "local", "micro",
    # the chapter writes these in English inside Chinese sentences too ("reward 侧 KL", "log-prob"), and so does
    # labs/GLOSSARY.md; "logit" is the singular of "logits"
    "reward", "log-prob", "logit",
    "Karmarkar", "Karp",  # a name (Karmarkar–Karp balancing)
    "TRL", "OpenRLHF",  # two trainers' names (lab 13's three trainers)
    "True", "False", "None", "nan",  # Python literals and a float as Python prints them
    # terms the chapter keeps in English (labs/GLOSSARY.md, with the chapter's counts; issue 25)
    "advantage", "advantages", "ratio", "log-ratio", "entropy", "mask", "loss", "optimizer", "step", "value",
    "temperature", "estimator", "controller", "adaptive", "reward-side", "loss-side", "tool", "observation",
    "policy", "policy-gradient", "rejection", "trainer", "fraction", "bonus",
    "reference",  # "reference KL" (the chapter: 14 times, 参考 KL never)
    "agent",  # "tool agent" (the chapter's §14.2 keeps agent in English)
    "run",  # ppolab's recorded training run ("该 run", labs/GLOSSARY.md)
    # more terms the chapter keeps in English (labs/GLOSSARY.md): engine 30, forward 17, budget 4, shaping 3,
    # padded 2 ("padded horizon"), wave 2, DP 4 ("DP rank"), surrogate 2, tensor 1; and the labs' own words
    # "attend" (the chapter: 参与 attention) and "adapter" (LoRA adapter)
    "engine", "forward", "budget", "shaping", "padded", "wave", "DP", "surrogate", "tensor", "attend", "adapter",
    # and the forms issue 35 asked for (labs/GLOSSARY.md): global mini-batch 5, dynamic batching 4, synthetic padding
    # 行 2, score, clamp 9
    "global", "dynamic", "batching", "synthetic", "score", "clamp",
    "worker",  # verl's trainer/worker split (the chapter: worker 23)
    "GPU",  # the hardware (the chapter writes GPU 3 times, never 显卡)
}


@functools.lru_cache(maxsize=1)
def _config_values() -> frozenset[str]:
    """Values a config key takes (loss_agg_mode, loss_mode, kl_penalty, adv_estimator): names, not prose."""
    from ppolab import algos

    names = set(algos.LOSS_AGG_MODES) | set(algos.POLICY_LOSS_REGISTRY) | set(algos.KL_PENALTY_TYPES)
    names |= set(getattr(algos, "ADV_ESTIMATOR_REGISTRY", {}))
    return frozenset(names)
_TAGS = re.compile(r"<[^>]+>|&[a-z]+;")
# Not prose either: a format field ({id}, %{text}) and a config assignment written without spaces
# (loss_type=reinforce, adv_estimator=grpo), whose value is a name.
# A <code> holding one token (<code>rows</code>, a details key) is a name as well.
_NOT_PROSE = re.compile(r"%?\{[^{}]*\}|\b[A-Za-z_][\w.]*=[\w.+\-]+|<code>[^<\s]+</code>")
_WORD = re.compile(r"(?<![A-Za-z0-9_α-ωΑ-Ω])[A-Za-z][A-Za-z0-9_./:\-]*(?:\()?")
_CJK = r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]"


def english_words(text: str) -> list[str]:
    """The words of ``text`` that are English prose: not identifiers, not calls, not allowed terms."""
    words = []
    for w in _WORD.findall(_TAGS.sub(" ", _NOT_PROSE.sub(" ", text))):
        core = w.rstrip("(.:-")
        if w.endswith("(") or any(c in core for c in "_/.:") or re.search(r"\d", core):
            continue
        if re.search(r"[a-z][A-Z]", core):  # CamelCase: a class name (ConfigNotice, AdaptiveKLController)
            continue
        if len(core) < 2 or core in ALLOWED or core.lower() in ALLOWED or core in _config_values():
            continue
        words.append(core)
    return words


def texts(obj, seen=None) -> list[str]:
    """Every user-visible string of an explorer: control descriptions, HTML/Label values, button texts,
    figure titles, axis titles, annotations, trace names, and a trace's strings (bar texts, hover texts,
    category labels)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    out: list[str] = []
    if isinstance(obj, go.FigureWidget | go.Figure):
        lay = obj.layout
        out.append(lay.title.text or "")
        for key in lay:
            if key.startswith(("xaxis", "yaxis")) and lay[key] is not None and lay[key].title is not None:
                out.append(lay[key].title.text or "")
        out += [a.text or "" for a in lay.annotations or ()]
        if lay.legend is not None and lay.legend.title is not None:
            out.append(lay.legend.title.text or "")
        for t in obj.data:
            out.append(t.name or "")
            for attr in ("text", "hovertext", "x", "y"):
                v = getattr(t, attr, None)
                # a numeric trace may hold a numpy array (no truth value): only its strings matter here
                out += [v] if isinstance(v, str) else [s for s in (() if v is None else v) if isinstance(s, str)]
        return out
    if isinstance(obj, W.Widget):
        for attr in ("description", "tooltip"):
            out.append(getattr(obj, attr, "") or "")
        if isinstance(obj, W.HTML | W.Label | W.HTMLMath):
            out.append(obj.value or "")
        for child in getattr(obj, "children", ()):
            out += texts(child, seen)
    for fig in (getattr(obj, "figures", None) or {}).values():
        out += texts(fig, seen)
    return out


def move_every_control(w) -> None:
    """Move each control once, so the readouts and titles an update writes are checked too."""
    for c in (getattr(w, "controls", None) or {}).values():
        try:
            if isinstance(c, W.IntSlider | W.FloatSlider | W.SelectionSlider):
                c.value = c.max if hasattr(c, "max") and c.value != c.max else getattr(c, "min", c.value)
            elif hasattr(c, "options") and len(c.options) > 1:
                opts = [o[1] if isinstance(o, tuple) else o for o in c.options]
                c.value = next(o for o in opts if o != c.value)
            elif isinstance(c, W.Checkbox | W.ToggleButton):
                c.value = not c.value
        except Exception:  # noqa: BLE001 — a control whose move is refused keeps its value; its text is still read
            pass


def _explorers():
    from ppolab.widgets.gradients import gradient_gallery
    from ppolab.widgets.kl import exact_kl_explorer
    from ppolab.widgets.metrics import distribution_figure

    return {
        "ratio_explorer": lambda: widgets.ratio_explorer("grpo_tiny"),
        "clip_explorer": lambda: widgets.clip_explorer("ppo_fire_tiny", step=24, opt_step=8),
        "dual_clip_explorer": lambda: widgets.dual_clip_explorer("ppo_fire_tiny"),
        "loss_assembly": lambda: widgets.loss_assembly("grpo_tiny"),
        "gradient_gallery": lambda: gradient_gallery("ppo_fire_tiny"),
        "kl_explorer": lambda: widgets.kl_explorer("ppo_fire_tiny"),
        "exact_kl_explorer": lambda: exact_kl_explorer("grpo_tiny"),
        "value_clip_explorer": lambda: widgets.value_clip_explorer("ppo_fire_tiny"),
        "mask_viewer": lambda: widgets.mask_viewer("grpo_tool_tiny"),
        "aggregation_explorer": lambda: widgets.aggregation_explorer("ppo_fire_tiny"),
        "batch_calculator": lambda: widgets.batch_calculator("grpo_tiny"),
        "metrics_dashboard": lambda: widgets.metrics_dashboard("ppo_fire_tiny"),
        "distribution_figure": lambda: distribution_figure("grpo_tiny"),
        "live_training": lambda: widgets.live_training(overrides=["trainer.total_training_steps=1"]),
        "mistakes_explorer": lambda: widgets.mistakes_explorer("ppo_fire_tiny"),
        "invariance_explorer": lambda: widgets.invariance_explorer("grpo_tiny"),
        "trainers_explorer": lambda: widgets.trainers_explorer("grpo_tiny"),
        "update_effect_explorer": lambda: widgets.update_effect_explorer("ppo_fire_tiny"),
        "ablation_curves": lambda: widgets.ablation_curves("grpo_tiny"),
    }


@pytest.fixture
def zh():
    set_language("zh")
    yield
    set_language("en")


def test_language_switch_and_its_errors():
    assert get_language() == "en"
    with pytest.raises(ValueError, match="'en', 'zh'"):
        set_language("fr")
    assert widgets.set_language is set_language and exercises.set_language is set_language
    set_language("zh")
    try:
        assert get_language() == "zh" and tr("rows") != "rows"
    finally:
        set_language("en")


def test_tr_is_the_identity_in_english():
    for text in list(i18n._zh())[:50] + ["row 3, opt step 2", "anything at all", ""]:
        assert tr(text) == text


def test_pieces_translate_whole_words_only(zh):
    # an f-string's output is translated piece by piece; identifiers that contain a key stay as they are
    out = tr("rows = 8, n_rows = 2, actor/pg_clipfrac")
    assert "n_rows" in out and "actor/pg_clipfrac" in out and not out.startswith("rows")


def test_table_has_no_english_values():
    # no value keeps English prose, not even next to Chinese (a half-translated entry)
    bad = {k: english_words(v) for k, v in i18n._zh().items() if english_words(v)}
    assert not bad, bad


def test_the_prose_detector_sees_english():
    # the checks below are only as strict as english_words: it must flag prose and pass identifiers and terms
    assert english_words("the clip took the weight out of the sum") == ["the", "took", "the", "weight", "out", "of",
                                                                        "the", "sum"]
    assert english_words("actor/pg_clipfrac = 0.2, loss_type=reinforce, {id}: 裁剪 token ConfigNotice exp(") == []


def punctuation_left(strings) -> dict[str, list[str]]:
    """{text: its punctuation problems (labs/GLOSSARY.md, 标点)} for every rendered text that has any. A rendered
    text is a whole sentence, not a fragment, so its brackets must pair up in one kind."""
    from test_zh_terms import punct_problems

    return {t: p for t in strings if (p := punct_problems(t))}


@pytest.mark.parametrize("name", sorted(_explorers()))
def test_explorer_speaks_chinese(name, zh):
    """No English prose after the controls moved, and the glossary's punctuation in every text before and after
    (a readout built from English fragments keeps their half-width brackets and colons: issue 25)."""
    w = _explorers()[name]()
    bad = punctuation_left(texts(w))
    move_every_control(w)
    left = {t: english_words(t) for t in texts(w) if english_words(t)}
    assert not left, f"{name}: English left in {len(left)} text(s): " + "\n".join(
        f"{words} in {t[:200]!r}" for t, words in list(left.items())[:15])
    bad.update(punctuation_left(texts(w)))
    assert not bad, f"{name}: punctuation problems in {len(bad)} text(s): " + "\n".join(
        f"{p} in {t[:200]!r}" for t, p in list(bad.items())[:15])


def _english_left(w) -> dict[str, list[str]]:
    return {t: english_words(t) for t in texts(w) if english_words(t)}


def test_every_mistake_speaks_chinese(zh):
    """All nine mistakes, off and on: title, switch, both labels, the explanation, the quantity, the detail axis."""
    w = widgets.mistakes_explorer("ppo_fire_tiny")
    left = {}
    for key in w.controls["mistake"].options:
        w.controls["mistake"].value = key[1]
        labels = [t for t, _ in w.controls["mistake"].options]
        for on in (True, False):
            w.controls["on"].value = on
            left.update(_english_left(w))
            left.update({t: english_words(t) for t in labels + list(w.figures["effect"].data[0].x)
                         if english_words(t)})
    assert not left, "\n".join(f"{words} in {t[:200]!r}" for t, words in list(left.items())[:15])


def test_every_metric_meaning_and_warning_sign_speaks_chinese(zh):
    """Every metric meaning, and every chapter §15 warning sign, fired on made-up metric curves."""
    import math

    import pandas as pd

    from ppolab.widgets.metrics import METRIC_MEANINGS, meaning, sign_text, warning_signs

    lines = [tr(v) for v in METRIC_MEANINGS.values()] + [tr(meaning("no/such/metric"))]
    steps = range(1, 21)
    late = [i > 10 for i in steps]
    wild = pd.DataFrame({  # every sign at once
        "actor/pg_loss": [math.nan] + [0.1] * 19, "actor/pg_clipfrac": [0.5] * 20, "actor/ppo_kl": [0.2] * 20,
        "actor/pg_clipfrac_lower": [0.2] * 20, "actor/entropy": [2.0] * 10 + [0.01] * 10,
        "actor/grad_norm": [1.0] * 19 + [100.0], "response_length/clip_ratio": [0.5] * 20,
        "critic/vf_clipfrac": [0.6] * 20, "actor/kl_loss": [1.0] * 20, "actor/kl_coef": [1.0] * 20,
        "critic/vf_loss": [10.0] * 20, "critic/returns/max": [1.0] * 20, "critic/returns/min": [0.0] * 20,
        "training/rollout_probs_diff_mean": [0.1] * 20, "critic/vf_explained_var": [-1.0 if x else 0.5 for x in late],
        "critic/score/mean": [1.0] * 20, "critic/score/min": [1.0] * 20, "critic/score/max": [1.0] * 20,
    }, index=list(steps))
    still = pd.DataFrame({  # the other branches: a clip fraction stuck at 0, scores NaN or equal within each step
        "actor/pg_clipfrac": [0.0] * 20, "critic/score/mean": [math.nan] + [float(i) for i in steps][1:],
        "critic/score/min": [float(i) for i in steps], "critic/score/max": [float(i) for i in steps],
    }, index=list(steps))
    signs = [warning_signs(wild), warning_signs(still)]
    assert len(signs[0]) >= 12 and len(signs[1]) >= 3, signs  # the made-up curves do fire the signs
    # as metrics_dashboard shows them: each sign through its own whole zh template, not English pieces
    assert [s for s in signs[0] + signs[1] if tr(s.template) == s.template] == []
    shown = [sign_text(s) for s in signs[0] + signs[1]]
    lines += shown
    left = {t: english_words(t) for t in lines if english_words(t) or not re.search(_CJK, t)}
    assert not left, "\n".join(f"{words} in {t[:200]!r}" for t, words in list(left.items())[:15])
    bad = punctuation_left(shown)
    assert not bad, "\n".join(f"{p} in {t[:200]!r}" for t, p in list(bad.items())[:15])


@pytest.mark.slow  # every exercise's check in Chinese (10 s)
def test_exercise_checks_speak_chinese(zh):
    import importlib.util
    from pathlib import Path

    reg = exercises.registry()
    for i in reg:
        assert re.search(_CJK, exercises.prompt(i)), f"{i}: no Chinese prompt"
        hints = exercises.hints(i)
        assert len(hints) == len(reg[i].hints), i
        assert all(re.search(_CJK, h) or h == e for h, e in zip(hints, reg[i].hints)), i
    ex_id = "04.1"  # a wrong answer gets the first Chinese hint, an unanswered one a Chinese message
    path = Path(__file__).resolve().parents[1] / "labs" / "solutions" / "04.py"
    spec = importlib.util.spec_from_file_location("solutions_04", path)
    sol = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sol)
    exercises.reset(ex_id)
    assert re.search(_CJK, exercises.check(ex_id, ...).message)
    wrong = exercises.check(ex_id, sol.WRONG[ex_id][0])
    assert not wrong.ok and exercises.hints(ex_id)[0] in wrong.message and "hint" not in wrong.message
    exercises.reset()


def _tr_of_built_strings(source: str) -> list[int]:
    """Lines where ``tr`` is called on a string built at run time (an f-string, or a sum with one)."""
    import ast

    def built(node) -> bool:
        return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.BinOp) and (built(node.left)
                                                                                     or built(node.right)))
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "tr" and n.args
            and built(n.args[0])]


def test_readouts_are_whole_templates():
    """tr(f"…") translates an f-string's output piece by piece, in English word order with English brackets; a
    readout is tr("… {field} …").format(...) instead, whose Chinese is a sentence of its own (issue 25)."""
    from pathlib import Path

    assert _tr_of_built_strings('tr(f"row {i}")\ntr("a " + f"{b}")\ntr("row {i}").format(i=1)\n') == [1, 2]
    root = Path(__file__).resolve().parents[1] / "ppolab"
    bad = {str(p.relative_to(root)): lines for p in sorted(root.rglob("*.py"))
           if (lines := _tr_of_built_strings(p.read_text(encoding="utf-8")))}
    assert not bad, f"tr() of an f-string (use a whole template): {bad}"
