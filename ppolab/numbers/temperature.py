"""Chapter §6 on a run: the temperature in π_θ's forward and the entropy bonus in the actor loss.

At recorded step 1 the LoRA adapters are still zero, so the base model *is* π_θ at the first optimizer step. Its
forward through :func:`ppolab.models.forward_response` (the trainer's own forward, one-token shift and
temperature) on that optimizer step's rows gives the log-probs and entropy the update saw there — or, at another
temperature, what it would have seen had π_θ skipped the rollout temperature.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from ppolab import algos
from ppolab.numbers.needs import RunLacks, require
from ppolab.numbers.steps import actor_config, optimizer_step_batch
from ppolab.run.reader import Run, resolve_run

#: The section's own run: sampled at T = 0.7 with entropy_coeff 0.01 (data/runs/README.md).
TEMP_RUN = "grpo_temp_tiny"


def run_temperature(run: Run | str | None = None) -> float:
    """The rollout temperature a run sampled with (and divided every trainer forward by)."""
    r = resolve_run(run, TEMP_RUN)
    return float(r.ppo_config().actor_rollout_ref.rollout.temperature)


def temperature_case(run: Run | str | None = None) -> dict[str, Any]:
    """Recorded step 1's first optimizer step of a run sampled at a temperature ≠ 1 (``T``), with the rows it
    trained on; a run at T = 1 lacks it (skipping the temperature would change nothing there)."""
    r = require(run, "step1", "opt_steps", default=TEMP_RUN)
    T = run_temperature(r)
    if T == 1.0:
        raise RunLacks("a rollout temperature ≠ 1 (actor_rollout_ref.rollout.temperature)", r)
    return {"step": 1, "opt_step": 0, "T": T,
            "rows": int(optimizer_step_batch(r.step(1), 0)["rows"].numel())}


def entropy_bonus_case(run: Run | str | None = None) -> dict[str, Any]:
    """Recorded step 1's first optimizer step of a run with an entropy bonus (``entropy_coeff`` ≠ 0)."""
    r = require(run, "step1", "opt_steps", default=TEMP_RUN)
    coeff = float(r.ppo_config().actor_rollout_ref.actor.entropy_coeff)
    if coeff == 0.0:
        raise RunLacks("an entropy bonus (actor_rollout_ref.actor.entropy_coeff ≠ 0)", r)
    return {"step": 1, "opt_step": 0, "T": run_temperature(r), "entropy_coeff": coeff}


@functools.lru_cache(maxsize=8)
def _first_forward(path: str, temperature: float, _identity: tuple = ()) -> dict[str, torch.Tensor]:
    from ppolab.models import load_tokenizer_and_model
    from ppolab.numbers.kl import run_base_model
    from ppolab.models import forward_response

    r = resolve_run(path)
    rec = r.step(1)
    t = rec.tensors
    b = optimizer_step_batch(rec, 0)
    rows = b["rows"]
    _, model = load_tokenizer_and_model(run_base_model(r))
    # the update attends to every generated token (rejection sampling rewrites only the loss mask)
    seen = t.get("response_attention_mask", t.get("loss_mask", t["response_mask"]))
    ids = torch.cat([t["prompts"], t["responses"]], dim=1)[rows]
    attn = torch.cat([t["prompt_mask"], seen.long()], dim=1)[rows]
    with torch.no_grad():
        out = forward_response(model, ids, attn, t["responses"].shape[1], temperature, want_log_probs=True,
                               want_entropy=True)
    return {"log_prob": out.log_probs, "entropy": out.entropy}


def first_forward(run: Run | str | None = None, temperature: float | None = None) -> dict[str, torch.Tensor]:
    """π_θ at recorded step 1's first optimizer step (the base model: zero adapters) on that optimizer step's rows,
    its logits divided by ``temperature`` (default: the run's): ``log_prob`` and ``entropy``, (rows, R) float32,
    aligned with :func:`~ppolab.numbers.steps.optimizer_step_batch` ``(rec, 0)``. Cached per run and temperature."""
    r = require(run, "step1", "opt_steps", default=TEMP_RUN)
    T = run_temperature(r) if temperature is None else float(temperature)
    return _first_forward(str(Path(r.path).resolve()), T, r.identity(1))  # a run replaced there: another key


def first_ratio(run: Run | str | None = None, temperature: float | None = None) -> dict[str, torch.Tensor]:
    """The first optimizer step's ratio r = exp(clamp(log π_θ − log π_old, ±20)) (``algos.ppo_clip_terms``) with
    π_θ's logits divided by ``temperature`` (default: the run's, as the trainer does) against the recorded
    ``old_log_probs``; with ``response_mask`` of those rows and the run's ``pg_clipfrac`` there."""
    r = require(run, "step1", "opt_steps", default=TEMP_RUN)
    b = optimizer_step_batch(r.step(1), 0)
    lp = first_forward(r, temperature)["log_prob"]
    m = b["response_mask"]
    lp = torch.where(m > 0, lp, b["old_log_probs"])
    cfg = actor_config(r)
    low, high = algos.policy_loss.clip_bounds(cfg)
    terms = algos.ppo_clip_terms(b["old_log_probs"], lp, b["advantages"], low, high, cfg.clip_ratio_c)
    return {"ratio": terms["ratio"], "response_mask": m,
            "pg_clipfrac": algos.masked_mean(terms["clipped"], m).item()}


def first_step_loss(run: Run | str | None = None, entropy_coeff: float | None = None,
                    with_entropy: bool = True) -> tuple[float, dict[str, float]]:
    """The actor loss of recorded step 1's first optimizer step through ``algos.ppo_loss`` with the run's actor
    config (``entropy_coeff`` overridden when given): π_θ's log-probs and entropy from :func:`first_forward` at the
    run's temperature, the global mini-batch as one micro-batch (dp 1: its own token count is the global one).
    ``with_entropy=False`` passes no entropy, as the worker does when calculate_entropy is off and
    entropy_coeff is 0."""
    r = require(run, "step1", "opt_steps", default=TEMP_RUN)
    b = optimizer_step_batch(r.step(1), 0)
    f = first_forward(r)
    m = b["response_mask"]
    cfg = actor_config(r) if entropy_coeff is None else actor_config(r, entropy_coeff=entropy_coeff)
    ref = b.get("ref_log_prob")
    loss, metrics = algos.ppo_loss(cfg, old_log_prob=b["old_log_probs"],
                                   log_prob=torch.where(m > 0, f["log_prob"], b["old_log_probs"]),
                                   advantages=b["advantages"], response_mask=m,
                                   entropy=f["entropy"] if with_entropy else None,
                                   ref_log_prob=None if ref is None else torch.where(m > 0, ref, b["old_log_probs"]))
    return loss.item(), metrics

