"""Lab 17, part I, graded: each part's metrics at settings the run did *not* train with.

A rebuilt step is checked twice. At the run's own settings the learner's numbers are compared with
``metrics.jsonl`` (:func:`ppolab.numbers.capstone.report` — a self-check that shows a logged value only once it
matches); the graded answer is the same code run at the settings :func:`what_if` names, whose metrics no log holds
and no cell prints, so the only way to them is code that does what the trainer does. The truths here are computed
with ``ppolab.algos`` exactly as the trainer calls it, on the step's recorded tensors and recorded update plan:

* 17.1 — another reward-KL estimator (``algorithm.kl_penalty``) and controller (``kl_ctrl``: kl_coef ×2, horizon ÷2;
  β still starts from the previous step's logged β and KL, as in the run);
* 17.2 — every ``rollout_rs`` threshold halfway closer to "no deviation" (ratio bands halved, upper bounds ÷2);
* 17.3 — other γ and λ;
* 17.4 / 17.5 — a clip window half the run's (narrower still where that clips nothing: the 90th percentile of the
  step's |r − 1|) and the dual-clip bound c halfway to 1, on the log-probs π_θ had at each
  recorded optimizer step (the KL and entropy terms do not move with them: the dict as a whole is what no log holds),
  and the same mini-batches cut into smaller micro-batches (:func:`micro_what_if`): every rank then runs two or more,
  so a sum where verl averages (or the reverse) shows as a factor even on a run that ran one micro-batch a rank;
* 17.6 — half the value clip ε_v (or the 90th percentile of the step's |V_new − V_old|, if smaller), on the
  recorded critic predictions (vpred_mean does not move with it);
* 17.7 — ``actor/loss`` and ``critic/loss`` of those 17.5 and 17.6 settings.

The recorded trajectory stays the run's: log-probs, values and predictions are what the trained models gave, so a
what-if changes the numbers the losses compute, not the models that produced their inputs (chapter §1, stage 7–9).
"""
from __future__ import annotations

import math

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ppolab import algos
from ppolab.algos.correction import parse_rollout_rs
from ppolab.metrics import accumulate_micro_metrics
from ppolab.numbers.capstone import SHIPPED, _actor_metrics, capstone_step, logged, capstone_plan
from ppolab.numbers.needs import RunLacks
from ppolab.numbers.steps import actor_config
from ppolab.run.reader import Run, resolve_run
from ppolab.update_plan import InferBatching, UpdatePlan, recorded_plan

def _other_estimator(name: str) -> str:
    return "low_var_kl" if algos.kl.canonical_kl_name(name) != "low_var_kl" else "kl"


def _g(x: float) -> float:
    """A setting as a short decimal (what a learner reads and a config takes)."""
    return float(f"{x:.6g}")


def what_if(part: str, run: Run | str | None = None) -> dict[str, Any]:
    """The settings ``part``'s graded answer is computed at — keyword arguments of the function the lab has the
    learner write for that part (17.1: ``kl_penalty``, ``kl_ctrl``; 17.2: ``rollout_rs``, ``rollout_rs_threshold``;
    17.3: ``gamma``, ``lam``; 17.4 / 17.5: ``eps_low``, ``eps_high``, ``clip_ratio_c`` and ``plan`` (the update plan in
    ``capstone.micro_batch_rows``'s form, cut by :func:`micro_what_if`); 17.6:
    ``cliprange_value``). 17.7 has none of its own: it combines 17.5's and 17.6's."""
    r = resolve_run(run, SHIPPED)
    cfg = r.ppo_config()
    alg, actor, critic = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.critic
    if part == "17.1":
        ctrl = alg.kl_ctrl
        return {"kl_penalty": _other_estimator(alg.kl_penalty),
                "kl_ctrl": replace(ctrl, kl_coef=_g(2 * ctrl.kl_coef), horizon=_g(ctrl.horizon / 2))}
    if part == "17.2":
        corr = alg.rollout_correction
        if not corr.rollout_rs:
            raise RunLacks("rejection sampling (algorithm.rollout_correction.rollout_rs)", r)
        specs = []
        for option, (lower, upper) in parse_rollout_rs(corr.rollout_rs, corr.rollout_rs_threshold).items():
            if option.endswith("k1"):  # a ratio band [lower, upper] around 1: halve its distance from 1
                specs.append(f"{_g(1 - (1 - lower) / 2)}_{_g(1 + (upper - 1) / 2)}")
            else:
                specs.append(f"{_g(upper / 2)}")
        return {"rollout_rs": ",".join(parse_rollout_rs(corr.rollout_rs, corr.rollout_rs_threshold)),
                "rollout_rs_threshold": ",".join(specs)}
    if part == "17.3":
        return {"gamma": 0.9 if alg.gamma != 0.9 else 0.95, "lam": 0.8 if alg.lam != 0.8 else 0.9}
    if part in ("17.4", "17.5"):
        low, high = algos.policy_loss.clip_bounds(actor)
        t = r.step(capstone_step(r)).tensors
        moved = _moved(t["actor_log_probs"].exp(), t["old_log_probs"].exp(), t["response_mask"])
        return {"eps_low": _g(min(low / 2, moved)), "eps_high": _g(min(high / 2, moved)),
                "clip_ratio_c": _g(1 + (actor.clip_ratio_c - 1) / 2),
                "plan": [opt.micro_batches for opt in micro_what_if(r).steps]}
    if part == "17.6":
        t = r.step(capstone_step(r)).tensors
        if "critic_vpreds" not in t:
            raise RunLacks("a critic (critic_vpreds recorded)", r)
        moved = _moved(t["critic_vpreds"], t["values"], t["response_mask"])
        return {"cliprange_value": _g(min(critic.cliprange_value / 2, moved))}
    if part == "17.7":
        return {}
    raise KeyError(f"part {part!r} has no what-if; parts: 17.1 … 17.7")


def micro_what_if(run: Run | str | None = None, step: int | None = None) -> UpdatePlan:
    """The actor's update at the capstone step (or ``step``) re-planned by ``ppolab.update_plan`` with fixed
    micro-batches of d rows (``ppo_micro_batch_size_per_gpu=d``, no dynamic batching): d is the largest divisor of
    the rows a rank holds per mini-batch that is at most half the recorded plan's largest micro-batch — the same
    mini-batches, the same global counts (§13: they do not depend on the cut), every rank two or more micro-batches
    (one row per micro-batch already: the recorded cut)."""
    r = resolve_run(run, SHIPPED)
    s = _step(r, step)
    recorded = capstone_plan(r, s, "actor")
    largest = max(len(mb) for opt in recorded.steps for micro in opt.micro_batches for mb in micro)
    local = recorded.local_mini_batch
    d = max(x for x in range(1, local + 1) if local % x == 0 and x <= max(1, largest // 2))
    return recorded_plan(r.step(s), r.ppo_config(), "actor", batching=InferBatching(micro_batch_size=d))


def _update_plan(r: Run, s: int, plan: list | None) -> UpdatePlan | None:
    """The :class:`UpdatePlan` of a what-if's ``plan`` (its micro-batches, as :func:`what_if` hands them out)."""
    if plan is None:
        return None
    planned = micro_what_if(r, s)
    if [opt.micro_batches for opt in planned.steps] != plan:
        raise ValueError("plan: not the micro-batch what-if of this step; pass what_if(part, run)['plan'] or None "
                         "(the recorded plan)")
    return planned


def _moved(new: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> float:
    """The 90th percentile of |new − old| over the valid tokens of every recorded optimizer step (``new``: (K, bs, T),
    NaN outside each step's rows): a clip that narrow binds on a share of them, on any run where anything moved.
    Where nothing moved (a step without learning signal: every advantage 0, so no update) ``inf``: the what-if is
    then half the run's window, which binds on nothing there either — the micro-batch cut and the dual-clip bound
    still make it a step no log holds."""
    dev = (new - old.unsqueeze(0)).abs()
    dev = dev[mask.bool().unsqueeze(0).expand_as(dev) & ~dev.isnan()]
    if dev.numel() == 0 or float(dev.max()) == 0.0:
        return math.inf
    if dev.numel() > 1_000_000:  # torch.quantile's input limit is far above any step here; keep it cheap anyway
        dev = dev[torch.linspace(0, dev.numel() - 1, 1_000_000).long()]
    return float(torch.quantile(dev.double(), 0.9))


def what_if_text(part: str, run: Run | str | None = None) -> str:
    """:func:`what_if` as a prompt names it: ``kl_penalty=low_var_kl, kl_coef=0.04, target_kl=0.01``."""
    out = []
    for key, value in what_if(part, run).items():
        if key == "kl_ctrl":
            out.append(f"kl_ctrl.kl_coef={value.kl_coef:g}, kl_ctrl.horizon={value.horizon:g}")
        elif key == "plan":
            sizes = sorted({len(mb) for opt in value for micro in opt for mb in micro})
            out.append(f"plan=micro-batches of {'/'.join(map(str, sizes))} rows")
        else:
            out.append(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}")
    return ", ".join(out)


# ------------------------------------------------------------------ the truths, with ppolab.algos
def _step(r: Run, step: int | None) -> int:
    return capstone_step(r) if step is None else step


def _real(t: dict[str, torch.Tensor]) -> torch.Tensor:
    return ~t["is_pad"].bool() if "is_pad" in t else torch.ones(t["responses"].shape[0], dtype=torch.bool)


def reward_kl(r: Run, s: int, kl_penalty: str, kl_ctrl: Any) -> dict[str, float]:
    """Stage 7's reward-side KL at ``kl_penalty`` / ``kl_ctrl``: β from step s−1's logged β and KL through the
    controller (step 1: kl_coef), ``apply_kl_penalty`` under ``loss_mask``, the data metric over the real rows."""
    t = r.step(s).tensors
    ctrl = algos.get_kl_controller(kl_ctrl)
    if kl_ctrl.type == "adaptive" and s > 1:
        prev = logged(r, s - 1)
        ctrl.value = prev["actor/reward_kl_penalty_coeff"]
        ctrl.update(prev["actor/reward_kl_penalty"], n_steps=t["token_level_scores"].shape[0])
    mask = (t["loss_mask"] if "loss_mask" in t else t["response_mask"]).float()
    rewards, metrics = algos.apply_kl_penalty(t["token_level_scores"], t["old_log_probs"], t["ref_log_prob"], mask,
                                              ctrl, kl_penalty)
    return {**metrics, "critic/rewards/mean": float(rewards.sum(-1)[_real(t)].mean())}


def rejection(r: Run, s: int, rollout_rs: str, rollout_rs_threshold: str) -> dict[str, float]:
    """Stage 7's rejection sampling at those options and thresholds: the two overall fractions."""
    t = r.step(s).tensors
    mask = (t["loss_mask"] if "loss_mask" in t else t["response_mask"]).float()
    _, metrics = algos.rollout_rejection_mask(t["old_log_probs"], t["rollout_log_probs"], mask, rollout_rs,
                                              rollout_rs_threshold)
    keys = ("rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rollout_rs_seq_masked_fraction")
    return {k: metrics[k] for k in keys}


def gae(r: Run, s: int, gamma: float, lam: float) -> dict[str, float]:
    """Stage 7's GAE (whitened advantages, returns) at γ, λ: the six data metrics over the real rows' valid
    tokens."""
    t = r.step(s).tensors
    adv, ret = algos.compute_gae_advantage_return(t["token_level_rewards"], t["values"], t["response_mask"], gamma,
                                                  lam)
    valid = t["response_mask"][_real(t)].bool()
    a, g = adv[_real(t)][valid], ret[_real(t)][valid]
    return {"critic/advantages/mean": float(a.mean()), "critic/advantages/max": float(a.max()),
            "critic/advantages/min": float(a.min()), "critic/returns/mean": float(g.mean()),
            "critic/returns/max": float(g.max()), "critic/returns/min": float(g.min())}


def actor_opt_step(r: Run, s: int, k: int, eps_low: float, eps_high: float, clip_ratio_c: float,
                   plan: list | None = None) -> dict[str, float]:
    """Optimizer step ``k``'s actor metrics with that clip window and dual-clip bound (ppolab.algos.ppo_loss per rank
    and micro-batch of ``plan`` — :func:`micro_what_if`'s — or of the recorded plan, as the worker calls it)."""
    cfg = actor_config(r, clip_ratio_low=eps_low, clip_ratio_high=eps_high, clip_ratio_c=clip_ratio_c)
    return _actor_metrics(r, s, k, cfg, _update_plan(r, s, plan))


def actor_reduced(r: Run, s: int, eps_low: float, eps_high: float, clip_ratio_c: float,
                  plan: list | None = None) -> dict[str, float]:
    """Every optimizer step of the actor at that setting (:func:`actor_opt_step`), reduced as ``reduce_metrics``
    logs them: the mean over optimizer steps. The config and the plan are built once for all of them."""
    cfg = actor_config(r, clip_ratio_low=eps_low, clip_ratio_high=eps_high, clip_ratio_c=clip_ratio_c)
    update = _update_plan(r, s, plan) or capstone_plan(r, s, "actor")
    steps = [_actor_metrics(r, s, k, cfg, update) for k in range(len(update.steps))]
    return {key: float(np.mean([m[key] for m in steps])) for key in steps[0]}


def critic_reduced(r: Run, s: int, cliprange_value: float) -> dict[str, float]:
    """Every critic update at that ε_v, on the recorded ``critic_vpreds`` (``algos.value_loss`` per
    rank and micro-batch of the recorded critic plan; sums of loss shares, plain means of the rest; means over
    ranks and optimizer steps)."""
    t = r.step(s).tensors
    if "critic_vpreds" not in t:
        raise RunLacks("a critic (critic_vpreds recorded)", r)
    critic = r.ppo_config().critic
    steps = []
    for k, opt in enumerate(capstone_plan(r, s, "critic").steps):
        info = opt.info()
        per_rank = []
        for micro in opt.micro_batches:
            out = []
            for mb in micro:
                idx = torch.as_tensor(mb)
                mask = t["response_mask"][idx].float()
                values = t["values"][idx].float()
                v = torch.where(mask > 0, torch.nan_to_num(t["critic_vpreds"][k][idx].float(), nan=0.0), values)
                _, metrics = algos.value_loss(v, t["returns"][idx].float(), values, mask, cliprange_value,
                                              critic.loss_agg_mode, info)
                out.append(metrics)
            per_rank.append(accumulate_micro_metrics(out))
        steps.append({key: float(np.mean([m[key] for m in per_rank])) for key in per_rank[0]})
    return {key: float(np.mean([m[key] for m in steps])) for key in steps[0]}


def total_losses(r: Run, s: int) -> dict[str, float]:
    """17.7: ``actor/loss`` = pg_loss − entropy_coeff·entropy_loss + kl_loss_coef·kl_loss (each reduction on the way
    is linear) at 17.5's what-if, and ``critic/loss`` = vf_loss at 17.6's, where the run has a critic. A run whose
    loss had an entropy term it did not record (no ``actor_entropy``) cannot rebuild actor/loss: left out."""
    a = r.ppo_config().actor_rollout_ref.actor
    m = actor_reduced(r, s, **what_if("17.5", r))
    out = {}
    if a.entropy_coeff == 0 or "actor/entropy_loss" in m:
        loss = m["actor/pg_loss"] - a.entropy_coeff * m.get("actor/entropy_loss", 0.0)
        if a.use_kl_loss:
            loss += a.kl_loss_coef * m["actor/kl_loss"]
        out["actor/loss"] = float(loss)
    if "critic_vpreds" in r.step(s).tensors:
        out["critic/loss"] = critic_reduced(r, s, **what_if("17.6", r))["critic/vf_loss"]
    return out


def truth(part: str, run: Run | str | None = None, step: int | None = None) -> dict[str, float]:
    """``part``'s graded answer: its metrics at :func:`what_if` (17.4 at the optimizer step
    :func:`ppolab.numbers.capstone.actor_case` picks)."""
    from ppolab.numbers.capstone import actor_case

    r = resolve_run(run, SHIPPED)
    s = _step(r, step)
    w = what_if(part, r)
    if part == "17.1":
        return reward_kl(r, s, **w)
    if part == "17.2":
        return rejection(r, s, **w)
    if part == "17.3":
        return gae(r, s, **w)
    if part == "17.4":
        return actor_opt_step(r, s, actor_case(r)["opt_step"], **w)
    if part == "17.5":
        return actor_reduced(r, s, **w)
    if part == "17.6":
        return critic_reduced(r, s, **w)
    if part == "17.7":
        return total_losses(r, s)
    raise KeyError(f"part {part!r} has no what-if; parts: 17.1 … 17.7")
