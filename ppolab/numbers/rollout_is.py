"""Chapter §3/§5's rollout IS weights in the loss: they multiply only the clipped policy-gradient term.

verl ``core_algos.py::compute_policy_loss_vanilla`` multiplies the per-token loss by ``rollout_is_weights`` after
the clip and the dual clip, before ``agg_loss``; ``workers/utils/losses.py::ppo_loss`` adds the entropy and KL terms
without them. :func:`pg_loss_with_and_without_is` recomputes a recorded step's ``actor/pg_loss`` both ways from the
recorded tensors (every optimizer step's π_θ is in ``actor_log_probs``), and its ``actor/kl_loss`` as ppo_loss does.
"""
from __future__ import annotations

from ppolab import algos
from ppolab.numbers.needs import RunLacks
from ppolab.numbers.steps import n_opt_steps, actor_config, global_batch_info, optimizer_step_batch
from ppolab.run.reader import Run, resolve_run


def is_weighted_step(run: Run | str | None = None) -> int:
    """The first recorded step of ``run`` whose stage 7 wrote ``rollout_is_weights``; :class:`RunLacks` if none."""
    r = resolve_run(run, "grpo_tiny_vllm_bf16")
    if not r.ppo_config().algorithm.rollout_correction.rollout_is:
        raise RunLacks("rollout IS weights (algorithm.rollout_correction.rollout_is)", r)
    for s in r.steps:
        if "rollout_is_weights" in r.step(s).tensors:
            return s
    raise RunLacks("recorded rollout_is_weights", r)


def pg_loss_with_and_without_is(run: Run | str | None = None, step: int | None = None) -> dict[str, float]:
    """``actor/pg_loss`` of recorded ``step`` (default :func:`is_weighted_step`) recomputed from its tensors, as the
    trainer reduces it (each optimizer step's global mini-batch, token-mean over Σ loss_mask × dp_size, then the
    mean over optimizer steps): ``with_is`` with the step's recorded ``rollout_is_weights``, ``without_is``
    without them; ``kl_loss`` (no weights, as ppo_loss adds it; NaN without a KL loss); and the logged values."""
    r = resolve_run(run, "grpo_tiny_vllm_bf16")
    s = is_weighted_step(r) if step is None else step
    rec = r.step(s)
    t, cfg = rec.tensors, actor_config(r)
    if "rollout_is_weights" not in t:
        raise RunLacks("recorded rollout_is_weights", r)
    loss = algos.get_policy_loss_fn(cfg.policy_loss.loss_mode)
    out: dict[str, list[float]] = {"with_is": [], "without_is": [], "kl_loss": []}
    for k in range(n_opt_steps(rec)):
        b = optimizer_step_batch(rec, k)
        info = global_batch_info(r, rec, k)  # the worker's own counts, every rank's rows at once
        w = t["rollout_is_weights"][b["rows"]].float()
        for key, weights in (("with_is", w), ("without_is", None)):
            pg, _ = loss(b["old_log_probs"], b["log_prob"], b["advantages"], b["response_mask"], cfg.loss_agg_mode,
                         cfg, weights, global_batch_info=info)
            out[key].append(float(pg))
        if cfg.use_kl_loss and "ref_log_prob" in b:
            kld = algos.kl_penalty(b["log_prob"], b["ref_log_prob"], cfg.kl_loss_type)
            out["kl_loss"].append(float(algos.agg_loss(kld, b["response_mask"], cfg.loss_agg_mode,
                                                       **info.as_kwargs())))
    m = rec.info.get("metrics", {})
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {"step": s, "with_is": mean(out["with_is"]), "without_is": mean(out["without_is"]),
            "kl_loss": mean(out["kl_loss"]), "logged_pg_loss": float(m.get("actor/pg_loss", float("nan"))),
            "logged_kl_loss": float(m.get("actor/kl_loss", float("nan")))}
