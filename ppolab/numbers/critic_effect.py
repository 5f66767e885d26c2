"""Where the critic's update went: one recorded optimizer step of the critic, replayed with the worker's own code —
the second half of the chapter's title (§1, §8: returns → value loss → critic backward → optimizer.step()).

The replay is the training code path, as :mod:`ppolab.numbers.update_effect` is for the actor: a
:class:`~ppolab.worker.CriticWorker` built from the run's config (AdamW and warm-up as the trainer builds them), on the
run's models at their seeded start — the critic adapter with LoRA B = 0 and the seeded value head, exactly the critic
that predicted the step's recorded ``values`` — executing the step's recorded critic plan with
:meth:`~ppolab.worker.Worker.optimizer_step_of`. Only step 1 starts from a state a fresh trainer holds, so optimizer
step k of step 1 is replayed by running steps 0 … k−1 as recorded, then measuring step k. Several ranks are replayed
on one process (every rank's micro-batches, dp_size 1: the gradient the ranks averaged).

    e = critic_step_effect(run, step=1, opt_step=0)
    e["values_before"], e["values_after"]   # (N, R) V(s_t) of every token before and after that optimizer step
    e["returns"], e["values"]               # (N, R) the targets G and V_old (the recorded values)
    e["clipped"]                            # (N, R) bool: the value clip binds — (clip(V, V_old ± ε_v) − G)² is the
                                            # larger error, so the token's loss is a constant in V (no gradient)
    e["coefficient"]                        # (N, R) ∂ vf_loss / ∂ V per token, with the step's global counts
    e["params"]                             # per critic tensor (adapter, value head): ‖grad‖, ‖Δθ‖, cos(Δθ, −grad)
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from ppolab import algos
from ppolab.errors import whole_argument
from ppolab.numbers.needs import RunLacks
from ppolab.numbers.update_effect import one_process, step_batch, tensor_names, tensor_steps
from ppolab.run.reader import Run, cache_slot, resolve_run
from ppolab.update_plan import InferBatching

#: Per run and step (keyed by :meth:`Run.identity`): optimizer step k → :func:`critic_step_effect`'s dict.
_CACHE: dict[tuple, dict[int, dict[str, Any]]] = {}


def critic_steps(run: Run | str | os.PathLike | None = None, step: int = 1) -> int:
    """The critic's optimizer steps at recorded step ``step`` (its update plan)."""
    r = resolve_run(run)
    return len(r.step(whole_argument("step", step, None, "a recorded step's number")).plan("critic").steps)


def critic_step_effect(run: Run | str | os.PathLike | None = None, step: int = 1,
                       opt_step: int = 0) -> dict[str, Any]:
    """What critic optimizer step ``opt_step`` of recorded step ``step`` did (module docstring). Every optimizer step
    up to it is measured on the way and kept per run and step. Only step 1 replays (the seeded critic a fresh
    trainer holds); a run without a critic, or a step without a critic update, is :class:`RunLacks`."""
    r = resolve_run(run)
    step = whole_argument("step", step, None, "a recorded step's number")
    if step != 1 or 1 not in r.steps:
        raise RunLacks("the critic's update at recorded step 1 (only step 1 starts from the seeded critic a fresh "
                       f"trainer holds; recorded: {r.steps})", r)
    if not r.ppo_config().use_critic or "critic_vpreds" not in r.step(step).tensors:
        raise RunLacks("a critic update (a value model: adv_estimator=gae, e.g. the shipped ppo_gae_tiny)", r)
    opt_step = whole_argument("opt_step", opt_step, range(critic_steps(r, step)),
                              f"an optimizer step of the critic's update at step {step}")
    entry = _CACHE.setdefault(cache_slot(_CACHE, r.identity(step)), {})
    if opt_step not in entry:
        entry.update(_replay(r, step, opt_step))
    return entry[opt_step]


def _replay(r: Run, step: int, last: int) -> dict[int, dict[str, Any]]:
    """Critic optimizer steps 0 … ``last`` of ``step``, measured (the shared models put back afterwards)."""
    from ppolab.replay import REPLAY_LOCK, gradients, restore, run_models
    from ppolab.worker import CriticWorker

    cfg = r.ppo_config()
    plan = r.step(step).plan("critic")
    batch = step_batch(r, step)
    t = batch.tensors
    reading = InferBatching(len(batch))
    out: dict[int, dict[str, Any]] = {}
    with REPLAY_LOCK:
        models = run_models(r)
        params = models.critic_parameters()
        names = tensor_names(models, params)
        saved = [p.detach().clone() for p in params]
        worker = CriticWorker(cfg.critic, models, temperature=cfg.actor_rollout_ref.rollout.temperature,
                              rollout_n=cfg.actor_rollout_ref.rollout.n)
        try:
            v_before = worker.infer(batch, reading, log_probs=False, values=True)["values"]
            for k in range(last + 1):
                opt = one_process(plan.steps[k])
                before = [p.detach().clone() for p in params]
                metrics = worker.optimizer_step_of(batch, opt, params)
                used = gradients(params)
                after = [p.detach().clone() for p in params]
                v_after = worker.infer(batch, reading, log_probs=False, values=True)["values"]
                lr = float(worker.optimizer.param_groups[0]["lr"])
                out[k] = _measure(r, step, plan, k, t, names, before, after, used, v_before, v_after, lr, metrics)
                v_before = v_after
        finally:
            restore(params, saved)
    return out


def _measure(r: Run, step: int, plan: Any, k: int, t: dict, names: list[str], before: list, after: list, used: list,
             v_before: torch.Tensor, v_after: torch.Tensor, lr: float, metrics: dict) -> dict[str, Any]:
    """The numbers of one replayed critic optimizer step: tokens (values, clip, coefficient) and tensors."""
    c = r.ppo_config().critic
    opt = plan.steps[k]
    rows = torch.as_tensor(opt.rows(), dtype=torch.long)
    real = ~t["is_pad"].bool()
    mask = t["response_mask"].float() * real.float().unsqueeze(-1)
    in_step = torch.zeros_like(mask, dtype=torch.bool)
    in_step[rows] = True
    returns, values = t["returns"].float(), t["values"].float()
    eps = c.cliprange_value
    _, err, err_clipped, _ = algos.value_clip_terms(v_before, returns, values, eps)
    clipped = (err_clipped > err) & (mask > 0) & in_step
    # ∂ vf_loss / ∂ V of each token of the optimizer step's rows, normalised as the worker normalised them
    v = v_before[rows].clone().requires_grad_(True)
    info = dataclasses.replace(opt.info(), dp_size=1)
    loss, _ = algos.value_loss(v, returns[rows], values[rows], mask[rows], eps, c.loss_agg_mode, info)
    loss.backward()
    coefficient = torch.zeros_like(mask)
    coefficient[rows] = v.grad.detach()
    params = tensor_steps(names, before, after, used, lr)
    nan = torch.full_like(mask, float("nan"))
    return {"step": step, "opt_step": k, "n_opt": len(plan.steps), "epoch": opt.epoch,
            "mini_batch": opt.mini_batch, "rows": rows.tolist(), "mask": mask, "in_step": in_step,
            "values_before": torch.where(mask > 0, v_before, nan), "values_after": torch.where(mask > 0, v_after, nan),
            "returns": returns, "values": values, "clipped": clipped, "coefficient": coefficient,
            "names": names, "params": params, "lr": lr, "loss": float(metrics["critic/vf_loss"]),
            "vf_clipfrac": float(metrics["critic/vf_clipfrac"]), "grad_norm": float(metrics["critic/grad_norm"]),
            "metrics": metrics}
