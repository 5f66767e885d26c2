"""Chapter §3/§5's rollout IS weights in the loss: they multiply only the clipped policy-gradient term.

verl ``core_algos.py::compute_policy_loss_vanilla`` multiplies the per-token loss by ``rollout_is_weights`` after
the clip and the dual clip, before ``agg_loss``; ``workers/utils/losses.py::ppo_loss`` adds the entropy and KL terms
without them. :func:`pg_loss_with_and_without_is` recomputes a recorded step's ``actor/pg_loss`` both ways from the
recorded tensors (every optimizer step's π_θ is in ``actor_log_probs``), and its ``actor/kl_loss`` as ppo_loss does.
"""
from __future__ import annotations

import math

import torch

from ppolab import algos
from ppolab.numbers.needs import RunLacks
from ppolab.numbers.steps import n_opt_steps, actor_config, global_batch_info, optimizer_step_batch
from ppolab.run.reader import Run, resolve_run
from ppolab.run.step import StepRecord


def is_weighted_step(run: Run | str | None = None) -> int:
    """The first recorded step of ``run`` whose stage 7 wrote ``rollout_is_weights``; :class:`RunLacks` if none."""
    r = resolve_run(run, "grpo_tiny_vllm_bf16")
    if not r.ppo_config().algorithm.rollout_correction.rollout_is:
        raise RunLacks("rollout IS weights (algorithm.rollout_correction.rollout_is)", r)
    for s in r.steps:
        if "rollout_is_weights" in r.step(s).tensors:
            return s
    raise RunLacks("recorded rollout_is_weights", r)


def _pg_losses(r: Run, rec: StepRecord, weights: dict[str, torch.Tensor | None]) -> dict[str, float]:
    """The step's ``actor/pg_loss`` as the trainer reduces it (each optimizer step's global mini-batch, then the mean
    over optimizer steps), once for each entry of ``weights`` (the whole step's (bs, T) IS weights, or None), and its
    ``kl_loss`` (no weights, as ppo_loss adds it; NaN without a KL loss)."""
    cfg = actor_config(r)
    loss = algos.get_policy_loss_fn(cfg.policy_loss.loss_mode)
    out: dict[str, list[float]] = {key: [] for key in [*weights, "kl_loss"]}
    for k in range(n_opt_steps(rec)):
        b = optimizer_step_batch(rec, k)
        info = global_batch_info(r, rec, k)  # the worker's own counts, every rank's rows at once
        for key, w in weights.items():
            pg, _ = loss(b["old_log_probs"], b["log_prob"], b["advantages"], b["response_mask"], cfg.loss_agg_mode,
                         cfg, None if w is None else w[b["rows"]].float(), global_batch_info=info)
            out[key].append(float(pg))
        if cfg.use_kl_loss and "ref_log_prob" in b:
            kld = algos.kl_penalty(b["log_prob"], b["ref_log_prob"], cfg.kl_loss_type)
            out["kl_loss"].append(float(algos.agg_loss(kld, b["response_mask"], cfg.loss_agg_mode,
                                                       **info.as_kwargs())))
    return {key: sum(xs) / len(xs) if xs else float("nan") for key, xs in out.items()}


def pg_loss_with_and_without_is(run: Run | str | None = None, step: int | None = None) -> dict[str, float]:
    """``actor/pg_loss`` of recorded ``step`` (default :func:`is_weighted_step`) recomputed from its tensors, as the
    trainer reduces it (each optimizer step's global mini-batch, token-mean over Σ loss_mask × dp_size, then the
    mean over optimizer steps): ``with_is`` with the step's recorded ``rollout_is_weights``, ``without_is``
    without them; ``kl_loss`` (no weights, as ppo_loss adds it; NaN without a KL loss); and the logged values."""
    r = resolve_run(run, "grpo_tiny_vllm_bf16")
    s = is_weighted_step(r) if step is None else step
    rec = r.step(s)
    if "rollout_is_weights" not in rec.tensors:
        raise RunLacks("recorded rollout_is_weights", r)
    out = _pg_losses(r, rec, {"with_is": rec.tensors["rollout_is_weights"], "without_is": None})
    m = rec.info.get("metrics", {})
    return {"step": s, **out, "logged_pg_loss": float(m.get("actor/pg_loss", float("nan"))),
            "logged_kl_loss": float(m.get("actor/kl_loss", float("nan")))}


def is_weights_at(run: Run | str | None = None, step: int | None = None,
                  threshold: float | str | None = None) -> torch.Tensor:
    """The IS weights stage 7 of recorded ``step`` would have made with ``rollout_is_threshold = threshold`` (None:
    the run's own), from the step's recorded ``old_log_probs`` and ``rollout_log_probs`` and the run's
    ``rollout_is`` level and batch normalisation (verl ``rollout_corr_helper.py::
    compute_rollout_correction_and_rejection_mask``). (bs, T)."""
    r = resolve_run(run, "grpo_tiny_vllm_bf16")
    rec = r.step(is_weighted_step(r) if step is None else step)
    corr, t = r.ppo_config().algorithm.rollout_correction, rec.tensors
    if "rollout_log_probs" not in t:
        raise RunLacks("recorded rollout_log_probs", r)
    w, _, _ = algos.rollout_correction_and_rejection_mask(
        t["old_log_probs"], t["rollout_log_probs"], t["response_mask"].float(), corr.rollout_is or "token",
        corr.rollout_is_threshold if threshold is None else threshold, corr.rollout_is_batch_normalize)
    return w


def tighter_is_threshold(run: Run | str | None = None, step: int | None = None) -> float:
    """A what-if truncation for exercise 02.5: the ``rollout_is_threshold`` that the top 5 % of the step's valid
    tokens' untruncated IS weights exceed (rounded up to 3 decimals, at least 1.001), so that a tighter TIS binds on
    some tokens of the learner's run where the run's own threshold (2.0 by default) binds on few or none."""
    r = resolve_run(run, "grpo_tiny_vllm_bf16")
    t = r.step(is_weighted_step(r) if step is None else step).tensors
    if "rollout_log_probs" not in t:
        raise RunLacks("recorded rollout_log_probs", r)
    raw, _ = algos.raw_is_weights(t["old_log_probs"], t["rollout_log_probs"], t["response_mask"].float(),
                                  r.ppo_config().algorithm.rollout_correction.rollout_is or "token")
    raw = raw[t["response_mask"].bool()]
    if not bool((raw > 1.001).any()):  # the engine's log-probs are the trainer's: no truncation could bind
        raise RunLacks("rollout IS weights above 1.001 at this step (a rollout engine whose log-probs differ from the "
                       "trainer's, e.g. vLLM in bf16)", r)
    q = float(torch.quantile(raw.double(), 0.95))
    return max(1.001, math.ceil(q * 1000) / 1000)


def pg_loss_is_what_if(run: Run | str | None = None, step: int | None = None,
                       threshold: float | str | None = None) -> float:
    """Exercise 02.5's truth: ``actor/pg_loss`` of recorded ``step`` with the IS weights truncated at ``threshold``
    (default :func:`tighter_is_threshold`) minus the same loss with the run's own (recorded) weights — what a tighter
    truncation would have changed in the logged number."""
    r = resolve_run(run, "grpo_tiny_vllm_bf16")
    s = is_weighted_step(r) if step is None else step
    rec = r.step(s)
    c = tighter_is_threshold(r, s) if threshold is None else threshold
    if "rollout_is_weights" not in rec.tensors:
        raise RunLacks("recorded rollout_is_weights", r)
    out = _pg_losses(r, rec, {"what_if": is_weights_at(r, s, c), "own": rec.tensors["rollout_is_weights"]})
    return out["what_if"] - out["own"]
