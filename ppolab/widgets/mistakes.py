"""Lab 16 (chapter §16): the nine most common mistakes, each reproduced on a recorded step with a toggle.

Every mistake is a :class:`Mistake` record (title, chapter section, the switch that flips it, what goes wrong)
and a ``reproduce(run, step, opt_step)`` function returning an :class:`Effect`: the same quantity computed
with the mistake *off* (what the trainer really does) and *on* (what the mistaken belief implies), on the
real recorded tensors or through the real config checks. Every number comes from ``ppolab.algos``,
``ppolab.batching`` or ``ppolab.config``; nothing here re-implements a formula.

:func:`mistakes_explorer` puts the nine behind a dropdown and an on/off toggle.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
import torch

from ppolab.i18n import tr
from ppolab.vocab import clip_bounds
from ppolab.algos import (
    FixedKLController,
    GlobalBatchInfo,
    agg_loss,
    apply_kl_penalty,
    compute_grpo_outcome_advantage,
    get_policy_loss_fn,
    kl_penalty,
    masked_mean,
    ppo_loss,
)
from ppolab.batching import padding_multiple, plan_batches
from ppolab.config import validate
from ppolab.config.validation import kl_twice_notice
from ppolab.run.reader import Run
from ppolab.run.step import StepRecord
from ppolab.update_plan import micro_batches
from ppolab.widgets.common import (
    _box,
    opt_step_label,
    actor_config,
    real_rows,
    resolve_run,
    on_move,
)
from ppolab.numbers.steps import global_batch_info, loss_mask_of_real_rows
from ppolab.numbers.mistakes import (  # noqa: F401 (re-exported)
    KL_SWEEP,
    pg_of,
    mistake_setup,
    kl_drowning,
    kl_term_vs_policy_gradient,
    reference_drift,
)

__all__ = ["MISTAKES", "Effect", "Mistake", "kl_drowning", "kl_term_vs_policy_gradient", "mistakes_explorer",
           "reference_drift", "reproduce"]


@dataclass
class Effect:
    """What one mistake does to one quantity: ``off`` (correct) and ``on`` (mistaken), plus context.

    ``pair`` (optional): two 1-D tensors (off, on) of the same length, drawn as a per-row/per-token figure,
    with ``pair_label`` naming its x axis. ``details``: further numbers the explanation quotes.
    """

    quantity: str
    off: float
    on: float
    pair: tuple[torch.Tensor, torch.Tensor] | None = None
    pair_label: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def differs(self) -> bool:
        return self.off != self.on


@dataclass(frozen=True)
class Mistake:
    """One of chapter §16's nine mistakes."""

    key: str
    number: int
    title: str
    section: str
    switch: str
    off_label: str
    on_label: str
    what_goes_wrong: str
    reproduce: Callable[..., Effect]


# ------------------------------------------------------------------------------------------------ helpers


def _global_info(r: Run, rec: StepRecord, k: int) -> GlobalBatchInfo:
    """What the worker passed as ``global_batch_info`` for optimizer step ``k`` — its recorded update plan
    (:func:`ppolab.numbers.steps.global_batch_info`), with ``dp_size`` 1 (the rows of every rank are here at once):
    ``batch_num_tokens`` = Σ loss_mask, ``global_batch_size`` = ppo_mini_batch_size × rollout.n — a fixed count of
    rows that includes synthetic padding rows (verl ``engine`` / ``losses.ppo_loss``)."""
    return global_batch_info(r, rec, k)


def _plan(r: Run, forget_n: bool = False, micro: int | None = None):
    """The run's batch plan, padded as the trainer pads (to lcm(dp_size, actor mini×n, critic mini×n));
    ``forget_n`` plans the same counts read as if ppo_mini_batch_size were already in trajectories."""
    c = r.ppo_config()
    a = c.actor_rollout_ref.actor
    tb, n = c.data.train_batch_size, c.actor_rollout_ref.rollout.n
    mini = a.ppo_mini_batch_size
    micro = a.ppo_micro_batch_size_per_gpu if micro is None else micro
    dp = int(r.info.get("dp_size", 1) or 1)
    minis = [mini] + ([c.critic.ppo_mini_batch_size] if c.use_critic else [])
    if forget_n:
        return plan_batches(tb * n, 1, mini, dp, None, a.ppo_epochs, pad_to=padding_multiple(dp, *minis))
    return plan_batches(tb, n, mini, dp, micro, a.ppo_epochs, pad_to=c.padding_multiple(dp))


# ------------------------------------------------------------------------------------- the nine mistakes
def _m1_grpo_loss(run=None, step=None, opt_step=None) -> Effect:
    """adv_estimator=grpo still dispatches the loss named by policy_loss.loss_mode (vanilla PPO clip)."""
    r, rec, k, b = mistake_setup(run, step, opt_step)
    cfg_run = r.ppo_config()
    as_run = cfg_run.actor_rollout_ref.actor.policy_loss.loss_mode  # what adv_estimator=grpo really runs
    cfg = actor_config(r)
    off_loss, off_m = pg_of(cfg, b)
    assumed = actor_config(r, loss_mode="gspo")
    on_loss, on_m = pg_of(assumed, b)
    return Effect(
        "actor/pg_loss", float(off_loss), float(on_loss),
        details={"adv_estimator": cfg_run.algorithm.adv_estimator, "loss_mode_run": as_run,
                 "loss_fn": get_policy_loss_fn(as_run).__name__,
                 "pg_clipfrac_off": off_m["actor/pg_clipfrac"], "pg_clipfrac_on": on_m["actor/pg_clipfrac"],
                 "opt_step": opt_step_label(rec, k)})


def _m2_ppo_kl(run=None, step=None, opt_step=None) -> Effect:
    """actor/ppo_kl (current vs π_old) read as the reference KL (current vs π_ref)."""
    r, rec, k, b = mistake_setup(run, step, opt_step)
    _, m = pg_of(actor_config(r), b)
    ref_tok = kl_penalty(b["log_prob"], b["ref_log_prob"], "k1")
    old_tok = -kl_penalty(b["log_prob"], b["old_log_probs"], "k1")  # ppo_kl's token term, old − current
    ref_kl = float(masked_mean(ref_tok, b["response_mask"]))
    mask = b["response_mask"] > 0
    return Effect(
        "KL estimate (k1, token mean)", ref_kl, float(m["actor/ppo_kl"]),
        pair=(ref_tok[mask], old_tok[mask]), pair_label="response token",
        details={"reference_kl_k1": ref_kl, "ppo_kl": float(m["actor/ppo_kl"]), "opt_step": opt_step_label(rec, k)})


def _m3_kl_twice(run=None, step=None, opt_step=None) -> Effect:
    """Both KL paths on: validate's notice, and the reward-side term on top of the loss-side one.

    On a run trained with the reward-side KL (``use_kl_in_reward``, e.g. ppo_fire_tiny) the reward side is the real
    thing: the recorded ``token_level_rewards`` against ``token_level_scores``, shaped with the β the controller held
    at that step. On a run without it, the reward side is a what-if: ``apply_kl_penalty`` with
    ``FixedKLController(algorithm.kl_ctrl.kl_coef)`` on the recorded π_old / π_ref."""
    r, rec, _k, b = mistake_setup(run, step, opt_step)
    notices = {}
    for on in (False, True):
        cfg = r.ppo_config()  # a fresh copy on every call
        cfg.actor_rollout_ref.actor.use_kl_loss = True
        cfg.algorithm.use_kl_in_reward = on
        notices[on] = [n for n in validate(cfg) if n == kl_twice_notice()]  # in the notebook's language
    a = actor_config(r, use_kl_loss=True)
    _, m = ppo_loss(a, old_log_prob=b["old_log_probs"], log_prob=b["log_prob"], advantages=b["advantages"],
                    response_mask=b["response_mask"], ref_log_prob=b["ref_log_prob"])
    loss_side = a.kl_loss_coef * m["actor/kl_loss"]
    t = rec.tensors
    real = real_rows(rec)
    alg = r.ppo_config().algorithm
    scores = t["token_level_scores"].float()
    recorded = alg.use_kl_in_reward and "token_level_rewards" in t
    if recorded:
        rewards = t["token_level_rewards"].float()
        beta_col = "actor/reward_kl_penalty_coeff"
        beta = (float(r.metrics.loc[rec.step, beta_col]) if beta_col in r.metrics.columns
                else float(alg.kl_ctrl.kl_coef))
    else:
        mask = loss_mask_of_real_rows(rec)
        rewards, rm = apply_kl_penalty(scores, t["old_log_probs"].float(), t["ref_log_prob"].float(), mask,
                                       FixedKLController(alg.kl_ctrl.kl_coef), alg.kl_penalty)
        beta = rm["actor/reward_kl_penalty_coeff"]
    shift = (scores - rewards).abs().sum(-1)[real]
    off_r, on_r = scores.sum(-1), rewards.sum(-1)
    return Effect(
        "ConfigNotice 'both KL paths' from validate", float(len(notices[False])), float(len(notices[True])),
        pair=(off_r[real], on_r[real]),
        pair_label="trajectory (sequence reward)",
        details={"notice": (notices[True] or [""])[0], "run_has_both_paths": bool(alg.use_kl_in_reward)
                 and bool(r.ppo_config().actor_rollout_ref.actor.use_kl_loss),
                 "reward_side_recorded": recorded, "kl_ctrl": alg.kl_ctrl.type,
                 "reward_side_beta": beta, "loss_side_coef": a.kl_loss_coef, "loss_side_term": loss_side,
                 "mean_reward_shift": float(shift.mean())})


def _micro(r: Run, rows: int) -> tuple[int, bool]:
    micro = r.ppo_config().actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or rows
    if micro >= rows:  # one micro-batch per mini-batch: show a what-if split into two
        return max(1, rows // 2), True
    return micro, False


def _m4_micro_batch(run=None, step=None, opt_step=None) -> Effect:
    """Micro-batches normalised as if each were the batch: the accumulated loss is n_micro × too large.

    Mistake off is the engine: every micro-batch divides its token sum by ``batch_num_tokens`` = Σ loss_mask of the
    whole global mini-batch — which still counts the tokens rejection sampling zeroed in ``response_mask``."""
    r, rec, k, b = mistake_setup(run, step, opt_step)
    n_rows = int(b["rows"].numel())
    micro, what_if = _micro(r, n_rows)
    parts = micro_batches(range(n_rows), micro, None)  # the planner's fixed split of the step's rows
    info = _global_info(r, rec, k)
    cfg = actor_config(r)
    whole, _ = pg_of(cfg, b, info=info)
    sums = {}
    for mistaken in (False, True):
        losses = [pg_of(cfg, {kk: v[idx] for kk, v in b.items() if kk != "rows"}, info=None if mistaken else info)[0]
                  for idx in parts]
        sums[mistaken] = torch.stack(losses)
    plan = _plan(r)
    n_resp = float(b["response_mask"].sum())
    return Effect(
        "accumulated loss of one mini-batch", float(sums[False].sum()), float(sums[True].sum()),
        pair=(sums[False], sums[True]), pair_label="micro-batch",
        details={"mini_batch_loss": float(whole), "n_micro": len(parts), "micro": micro, "what_if": what_if,
                 "dp_size": int(r.info.get("dp_size", 1) or 1),
                 "batch_num_tokens": int(info.batch_num_tokens), "response_tokens": int(n_resp),
                 "rejected_tokens_in_denominator": int(info.batch_num_tokens) - int(n_resp),
                 "optimizer_steps": plan.optimizer_steps,
                 "steps_if_micro_were_batch": (plan.n_trajectories + plan.padding_rows) // micro * plan.ppo_epochs})


def _m5_forget_n(run=None, step=None, opt_step=None) -> Effect:
    """ppo_mini_batch_size read as trajectories, forgetting the trainer's × rollout.n."""
    r, rec, _k, _b = mistake_setup(run, step, opt_step)
    right, wrong = _plan(r), _plan(r, forget_n=True)
    steps = rec.plan("actor").steps
    return Effect(
        "optimizer steps per training step", float(right.optimizer_steps), float(wrong.optimizer_steps),
        details={"rollout_n": right.rollout_n, "global_mini_batch": right.global_mini_batch,
                 "global_mini_batch_forgot_n": wrong.global_mini_batch,
                 "recorded_optimizer_steps": len(steps), "recorded_rows_per_step": [len(o.rows()) for o in steps]})


def _m6_epochs(run=None, step=None, opt_step=None) -> Effect:
    """ppo_epochs as a repeated forward of the same policy: ratio ≡ 1, so ppo_kl and the clip vanish."""
    r, rec, k, b = mistake_setup(run, step, opt_step)
    cfg = actor_config(r)
    _, m_off = pg_of(cfg, b)
    _, m_on = pg_of(cfg, b, log_prob=b["old_log_probs"])
    mask = b["response_mask"] > 0
    dlp = (b["log_prob"] - b["old_log_probs"])[mask]
    plan = _plan(r)
    return Effect(
        "actor/ppo_kl", float(m_off["actor/ppo_kl"]), float(m_on["actor/ppo_kl"]),
        pair=(dlp, torch.zeros_like(dlp)), pair_label="response token (log π_θ − log π_old)",
        details={"pg_clipfrac_off": m_off["actor/pg_clipfrac"], "pg_clipfrac_on": m_on["actor/pg_clipfrac"],
                 "optimizer_steps": plan.optimizer_steps, "ppo_epochs": plan.ppo_epochs,
                 "opt_step": opt_step_label(rec, k)})


def _row_weights(mask: torch.Tensor, mode: str, **info: Any) -> torch.Tensor:
    """How much each row weighs in ``agg_loss``: ∂agg/∂(a constant loss on the row), by autograd."""
    x = torch.ones_like(mask, requires_grad=True)
    agg_loss(x, mask, mode, **info).backward()
    return (x.grad * mask).sum(-1)


def _m7_agg_mode(run=None, step=None, opt_step=None) -> Effect:
    """token-mean vs seq-mean-token-mean: different length weighting, different objective.

    Both with the trainer's global normalisation: token-mean divides by Σ loss_mask of the mini-batch, the seq-mean
    modes by the fixed ``global_batch_size`` = ppo_mini_batch_size × n, which counts synthetic padding rows (and rows
    rejection sampling emptied) although they carry no token."""
    r, rec, k, b = mistake_setup(run, step, opt_step)
    info = _global_info(r, rec, k)
    cfgs = {mode: actor_config(r, loss_agg_mode=mode) for mode in ("token-mean", "seq-mean-token-mean")}
    off, _ = pg_of(cfgs["token-mean"], b, info=info)
    on, _ = pg_of(cfgs["seq-mean-token-mean"], b, info=info)
    keep = b["response_mask"].sum(-1) > 0
    w_tm = _row_weights(b["response_mask"], "token-mean", **info.as_kwargs())[keep]
    w_sm = _row_weights(b["response_mask"], "seq-mean-token-mean", **info.as_kwargs())[keep]
    lengths = b["response_mask"].sum(-1)[keep]
    pad = ~real_rows(rec)[b["rows"]]
    return Effect(
        "actor/pg_loss", float(off), float(on), pair=(w_tm, w_sm), pair_label="trajectory (its weight in the loss)",
        details={"min_length": int(lengths.min()), "max_length": int(lengths.max()),
                 "weight_ratio_longest_vs_shortest_token_mean": float(w_tm.max() / w_tm.min()),
                 "rows": int(b["rows"].numel()), "global_batch_size": int(info.global_batch_size),
                 "padding_rows": int(pad.sum()), "empty_real_rows": int((~keep & ~pad).sum()),
                 "trajectories_with_tokens": int(keep.sum()),
                 "token_mean_weight_sum": float(w_tm.sum()), "seq_mean_weight_sum": float(w_sm.sum())})


#: Positions of every response treated as a tool observation in mistake 8 when the run has no tool turns (a
#: what-if, synthetic: the first two response tokens stand in for text a tool wrote). A tool run (grpo_tool_tiny)
#: has real ones: ``response_attention_mask`` 1 (attended) and ``response_mask`` 0 (not trained).
OBSERVATION_POSITIONS = slice(0, 2)


def _observations(rec: StepRecord, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, bool]:
    """(obs, simulated): the observation tokens of the optimizer step's rows, (n_rows, R) float."""
    t = rec.tensors
    if "response_attention_mask" in t:
        attn = t["response_attention_mask"][b["rows"]].float() * real_rows(rec)[b["rows"]].float().unsqueeze(-1)
        obs = attn * (1 - t.get("loss_mask", t["response_mask"])[b["rows"]].float())
        if obs.sum() > 0:
            return obs, False
    obs = torch.zeros_like(b["response_mask"])
    obs[:, OBSERVATION_POSITIONS] = 1.0
    return obs * b["response_mask"], True


def _m8_tool_obs(run=None, step=None, opt_step=None) -> Effect:
    """Tool-observation tokens left in response_mask get policy gradient as if the model had chosen them.

    On a tool run the observations are the real ones, with their recorded log-probs, and with the mistake on the
    advantage reaches them too (the GRPO advantage is computed again with them in the mask, as the trainer would).
    On a run without tool turns the first two response tokens play the observation (what-if, synthetic)."""
    r, rec, k, b = mistake_setup(run, step, opt_step)
    obs, simulated = _observations(rec, b)
    cfg = actor_config(r)
    if simulated:
        masks = {False: b["response_mask"] * (1 - obs), True: b["response_mask"]}
        advs = {False: b["advantages"], True: b["advantages"]}
        log_prob = b["log_prob"]
    else:
        t = rec.tensors
        masks = {False: b["response_mask"], True: b["response_mask"] + obs}
        raw = t["actor_log_probs"][k][b["rows"]].float()
        log_prob = torch.where(obs > 0, torch.nan_to_num(raw), b["log_prob"])
        full = t["response_mask"].float() * real_rows(rec).float().unsqueeze(-1)
        full[b["rows"]] = masks[True]
        alg = r.ppo_config().algorithm
        if alg.adv_estimator == "grpo":
            adv_on, _ = compute_grpo_outcome_advantage(
                t["token_level_rewards"].float(), full, t["uid"].tolist(),
                norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)
            adv_on = adv_on[b["rows"]]
        else:  # one advantage per trajectory, spread over the observation tokens too
            per_row = (b["advantages"] * b["response_mask"]).sum(-1) / b["response_mask"].sum(-1).clamp(min=1)
            adv_on = torch.where(obs > 0, per_row.unsqueeze(-1), b["advantages"])
        advs = {False: b["advantages"], True: adv_on}
    grads, losses = {}, {}
    for mistaken in (False, True):
        lp = log_prob.clone().requires_grad_(True)
        loss, _ = pg_of(cfg, {**b, "advantages": advs[mistaken]}, log_prob=lp, mask=masks[mistaken])
        loss.backward()
        grads[mistaken], losses[mistaken] = lp.grad, float(loss.detach())
    count = {m: int(((grads[m] != 0) & (obs > 0)).sum()) for m in grads}
    return Effect(
        "observation tokens that receive gradient", float(count[False]), float(count[True]),
        pair=(grads[False][obs > 0].abs(), grads[True][obs > 0].abs()), pair_label="observation token (|∂loss/∂log π|)",
        details={"simulated": simulated, "observation_tokens": int(obs.sum()),
                 "rows_with_observations": int((obs.sum(-1) > 0).sum()), "rows": int(b["rows"].numel()),
                 "pg_loss_off": losses[False], "pg_loss_on": losses[True]})


def _m9_clip_only(run=None, step=None, opt_step=None) -> Effect:
    """Widening the clip changes the clip fraction, never the trajectories whose advantage is zero."""
    r, rec, _k, b = mistake_setup(run, step, opt_step)
    base = actor_config(r)
    low, high = clip_bounds(base)  # the window itself: clip_ratio alone is not it (verl's defaults set both bounds)
    tuned = actor_config(r, clip_ratio=base.clip_ratio / 2, clip_ratio_low=low / 2, clip_ratio_high=high / 2)
    rows_with_grad, zero_adv_with_grad, metrics, losses, row_grad = {}, {}, {}, {}, {}
    nonempty = b["response_mask"].sum(-1) > 0  # padding rows and rows rejection sampling emptied carry no token
    zero_adv = nonempty & ((b["advantages"].abs() * b["response_mask"]).sum(-1) == 0)
    for name, cfg in (("off", base), ("on", tuned)):
        lp = b["log_prob"].clone().requires_grad_(True)
        loss, metrics[name] = pg_of(cfg, b, log_prob=lp)
        loss.backward()
        row_grad[name] = lp.grad.abs().sum(-1)
        losses[name] = float(loss.detach())
        rows_with_grad[name] = int((row_grad[name] > 0).sum())
        zero_adv_with_grad[name] = int(((row_grad[name] > 0) & zero_adv).sum())
    t = rec.tensors
    real = real_rows(rec)
    grpo = {}
    if r.ppo_config().algorithm.adv_estimator == "grpo":  # trajectories of groups whose scores were all equal
        mask = t["response_mask"].float() * real.float().unsqueeze(-1)
        adv, _ = compute_grpo_outcome_advantage(t["token_level_rewards"].float(), mask, t["uid"].tolist())
        grpo = {"grpo_no_signal_trajectories": int(((adv.abs() * mask).sum(-1)[real] == 0).sum())}
    return Effect(
        "actor/pg_loss", losses["off"], losses["on"], pair=(row_grad["off"], row_grad["on"]),
        pair_label="trajectory (Σ|∂loss/∂log π| over its tokens)",
        details={"clip_off": clip_bounds(base)[1], "clip_on": clip_bounds(tuned)[1],
                 "pg_clipfrac_off": metrics["off"]["actor/pg_clipfrac"],
                 "pg_clipfrac_on": metrics["on"]["actor/pg_clipfrac"], "rows": int(nonempty.sum()),
                 "rows_without_tokens": int((~nonempty).sum()),
                 "zero_advantage_rows": int(zero_adv.sum()), "rows_with_gradient_off": rows_with_grad["off"],
                 "rows_with_gradient_on": rows_with_grad["on"],
                 "zero_advantage_rows_with_gradient_off": zero_adv_with_grad["off"],
                 "zero_advantage_rows_with_gradient_on": zero_adv_with_grad["on"],
                 **grpo, "trajectories": int(real.sum())})


MISTAKES: dict[str, Mistake] = {m.key: m for m in [
    Mistake("grpo_loss", 1, "adv_estimator=grpo does not make the loss GRPO", "§5.1",
            "algorithm.adv_estimator vs actor.policy_loss.loss_mode",
            "loss the run really used (loss_mode from the config: vanilla PPO clip)",
            "the loss you assumed grpo selects (you would have to set policy_loss.loss_mode=gspo)",
            "The estimator only decides how advantages are computed. The loss that consumes them is looked up by "
            "policy_loss.loss_mode, whose default is the vanilla clipped PPO loss, whatever the estimator.",
            _m1_grpo_loss),
    Mistake("ppo_kl_is_not_ref_kl", 2, "actor/ppo_kl is not the reference KL", "§7.5",
            "which pair of policies the KL compares",
            "reference KL: current π_θ vs π_ref (what use_kl_loss penalises)",
            "actor/ppo_kl: current π_θ vs π_old (one PPO update's drift)",
            "ppo_kl measures how far the current update drifted from π_old (the PPO ratio's anchor, recomputed by "
            "the trainer before the update); it resets every step. Distance to the frozen reference π_ref grows "
            "over training and is a different number.",
            _m2_ppo_kl),
    Mistake("kl_twice", 3, "Both KL paths on means the KL constraint counts twice", "§7.4",
            "algorithm.use_kl_in_reward (with actor.use_kl_loss=true)",
            "loss-side KL only", "loss-side KL + reward-side KL",
            "The reward-side KL shapes the rewards before the advantage; the loss-side KL adds a term to every "
            "actor loss. They act at different stages and add up; validate() emits a ConfigNotice. (ppo_fire_tiny "
            "turns both on deliberately: there 'mistake on' is the run as recorded, its rewards shaped by the "
            "adaptive β. On a run without the reward-side KL that half is a what-if at kl_ctrl.kl_coef.)",
            _m3_kl_twice),
    Mistake("micro_is_not_the_batch", 4, "A micro-batch is not the training batch", "§11.3, §13",
            "normalise each micro-batch by the global mini-batch (global_batch_info) or by itself",
            "global normalisation: micro losses add up to the mini-batch loss",
            "each micro-batch treated as the batch: accumulated loss ≈ n_micro × too large",
            "The optimizer steps once per mini-batch; micro-batches are only gradient-accumulation slices. Treating "
            "a micro-batch as the batch miscounts optimizer steps and mis-scales the accumulated loss. The engine "
            "divides every micro-batch by batch_num_tokens = Σ loss_mask of the global mini-batch, which still "
            "counts the tokens rejection sampling removed from response_mask.",
            _m4_micro_batch),
    Mistake("forget_rollout_n", 5, "Forgetting that the mini-batch is multiplied by rollout.n", "§11.2",
            "ppo_mini_batch_size × rollout.n",
            "trainer arithmetic: mini-batch = ppo_mini_batch_size × n trajectories",
            "forgot × n: mini-batch = ppo_mini_batch_size trajectories",
            "ppo_mini_batch_size counts prompts; the trainer multiplies it by rollout.n. Forgetting it makes memory "
            "estimates n× too small and the optimizer-step count n× too large.",
            _m5_forget_n),
    Mistake("epochs_are_updates", 6, "ppo_epochs are real updates, not repeated forwards", "§12.2",
            "log_prob of a later optimizer step: recomputed by the updated policy, or the old one again",
            "log-probs recomputed by the updated policy (recorded)",
            "as if nothing were updated: log_prob = old_log_probs",
            "Every mini-batch of every epoch takes an optimizer step, and the next forward sees the updated "
            "weights. That is why the ratio leaves 1 and the clip starts to bite in later optimizer steps.",
            _m6_epochs),
    Mistake("agg_mode_weights", 7, "loss_agg_mode weights lengths differently", "§10",
            "actor.loss_agg_mode", "token-mean (every token weighs the same)",
            "seq-mean-token-mean (every trajectory weighs the same)",
            "token-mean gives a long trajectory more weight than a short one; seq-mean-token-mean gives each "
            "trajectory equal weight. Switching changes the objective being optimised, not just its scale. In "
            "training the seq-mean modes divide by global_batch_size = ppo_mini_batch_size × n, which counts "
            "synthetic padding rows: the real trajectories' weights then sum to less than 1.",
            _m7_agg_mode),
    Mistake("tool_obs_as_action", 8, "Tool observations are not model actions", "§9",
            "response_mask on the observation tokens (0 or 1)",
            "observation tokens masked out (response_mask = 0)", "observation tokens left in the mask",
            "Tool output sits in the response so the model can attend to it, but the model did not choose those "
            "tokens. With response_mask = 0 they get no policy gradient; left in, the model is pushed to "
            "'produce' text a tool wrote. On a tool run (grpo_tool_tiny) the observations are the real ones "
            "(response_attention_mask 1, response_mask 0); on a run without tool turns the first two response "
            "tokens play the observation (what-if, synthetic).",
            _m8_tool_obs),
    Mistake("clip_without_advantage", 9, "Tuning the clip ratio without checking the advantages", "§4",
            "actor.clip_ratio (halved)", "clip_ratio as configured", "clip_ratio halved (the knob tuned)",
            "The clip ratio changes how many tokens are clipped, but a trajectory whose advantage is zero "
            "(a group whose samples all scored the same, or a reward drowned by the KL penalty) gets no "
            "gradient under any clip.",
            _m9_clip_only),
]}


def reproduce(key: str, run=None, step: int | None = None, opt_step: int | None = None) -> Effect:
    """The :class:`Effect` of mistake ``key`` (a key of :data:`MISTAKES`, or its number 1–9)."""
    if isinstance(key, int) and not isinstance(key, bool):
        by_number = {m.number: m for m in MISTAKES.values()}
        if key not in by_number:
            raise ValueError(f"mistake number {key} is out of range; allowed: 1 … 9")
        key = by_number[key].key
    if key not in MISTAKES:
        raise ValueError(f"unknown mistake {key!r}; choose one of {', '.join(MISTAKES)}")
    return MISTAKES[key].reproduce(run, step, opt_step)


def _detail(key: str, v: Any) -> str:
    """One value of Effect.details as HTML: numbers as they are, names and flags (``adaptive``, ``True``) in code font,
    and the one value that is prose, validate()'s notice, as validate() wrote it: in the notebook's language."""
    if isinstance(v, float):
        return f"{v:.6g}"
    if key == "notice":
        return v
    if isinstance(v, bool) or (isinstance(v, str) and v and not any(c.isspace() for c in v)):
        return f"<code>{v}</code>"
    return str(v)


def _explain(m: Mistake, e: Effect, on: bool) -> str:
    d = "".join(f"<li><code>{k}</code>: {_detail(k, v)}</li>" for k, v in e.details.items())
    # whole templates are the i18n keys, so no single word such as "on" becomes a key of its own
    head = tr("<b>{n}. {title}</b> (chapter §16, mistake {n} of nine; {section})<br>"
              "switch: <code>{switch}</code><br>")
    now = tr("<b>now showing — mistake ON:</b> {state}<br>" if on else "<b>now showing — mistake OFF:</b> {state}<br>")
    values = tr("{quantity}: off = <b>{off:.6g}</b>, on = <b>{on:.6g}</b><br>")
    return (head.format(n=m.number, title=tr(m.title), section=m.section, switch=tr(m.switch))
            + now.format(state=tr(m.on_label if on else m.off_label))
            + values.format(quantity=tr(e.quantity), off=e.off, on=e.on) + f"{tr(m.what_goes_wrong)}<ul>{d}</ul>")


def mistakes_explorer(run: Run | str | None = None, step: int | None = None, mistake: str | None = None,
                      on: bool = False) -> W.VBox:
    """The nine mistakes of chapter §16 on a recorded step (default: the last one) of ``run``.

    Controls: ``mistake`` (Dropdown of the nine keys), ``on`` (ToggleButton: the mistake on/off).
    Figures: ``effect`` (the quantity with the mistake off and on, the current state highlighted) and
    ``detail`` (the per-row/per-token pair where the mistake has one). ``state`` holds the current ``effect``.
    """
    r = resolve_run(run)
    rec = r.step(step)
    mistake = mistake or next(iter(MISTAKES))
    if mistake not in MISTAKES:
        raise ValueError(f"mistake must be one of {', '.join(MISTAKES)}, got {mistake!r}")
    controls = {
        "mistake": W.Dropdown(options=[(f"{m.number}. {tr(m.title)}", k) for k, m in MISTAKES.items()], value=mistake,
                              description=tr("mistake"), layout=W.Layout(width="640px")),
        "on": W.ToggleButton(value=bool(on), description=tr("mistake on"), icon="bug"),
    }
    figs = {"effect": go.FigureWidget(layout={"height": 300, "showlegend": False}),
            "detail": go.FigureWidget(layout={"height": 300})}
    figs["effect"].add_bar(x=["off", "on"], y=[0, 0])
    figs["detail"].add_scatter(mode="markers", name=tr("mistake off"), marker={"size": 5})
    figs["detail"].add_scatter(mode="markers", name=tr("mistake on"), marker={"size": 5, "symbol": "x"})
    text = W.HTML()
    state: dict[str, Any] = {}
    cache: dict[str, Effect] = {}

    @on_move
    def refresh(*_):
        key, is_on = controls["mistake"].value, controls["on"].value
        if key not in cache:
            cache[key] = reproduce(key, r, rec.step)
        m, e = MISTAKES[key], cache[key]
        state.update(effect=e, mistake=key, on=is_on)
        with figs["effect"].batch_update():
            figs["effect"].data[0].update(x=[tr("off: {label}").format(label=tr(m.off_label))[:60],
                                             tr("on: {label}").format(label=tr(m.on_label))[:60]], y=[e.off, e.on],
                                          marker={"color": ["#1f77b4" if not is_on else "#c7c7c7",
                                                            "#d62728" if is_on else "#f4b6b6"]})
            figs["effect"].layout.title = tr("{n}. {title} — {quantity}").format(n=m.number, title=tr(m.title),
                                                                                 quantity=tr(e.quantity))
            figs["effect"].layout.yaxis.title = tr(e.quantity)
        with figs["detail"].batch_update():
            if e.pair is not None:
                xs = list(range(len(e.pair[0])))
                figs["detail"].data[0].update(x=xs, y=e.pair[0].tolist(), visible=True)
                figs["detail"].data[1].update(x=xs, y=e.pair[1].tolist(), visible=True)
                figs["detail"].data[0].opacity = 0.3 if is_on else 1.0
                figs["detail"].data[1].opacity = 1.0 if is_on else 0.3
                figs["detail"].layout.title = tr("per {what}: off vs on").format(what=tr(e.pair_label))
                figs["detail"].layout.xaxis.title = tr(e.pair_label)
            else:
                figs["detail"].data[0].update(x=[], y=[])
                figs["detail"].data[1].update(x=[], y=[])
                figs["detail"].layout.title = tr("(no per-row detail for this mistake: it is a count)")
        text.value = _explain(m, e, is_on)

    for ctl in controls.values():
        ctl.observe(refresh, names="value")
    refresh()
    children = [W.HBox([controls["mistake"], controls["on"]]), text, figs["effect"], figs["detail"]]
    return _box(children, controls, figs, state=state, run=r, record=rec)


# ------------------------------------------------------------------ mistake 9, the KL halves (chapter §16, §7)


