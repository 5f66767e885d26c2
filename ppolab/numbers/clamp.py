"""Chapter §3's ±20 log-ratio clamp on a run's own tensors: how large |log π_θ − log π_old| gets on real tokens.

verl ``core_algos.py::compute_policy_loss_vanilla``: ``negative_approx_kl = clamp(log_prob − old_log_prob, −20, 20)``
before ``exp``. A recorded run holds π_θ at every optimizer step (``actor_log_probs``), so the largest real
log-ratio of the run, and whether the clamp ever acted, can be read off its files.
"""
from __future__ import annotations

import torch

from ppolab.algos.policy_loss import LOG_RATIO_CLAMP
from ppolab.numbers.steps import n_opt_steps, optimizer_step_batch
from ppolab.run.reader import Run, resolve_run


def largest_log_ratio(run: Run | str | None = None, steps: list[int] | None = None) -> dict[str, float | int | bool]:
    """The largest |log_prob − old_log_prob| over the real response tokens of every recorded optimizer step of
    ``run`` (of the recorded ``steps`` only, when given): ``value``, where (``step``, ``opt_step``, ``row`` of the
    recorded batch, ``position``), its signed ``log_ratio``, and ``clamped`` (whether any token passed the ±20
    window)."""
    r = resolve_run(run)
    best = {"value": -1.0, "step": 0, "opt_step": 0, "row": 0, "position": 0, "log_ratio": 0.0}
    for s in (r.steps if steps is None else steps):
        rec = r.step(s)
        for k in range(n_opt_steps(rec)):
            b = optimizer_step_batch(rec, k)
            d = torch.where(b["response_mask"] > 0, b["log_prob"] - b["old_log_probs"], torch.zeros(()))
            v, flat = d.abs().flatten().max(0)
            if float(v) > best["value"]:
                i, j = divmod(int(flat), d.shape[1])
                best = {"value": float(v), "step": s, "opt_step": k, "row": int(b["rows"][i]), "position": j,
                        "log_ratio": float(d[i, j])}
    best["clamped"] = best["value"] > LOG_RATIO_CLAMP
    return best


def clamp_case(run: Run | str | None = None) -> dict[str, int]:
    """Exercise 03.5's recorded ``step``: the first recorded step that does not hold the run's largest log-ratio
    (the lab prints that one), else the step holding it (a run with one recorded step)."""
    r = resolve_run(run)
    top = largest_log_ratio(r)["step"]
    return {"step": next((s for s in r.steps if s != top), top)}


def clamp_gradient(log_ratio: torch.Tensor) -> torch.Tensor:
    """∂ratio/∂log_prob through verl's clamp, by autograd, for each raw log-ratio in ``log_ratio`` (old = 0)."""
    from ppolab import algos

    lp = log_ratio.detach().clone().double().requires_grad_(True)
    old = torch.zeros_like(lp)
    algos.ppo_clip_terms(old, lp, torch.ones_like(lp), 0.2, 0.2)["ratio"].sum().backward()
    return lp.grad


def large_step_replay(run: Run | str | None = None, scales: tuple[float, ...] = (1.0, 10.0, 100.0, 1000.0, 10000.0)
                      ) -> dict:
    """Recorded step 1's first optimizer step replayed (``ppolab.replay.replay_actor_update``: the run's real
    initial adapter and real mini-batch), then its update taken ``scale`` times as far — plain SGD at learning rate
    ``scale`` on the true gradient, a real large-drift policy — and the mini-batch's log-probs recomputed with the
    trainer's own forward. Per scale: the largest |log π_θ − log π_old| over the real tokens, the tokens past the ±20
    clamp, and autograd's ∂ρ/∂log π_θ at them through ``ppo_clip_terms`` (0 where clamped). The weights are
    restored afterwards."""
    from ppolab import algos
    from ppolab.batch import Batch
    from ppolab.replay import REPLAY_LOCK, replay_actor_update, restore, run_models
    from ppolab.worker import ActorWorker, InferBatching

    r = resolve_run(run)
    rep = replay_actor_update(r, 1)
    rec = r.step(1)
    rows = rep["rows"]
    t = rec.batch_tensors()
    t["is_pad"] = t["is_pad"].bool()
    batch = Batch(t).select(rows)
    cfg = r.ppo_config()
    with REPLAY_LOCK:  # these steps move the shared models, as a replay does: never two at once
        models = run_models(r)
        params = models.actor_parameters()
        before = [p.detach().clone() for p in params]
        a, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
        worker = ActorWorker(a, models, temperature=rollout.temperature, rollout_n=rollout.n,
                             optimizer=torch.optim.SGD(params, lr=1.0))
        mask = batch["response_mask"].float() * (~batch["is_pad"]).float().unsqueeze(-1)
        old = batch["old_log_probs"].float()
        out = []
        try:
            for scale in scales:
                with torch.no_grad():
                    for p, b, g in zip(params, before, rep["grads"]):
                        p.copy_(b - scale * g)
                lp = worker.infer(batch, InferBatching(len(rows), None))["log_probs"]
                d = torch.where(mask > 0, lp - old, torch.zeros(()))
                lp_leaf = lp.detach().double().requires_grad_(True)
                algos.ppo_clip_terms(old.double(), lp_leaf, batch["advantages"].double(), 0.2, 0.2)["ratio"].mul(
                    mask).sum().backward()
                past = (d.abs() > LOG_RATIO_CLAMP) & (mask > 0)
                out.append({"scale": scale, "max_abs_log_ratio": float(d.abs().max()), "n_tokens": int(mask.sum()),
                            "n_clamped": int(past.sum()),
                            "grad_at_clamped_max": (float(lp_leaf.grad[past].abs().max()) if past.any()
                                                    else float("nan")),
                            "grad_elsewhere_min": float(lp_leaf.grad[(mask > 0) & ~past].abs().min())})
        finally:
            restore(params, before)
    return {"rows": len(rows), "scales": out}
