"""Kernel side of ``tools/build_site.py``: imported by a cell the builder runs first in each lab's kernel.

A widget needs a live kernel, a static page has none. So in the build's kernel (and only there):

* displaying any ipywidget (an explorer, a hand-built box, a bare ``FigureWidget``) shows a reference to it instead
  of the widget view (``REF_MIME``);
* after the cell ran, each widget it displayed is walked (boxes, figures, HTML readouts, controls, Output widgets)
  and shown as a static snapshot (``SNAP_MIME``): its figures as plotly JSON, as they stand after the cell;
* the lab's main explorer (the first displayed widget whose controls include those the builder names) is swept:
  every combination of the named controls' grid values is set on the live explorer, whose own observers recompute
  through ``ppolab.numbers`` / ``ppolab.algos`` exactly as they do on a slider move, and its figures and readouts
  are stored for each combination; the controls are put back where they were;
* an exercise cell (first line ``# EXERCISE NN.k``) also shows the exercise's prompt for the cell's run.

Nothing here edits ``ppolab``: the hooks patch classes in this kernel process only.
"""
from __future__ import annotations

import base64
import itertools
import json
import math
import re
from typing import Any

REF_MIME = "application/vnd.ppolab.widget-ref+json"
SNAP_MIME = "application/vnd.ppolab.widget+json"
EXERCISE_MIME = "application/vnd.ppolab.exercise+json"

_EXERCISE = re.compile(r"^\s*#\s*EXERCISE\s+(\d\d\.\d+)")
_RUN_ARG = re.compile(r"check\(\s*[\"']\d\d\.\d+[\"'][^\n]*?\brun\s*=\s*([A-Za-z_][\w.\[\]\"']*)")

_SHOWN: list[Any] = []  # every widget displayed so far, its index is its ref
_PENDING: list[int] = []  # refs displayed by the running cell
_SPEC: dict[str, Any] = {}  # the main explorer: {"controls": {name: values or count}} (empty: none)
_SWEPT = False
SIG_DIGITS = 6


# ------------------------------------------------------------------------------------------------ JSON
def _decode_typed(obj: dict) -> list:
    import numpy as np

    arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=np.dtype(obj["dtype"]))
    if "shape" in obj:
        shape = obj["shape"]
        shape = [int(s) for s in shape.split(",")] if isinstance(shape, str) else list(shape)
        arr = arr.reshape(shape)
    return arr.tolist()


def compact(obj: Any) -> Any:
    """Plotly JSON made small and plain: typed arrays (``bdata``) decoded to lists, floats to SIG_DIGITS."""
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None
        return float(f"{obj:.{SIG_DIGITS}g}")
    if isinstance(obj, dict):
        if "bdata" in obj and "dtype" in obj:
            return compact(_decode_typed(obj))
        return {k: compact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [compact(v) for v in obj]
    return obj


def figure_json(fig: Any) -> dict:
    import plotly.io as pio

    d = json.loads(pio.to_json(fig, validate=False, engine="json"))
    d.pop("frames", None)
    layout = d.get("layout", {})
    layout.pop("template", None)  # the default template is set once by the page (plotly.js's own)
    return compact({"data": d.get("data", []), "layout": layout})


# ---------------------------------------------------------------------------------------------- walking
def _is_control(w: Any) -> bool:
    import ipywidgets as W

    return isinstance(w, (W.ValueWidget,)) and not isinstance(w, (W.HTML, W.HTMLMath, W.Label, W.Output))


def _label(w: Any) -> str:
    return str(getattr(w, "description", "") or "")


def _value_text(w: Any) -> str:
    v = w.value
    if hasattr(w, "options") and hasattr(w, "label") and w.label is not None:
        return str(w.label)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def walk(w: Any, slots: dict | None = None) -> dict:
    """A static tree of widget ``w``. ``slots`` (if given) collects the figures and readouts in tree order."""
    import ipywidgets as W
    from plotly.basewidget import BaseFigureWidget

    if isinstance(w, BaseFigureWidget):
        node = {"t": "fig", "fig": figure_json(w)}
        if slots is not None:
            node["slot"] = len(slots["figs"])
            slots["figs"].append(w)
        return node
    if isinstance(w, (W.HTML, W.HTMLMath)):
        node = {"t": "html", "v": w.value}
        if slots is not None:
            node["slot"] = len(slots["html"])
            slots["html"].append(w)
        return node
    if isinstance(w, W.Label):
        return {"t": "html", "v": _escape(str(w.value))}
    if isinstance(w, W.Output):
        return {"t": "out", "outputs": [compact(dict(o)) for o in w.outputs]}
    if isinstance(w, W.Button):
        return {"t": "button", "d": _label(w)}
    if isinstance(w, (W.Tab, W.Accordion)):
        titles = [w.get_title(i) if hasattr(w, "get_title") else "" for i in range(len(w.children))]
        return {"t": "box", "dir": "v", "c": [{"t": "box", "dir": "v", "title": t or "", "c": [walk(c, slots)]}
                                             for t, c in zip(titles, w.children)]}
    if isinstance(w, W.Box):
        return {"t": "box", "dir": "h" if isinstance(w, W.HBox) else "v", "c": [walk(c, slots) for c in w.children]}
    if _is_control(w):
        node = {"t": "ctl", "d": _label(w), "v": _value_text(w)}
        if slots is not None:
            node["cslot"] = len(slots["ctls"])
            slots["ctls"].append(w)
        return node
    return {"t": "html", "v": ""}


def _escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _controls(w: Any) -> dict[str, Any]:
    """An explorer's named controls (``.controls``), else every control in the box by its description."""
    named = getattr(w, "controls", None)
    if isinstance(named, dict):
        return {k: c for k, c in named.items() if hasattr(c, "value")}
    found: dict[str, Any] = {}

    def visit(x: Any) -> None:
        if _is_control(x) and _label(x):
            found.setdefault(_label(x), x)
        for c in getattr(x, "children", ()) or ():
            visit(c)

    visit(w)
    return found


# ----------------------------------------------------------------------------------------------- sweep
def grid_values(ctl: Any, spec: Any) -> list:
    """The values a control is swept over: a list as given, or ``n`` values: options (the current one and the
    first others), both states of a toggle, ``n`` evenly spaced slider positions (on its step) plus the current."""
    cur = ctl.value
    if isinstance(spec, list):
        cast = type(cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) else (lambda v: v)
        vals = [cast(v) for v in spec]
        return vals if cur in vals else sorted(vals + [cur]) if all(isinstance(v, (int, float)) for v in vals) \
            else [cur] + vals
    n = int(spec)
    if hasattr(ctl, "options"):
        opts = [o[1] if isinstance(o, tuple) and len(o) == 2 else o for o in ctl.options]
        out = [cur] + [o for o in opts if o != cur]
        return sorted(out[:n], key=opts.index)
    if not hasattr(ctl, "min"):
        return [False, True]
    lo, hi = ctl.min, ctl.max
    vals = set()
    for i in range(n):
        x = lo + (hi - lo) * i / max(1, n - 1)
        if hasattr(ctl, "base"):  # a log slider: min/max are exponents
            x = ctl.base ** x
        elif getattr(ctl, "step", None):
            x = lo + round((x - lo) / ctl.step) * ctl.step
        vals.add(type(cur)(round(x, 10)) if isinstance(cur, float) else int(round(x)))
    vals.add(cur)
    return sorted(vals)


def _label_of(ctl: Any, value: Any) -> str:
    if hasattr(ctl, "options"):
        for o in ctl.options:
            if isinstance(o, tuple) and len(o) == 2 and o[1] == value:
                return str(o[0])
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class _Pool:
    """Content-addressed JSON values: equal trace attributes across grid points are stored once."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._index: dict[str, int] = {}

    def add(self, value: Any) -> int:
        key = json.dumps(value, sort_keys=True, separators=(",", ":"))
        if key not in self._index:
            self._index[key] = len(self.items)
            self.items.append(value)
        return self._index[key]


def _state(slots: dict, pool: _Pool) -> dict:
    figs = []
    for f in slots["figs"]:
        d = figure_json(f)
        figs.append({"data": [{k: pool.add(v) for k, v in tr.items()} for tr in d["data"]],
                     "layout": pool.add(d["layout"])})
    return {"figs": figs, "html": [pool.add(h.value) for h in slots["html"]],
            "ctls": [pool.add(_value_text(c)) for c in slots["ctls"]]}


def sweep(w: Any, spec: dict) -> dict:
    """Every combination of the spec's controls set on the live widget, its figures and readouts after each."""
    controls = _controls(w)
    names = [n for n in spec["controls"] if n in controls]
    ctls = [controls[n] for n in names]
    start = [c.value for c in ctls]
    grids = [grid_values(c, spec["controls"][n]) for n, c in zip(names, ctls)]
    slots: dict = {"figs": [], "html": [], "ctls": []}
    tree = walk(w, slots)
    pool = _Pool()
    states: dict[str, dict] = {}
    try:
        for combo in itertools.product(*[range(len(g)) for g in grids]):
            for c, g, i in zip(ctls, grids, combo):
                c.value = g[i]
            states[",".join(map(str, combo))] = _state(slots, pool)
    finally:
        for c, v in zip(ctls, start):
            c.value = v
    cslots = [slots["ctls"].index(c) if c in slots["ctls"] else None for c in ctls]
    return {
        "tree": tree,
        "controls": [{"name": n, "label": _label(c) or n, "values": [_jsonable(v) for v in g],
                      "labels": [_label_of(c, v) for v in g], "start": g.index(v0) if v0 in g else 0,
                      "cslot": cs, "kind": "options" if hasattr(c, "options") else "range"}
                     for n, c, g, v0, cs in zip(names, ctls, grids, start, cslots)],
        "pool": pool.items,
        "states": states,
    }


def _jsonable(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


# ----------------------------------------------------------------------------------------------- hooks
def _ref_bundle(self: Any, **kwargs: Any) -> dict:
    _PENDING.append(len(_SHOWN))
    _SHOWN.append(self)
    return {REF_MIME: {"ref": len(_SHOWN) - 1}, "text/plain": f"<{type(self).__name__}>"}


def _matches_spec(w: Any) -> bool:
    wanted = set(_SPEC.get("controls", {}))
    return bool(wanted) and wanted <= set(_controls(w))


def _post_run_cell(result: Any) -> None:
    global _SWEPT
    from IPython.display import display

    refs, _PENDING[:] = list(_PENDING), []
    snaps: dict[str, dict] = {}
    for ref in refs:
        w = _SHOWN[ref]
        if not _SWEPT and _matches_spec(w):
            _SWEPT = True
            snaps[str(ref)] = {"explorer": sweep(w, _SPEC), "note": _SPEC.get("note", "")}
        else:
            snaps[str(ref)] = {"tree": walk(w)}
    if snaps:
        display({SNAP_MIME: snaps}, raw=True)
    raw = getattr(getattr(result, "info", None), "raw_cell", "") or ""
    m = _EXERCISE.match(raw)
    if m:
        _show_prompt(m.group(1), raw, result)


def _show_prompt(ex_id: str, raw: str, result: Any) -> None:
    from IPython import get_ipython
    from IPython.display import display

    from ppolab.exercises import prompt

    run = None
    m = _RUN_ARG.search(raw)
    if m:
        try:
            run = eval(m.group(1), get_ipython().user_ns)  # noqa: S307 — the lab's own name for its run
        except Exception:  # noqa: BLE001 — the prompt then uses the exercise's default run
            run = None
    try:
        text = prompt(ex_id, run=run)
    except Exception as e:  # noqa: BLE001
        text = f"({type(e).__name__}: {e})"
    display({EXERCISE_MIME: {"id": ex_id, "prompt": text}}, raw=True)


def install(spec_json: str = "{}") -> None:
    """Patch widget display in this kernel and register the after-cell hook (called by the build's first cell)."""
    import ipywidgets as W
    import plotly.io as pio
    from IPython import get_ipython
    from plotly.basewidget import BaseFigureWidget

    _SPEC.clear()
    _SPEC.update(json.loads(spec_json))
    W.Widget._repr_mimebundle_ = _ref_bundle
    BaseFigureWidget._repr_mimebundle_ = _ref_bundle
    pio.renderers.default = "plotly_mimetype"  # a go.Figure shows as plotly JSON, never an inline plotly.js copy
    get_ipython().events.register("post_run_cell", _post_run_cell)
