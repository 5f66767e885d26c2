"""Reusable explorers for the labs: each takes a recorded run (or one of its steps), returns an ipywidgets
container holding plotly ``FigureWidget``s, and computes every number with ``ppolab.algos``.

Every explorer returns a widget with two extra attributes, so tests (and curious learners) can drive it
without a browser: ``controls`` (name → ipywidgets control) and ``figures`` (name → ``go.FigureWidget``).
Modules load on first use, so ``import ppolab.widgets`` stays cheap.
"""
from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    # policy side: ratio, clipping, loss assembly (labs 03–06)
    "ratio_explorer": "ppolab.widgets.ratio",
    "clip_explorer": "ppolab.widgets.clip",
    "dual_clip_explorer": "ppolab.widgets.clip",
    "loss_assembly": "ppolab.widgets.loss",
    "gradient_gallery": "ppolab.widgets.gradients",
    # the two KL paths (lab 08)
    "kl_explorer": "ppolab.widgets.kl",
    "exact_kl_explorer": "ppolab.widgets.kl",
    # critic (lab 09)
    "value_clip_explorer": "ppolab.widgets.value",
    # masks, aggregation, batches (labs 01, 10–12)
    "mask_viewer": "ppolab.widgets.masks",
    "aggregation_explorer": "ppolab.widgets.aggregation",
    "batch_calculator": "ppolab.widgets.batching",
    # micro-batch invariance of the real actor update (lab 13)
    "invariance_explorer": "ppolab.widgets.invariance",
    # the same tokens as verl, TRL and OpenRLHF weigh them (lab 13)
    "trainers_explorer": "ppolab.widgets.three_trainers",
    # what one optimizer step did to the tokens and the parameters (lab 18)
    "update_effect_explorer": "ppolab.widgets.update_effect",
    # the curves lab 17's part II trains with the learner's losses
    "capstone_curves": "ppolab.widgets.capstone",
    # runs (labs 00, 15)
    "ablation_curves": "ppolab.widgets.ablations",
    "metrics_dashboard": "ppolab.widgets.metrics",
    "live_training": "ppolab.widgets.live",
    # any explorer kept on the newest step of a run that is training (ppolab.train_in_background)
    "follow": "ppolab.widgets.follow",
    # the nine mistakes (lab 16)
    "mistakes_explorer": "ppolab.widgets.mistakes",
    # the language of titles, labels and controls: set_language("zh") before building an explorer
    "set_language": "ppolab.i18n",
    "get_language": "ppolab.i18n",
    # shared helpers
    "SHIPPED_RUNS": "ppolab.widgets.common",
    "resolve_run": "ppolab.widgets.common",
    "step_tensors": "ppolab.widgets.common",
    "actor_config": "ppolab.widgets.common",
    "optimizer_step_batch": "ppolab.widgets.common",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'ppolab.widgets' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
