"""Solutions to lab 17 (the capstone): one recorded training step rebuilt in plain torch — no ``ppolab.algos``.

Each ``part_17_k(run, …settings)`` is the code a learner writes in the lab: at the run's own settings (the default)
it rebuilds what ``metrics.jsonl`` logged, and the graded answer is the same code at the settings
``capstone_what_if.what_if`` names (:data:`SOLUTIONS`); ``mistake=`` makes one of the plausible wrong versions the
checks must refuse. ``ppolab.numbers.capstone`` gives only the bookkeeping (which rows each rank and
micro-batch held, the logged metrics of the previous step); every formula is written out here.
"""
import math
from dataclasses import replace

import torch

from ppolab.numbers import capstone
from ppolab.numbers.capstone_what_if import what_if
from ppolab.run.reader import resolve_run

RUN = "ppo_fire_tiny"
EPS = 1e-8  # verl's masked denominators and whitening


# ------------------------------------------------------------------ plain-torch helpers
def msum(x, m, dim=None):
    """Σ x·m, with whatever sits outside the mask (NaN, inf) replaced by 0 first."""
    y = torch.where(m.bool(), x, torch.zeros_like(x)) * m
    return y.sum() if dim is None else y.sum(dim)


def mmean(x, m, dim=None):
    return msum(x, m, dim) / ((m.sum() if dim is None else m.sum(dim)) + EPS)


def kl_estimate(logp, ref, kind):
    """k1 / abs / k2 / k3 of log π − log π_ref (a trailing '+' changes only the gradient)."""
    kind = kind.rstrip("+")
    d = logp - ref
    if kind in ("kl", "k1"):
        return d
    if kind == "abs":
        return d.abs()
    if kind in ("mse", "k2"):
        return 0.5 * d.square()
    x = torch.clamp(-d, -20, 20)  # low_var_kl / k3: clamp the log-ratio, then the value
    return torch.clamp(torch.exp(x) - x - 1, -10, 10)


def aggregate(loss, mask, mode, n_tokens, n_seqs, dp, scale=None):
    """agg_loss with the global counts: token-mean divides by the global Σ loss_mask, seq modes by the global
    mini-batch rows, and every mode multiplies by dp_size (the ranks' gradients are averaged)."""
    if mode == "token-mean":
        return msum(loss, mask) / n_tokens * dp
    if mode == "token-sum":
        return msum(loss, mask) * dp
    has = (mask.sum(-1) > 0).to(loss.dtype)
    per_row = (loss * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        per_row = per_row / (mask.sum(-1) + EPS)
    out = (per_row * has).sum() / n_seqs * dp
    if mode == "seq-mean-token-sum-norm":
        out = out / (scale if scale is not None else mask.shape[-1])
    return out


def _setup(run):
    r = resolve_run(run, RUN)
    s = capstone.capstone_step(r)
    rec = r.step(s)
    t = rec.tensors
    real = ~t["is_pad"].bool() if "is_pad" in t else torch.ones(t["responses"].shape[0], dtype=torch.bool)
    return r, s, t, real


def _pre_mask(t):
    """The mask before rejection sampling: loss_mask (the copy made at rollout, never rewritten)."""
    return t["loss_mask"].float() if "loss_mask" in t else t["response_mask"].float()


# ------------------------------------------------------------------ 17.1 rewards with the reward-side KL
def part_17_1(run=None, mistake=None, kl_penalty=None, kl_ctrl=None):
    r, s, t, real = _setup(run)
    alg = r.ppo_config().algorithm
    ctrl = kl_ctrl or alg.kl_ctrl
    beta = ctrl.kl_coef
    if ctrl.type == "adaptive" and s > 1 and mistake != "initial_beta":  # step 0 logs validation only
        prev = capstone.logged(r, s - 1)
        beta = prev["actor/reward_kl_penalty_coeff"]
        if mistake != "beta_from_previous_step":
            n = t["token_level_scores"].shape[0]  # sequences in the batch, padding rows too
            if mistake == "real_rows_only":
                n = int(real.sum())
            error = min(max(prev["actor/reward_kl_penalty"] / ctrl.target_kl - 1, -0.2), 0.2)
            beta = beta * (1 + error * n / ctrl.horizon)
    mask = t["response_mask"].float() if mistake == "mask_after_rejection" else _pre_mask(t)
    kind = alg.kl_penalty if mistake == "run_estimator" else (kl_penalty or alg.kl_penalty)
    kld = kl_estimate(t["old_log_probs"], t["ref_log_prob"], kind) * mask
    rewards = t["token_level_scores"] - beta * kld
    per_row = mmean(kld, mask, dim=-1)
    current_kl = per_row[real].mean() if mistake == "real_rows_only" else per_row.mean()
    return {"actor/reward_kl_penalty_coeff": beta, "actor/reward_kl_penalty": float(current_kl),
            "critic/rewards/mean": float(rewards.sum(-1)[real].mean())}


# ------------------------------------------------------------------ 17.2 the rejection masks
def _rs_specs(options, thresholds):
    opts = [o.strip() for o in options.split(",") if o.strip()]
    specs = [x.strip() for x in str(thresholds).split(",") if x.strip()]
    specs = specs * len(opts) if len(specs) == 1 else specs
    out = []
    for o, spec in zip(opts, specs):
        lo, hi = spec.split("_") if "_" in spec else (None, spec)
        lo, hi = (float(lo) if lo is not None else None), float(hi)
        if o.endswith("k1") and lo is None:
            lo = 1.0 / hi  # one number u: the ratio band [1/u, u]
        out.append((o, lo, hi))
    return out


def rejection_keep(t, options, thresholds, mistake=None):
    """1 where a token survives every option, 0 where one rejects it (rollout_rs; stage 7)."""
    m = _pre_mask(t)
    lr = torch.clamp(t["old_log_probs"] - t["rollout_log_probs"], -20, 20)
    stats = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1 - lr}
    keep = torch.ones_like(m)
    for option, lo, hi in _rs_specs(options, thresholds):
        level, k = option.rsplit("_", 1)
        lo, hi = (math.log(lo), math.log(hi)) if k == "k1" else (None, hi)
        x = stats[k]
        if level == "seq_sum":
            x = msum(x, m, dim=-1).unsqueeze(-1)
        elif level == "seq_mean":
            x = mmean(x, m, dim=-1).unsqueeze(-1)
        elif level == "seq_max":
            top = x.masked_fill(~m.bool(), float("-inf")).max(-1).values
            x = torch.where(torch.isinf(top), torch.zeros_like(top), top).unsqueeze(-1)
        ok = (x <= hi) & (x >= lo) if lo is not None else x <= hi
        keep = keep * ok.expand_as(m).float()
        if mistake == "first_option_only":
            break
    return keep


def part_17_2(run=None, mistake=None, rollout_rs=None, rollout_rs_threshold=None):
    r, s, t, real = _setup(run)
    corr = r.ppo_config().algorithm.rollout_correction
    m = _pre_mask(t)
    keep = rejection_keep(t, rollout_rs or corr.rollout_rs, rollout_rs_threshold or corr.rollout_rs_threshold,
                          mistake)
    rejected_rows = ((1 - keep) * m).sum(-1) > 0
    rows = real if mistake == "real_rows_only" else torch.ones_like(real)
    token_mask = t["response_mask"].float() if mistake == "mask_after_rejection" else m
    return {"rollout_corr/rollout_rs_masked_fraction": float(mmean(1 - keep, token_mask)),
            "rollout_corr/rollout_rs_seq_masked_fraction": float(rejected_rows[rows].float().mean())}


# ------------------------------------------------------------------ 17.3 GAE and whitening
def gae(rewards, values, mask, gamma, lam):
    """Backwards over t; a masked position passes V_next and the running GAE through unchanged."""
    next_value = torch.zeros_like(values[:, 0])
    last = torch.zeros_like(values[:, 0])
    out = []
    for i in reversed(range(rewards.shape[1])):
        m = mask[:, i]
        delta = rewards[:, i] + gamma * next_value - values[:, i]
        candidate = delta + gamma * lam * last
        next_value = values[:, i] * m + (1 - m) * next_value
        last = candidate * m + (1 - m) * last
        out.append(last)
    return torch.stack(out[::-1], dim=1)


def whiten(x, mask):
    mean = mmean(x, mask)
    n = mask.sum()
    var = mmean((x - mean) ** 2, mask) * n / (n - 1)  # unbiased
    return (x - mean) * torch.rsqrt(var + EPS)


def part_17_3(run=None, mistake=None, gamma=None, lam=None):
    r, s, t, real = _setup(run)
    alg = r.ppo_config().algorithm
    mask = _pre_mask(t) if mistake == "mask_before_rejection" else t["response_mask"].float()
    raw = gae(t["token_level_rewards"], t["values"], mask, alg.gamma if gamma is None else gamma,
              alg.lam if lam is None else lam)
    returns = raw + t["values"]
    adv = raw if mistake == "no_whitening" else whiten(raw, mask)
    if mistake == "returns_after_whitening":
        returns = adv + t["values"]
    valid = t["response_mask"][real].bool()
    a, g = adv[real][valid], returns[real][valid]
    return {"critic/advantages/mean": float(a.mean()), "critic/advantages/max": float(a.max()),
            "critic/advantages/min": float(a.min()), "critic/returns/mean": float(g.mean()),
            "critic/returns/max": float(g.max()), "critic/returns/min": float(g.min())}


# ------------------------------------------------------------------ 17.4 / 17.5 the actor's optimizer steps
def is_weights(r, t):
    """Truncated rollout IS weights (rollout_is = token / sequence), or None when the run has none."""
    corr = r.ppo_config().algorithm.rollout_correction
    if not corr.rollout_is or corr.bypass_mode:
        return None
    m = _pre_mask(t)
    lr = t["old_log_probs"] - t["rollout_log_probs"]
    if corr.rollout_is == "sequence":
        lr = msum(lr, m, dim=-1).unsqueeze(-1)
    w = torch.exp(torch.clamp(lr, -20, 20)).expand_as(m) * m
    spec = str(corr.rollout_is_threshold)
    if "_" in spec:  # IcePop: zero outside [lo, hi]
        lo, hi = (float(x) for x in spec.split("_"))
        return torch.where((w >= lo) & (w <= hi), w, torch.zeros_like(w))
    return torch.clamp(w, max=float(spec))


def actor_micro(t, k, idx, a, n_tokens, n_seqs, dp, weights=None, mistake=None):
    """One micro-batch of optimizer step k: (pg_loss, kl_loss and entropy_loss shares, pg_clipfrac,
    pg_clipfrac_lower, ppo_kl)."""
    mask = _pre_mask(t)[idx] if mistake == "loss_mask_in_loss" else t["response_mask"][idx].float()
    old = t["old_log_probs"][idx]
    lp = torch.where(mask > 0, torch.nan_to_num(t["actor_log_probs"][k][idx], nan=0.0), old)
    adv = t["advantages"][idx]
    eps_low = a.clip_ratio_low if a.clip_ratio_low is not None else a.clip_ratio
    eps_high = a.clip_ratio_high if a.clip_ratio_high is not None else a.clip_ratio
    log_ratio = torch.clamp(lp - old, -20, 20)
    ratio = torch.exp(log_ratio)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    lclip = torch.maximum(l1, l2)
    l3 = -adv * a.clip_ratio_c
    loss = lclip if mistake == "no_dual_clip" else torch.where(adv < 0, torch.minimum(l3, lclip), lclip)
    if weights is not None:
        loss = loss * weights[idx]
    scale = 1 if mistake == "no_dp_size" else dp
    tokens = mask.sum() if mistake == "local_tokens" else n_tokens
    pg = aggregate(loss, mask, a.loss_agg_mode, tokens, n_seqs, scale, a.loss_scale_factor)
    out = {"actor/pg_loss": float(pg), "actor/pg_clipfrac": float(mmean((l2 > l1).float(), mask)),
           "actor/pg_clipfrac_lower": float(mmean(((lclip > l3) & (adv < 0)).float(), mask)),
           "actor/ppo_kl": float(mmean(-log_ratio, mask))}
    if a.use_kl_loss:
        kl = kl_estimate(lp, t["ref_log_prob"][idx], a.kl_loss_type)
        out["actor/kl_loss"] = float(aggregate(kl, mask, a.loss_agg_mode, tokens, n_seqs, scale,
                                               a.loss_scale_factor))
    if "actor_entropy" in t:  # π_θ's entropy at optimizer step k — not stage 4's, which is π_old's
        h = t["entropy"][idx] if mistake == "stage4_entropy" else t["actor_entropy"][k][idx]
        out["actor/entropy_loss"] = float(aggregate(torch.nan_to_num(h, nan=0.0) * mask, mask, a.loss_agg_mode,
                                                    tokens, n_seqs, scale, a.loss_scale_factor))
    return out


# summed over micro-batches (each a share of the global value); the rest averaged
LOSSES = ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "critic/vf_loss")


def reduce_micro(micro, mistake=None):
    """One rank's mini-batch: loss shares add up, fractions are a plain mean over micro-batches."""
    keys = micro[0].keys()
    add = {"mean_over_micro": lambda k: False, "sum_over_micro": lambda k: True}.get(mistake, lambda k: k in LOSSES)
    return {k: sum(m[k] for m in micro) / (1 if add(k) else len(micro)) for k in keys}


def _with(config, **setting):
    """``config`` with the given settings (None: the run's own)."""
    return replace(config, **{k: v for k, v in setting.items() if v is not None})


def actor_step(run=None, k=0, mistake=None, eps_low=None, eps_high=None, clip_ratio_c=None, plan=None):
    """Optimizer step k's actor metrics: per rank Σ/mean over micro-batches, then the mean over ranks. ``plan``:
    which rows each micro-batch holds (``capstone.micro_batch_rows``'s form; None: the recorded one)."""
    r, s, t, real = _setup(run)
    cfg = r.ppo_config()
    a = _with(cfg.actor_rollout_ref.actor, clip_ratio_low=eps_low, clip_ratio_high=eps_high,
              clip_ratio_c=clip_ratio_c)
    plan = (plan or capstone.micro_batch_rows(r, s, "actor"))[k]
    dp = len(plan)
    rows = [i for rank in plan for mb in rank for i in mb]
    n_tokens = _pre_mask(t)[rows].sum()  # the global Σ loss_mask of this mini-batch, all ranks
    if mistake == "response_mask_tokens":
        n_tokens = t["response_mask"][rows].sum()
    n_seqs = a.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n
    w = is_weights(r, t)
    ranks = [reduce_micro([actor_micro(t, k, torch.as_tensor(mb), a, n_tokens, n_seqs, dp, w, mistake)
                           for mb in rank], mistake) for rank in plan]
    if mistake == "legacy":  # verl's legacy actor: each micro-batch its own token-mean, all averaged
        ranks = [reduce_micro([actor_micro(t, k, torch.as_tensor(mb), a, None, n_seqs, dp, w, "local_tokens")
                               for mb in rank], "mean_over_micro") for rank in plan]
        ranks = [{key: v / dp if key in LOSSES else v for key, v in m.items()} for m in ranks]
    if mistake == "sum_over_ranks":
        return {key: sum(m[key] for m in ranks) for key in ranks[0]}
    return {key: sum(m[key] for m in ranks) / dp for key in ranks[0]}


def part_17_4(run=None, mistake=None, **setting):
    return actor_step(run, capstone.actor_case(run)["opt_step"], mistake, **setting)


def part_17_5(run=None, mistake=None, **setting):
    r, s, t, real = _setup(run)
    n = len(setting.get("plan") or capstone.micro_batch_rows(r, s, "actor"))
    steps = [actor_step(r, k, mistake, **setting) for k in range(n)]
    if mistake == "last_step_only":
        return steps[-1]
    if mistake == "sum_over_steps":
        return {key: sum(m[key] for m in steps) for key in steps[0]}
    return {key: sum(m[key] for m in steps) / n for key in steps[0]}  # reduce_metrics: np.mean over steps


# ------------------------------------------------------------------ 17.6 the critic's updates
def critic_step(r, s, t, k, mistake=None, cliprange_value=None):
    cfg = r.ppo_config()
    c = _with(cfg.critic, cliprange_value=cliprange_value)
    plan = capstone.micro_batch_rows(r, s, "critic")[k]
    dp = len(plan)
    rows = [i for rank in plan for mb in rank for i in mb]
    n_tokens = _pre_mask(t)[rows].sum()
    n_seqs = c.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n
    ranks = []
    for rank in plan:
        micro = []
        for mb in rank:
            idx = torch.as_tensor(mb)
            mask = t["response_mask"][idx].float()
            values, returns = t["values"][idx], t["returns"][idx]
            v = torch.where(mask > 0, torch.nan_to_num(t["critic_vpreds"][k][idx], nan=0.0), values)
            clipped = torch.clamp(v, values - c.cliprange_value, values + c.cliprange_value)
            l1, l2 = (v - returns) ** 2, (clipped - returns) ** 2
            per_token = l1 if mistake == "no_value_clip" else torch.maximum(l1, l2)
            half = 1.0 if mistake == "no_half" else 0.5
            scale = 1 if mistake == "no_dp_size" else dp
            micro.append({"critic/vf_loss": float(half * aggregate(per_token, mask, c.loss_agg_mode, n_tokens,
                                                                   n_seqs, scale, c.loss_scale_factor)),
                          "critic/vf_clipfrac": float(mmean((l2 > l1).float(), mask)),
                          "critic/vpred_mean": float(mmean(v, mask))})
        ranks.append(reduce_micro(micro, mistake))
    return {key: sum(m[key] for m in ranks) / dp for key in ranks[0]}


def part_17_6(run=None, mistake=None, **setting):
    r, s, t, real = _setup(run)
    n = len(capstone.micro_batch_rows(r, s, "critic"))
    steps = [critic_step(r, s, t, k, mistake, **setting) for k in range(n)]
    return {key: sum(m[key] for m in steps) / n for key in steps[0]}


# ------------------------------------------------------------------ 17.7 the step's losses
def part_17_7(run=None, mistake=None, actor_setting=None, critic_setting=None):
    """actor/loss (and critic/loss) from 17.5's and 17.6's numbers at those settings (None: the run's own)."""
    r, s, t, real = _setup(run)
    a = r.ppo_config().actor_rollout_ref.actor
    actor = part_17_5(r, mistake="stage4_entropy" if mistake == "stage4_entropy" else None, **(actor_setting or {}))
    entropy = actor.get("actor/entropy_loss", 0.0)  # 17.5's own aggregate of actor_entropy
    sign = 1 if mistake == "entropy_added" else -1
    loss = actor["actor/pg_loss"] + sign * a.entropy_coeff * entropy
    if a.use_kl_loss:
        loss += (1.0 if mistake == "no_kl_coef" else a.kl_loss_coef) * actor["actor/kl_loss"]
    out = {"actor/loss": loss}
    if "critic_vpreds" in t:
        out["critic/loss"] = part_17_6(r, **(critic_setting or {}))["critic/vf_loss"]
    return out



# ------------------------------------------------------------------ 17.8 one step further: backpropagate the loss
def part_17_8(run=None, mistake=None):
    """The gradient of one LoRA tensor from the 17.4 policy loss, with log π from a forward that keeps the graph."""
    from ppolab.batch import Batch, trimmed_inputs
    from ppolab.exercises.lab17 import backprop_case
    from ppolab.replay import REPLAY_LOCK, run_models
    from ppolab.models import forward_response
    from ppolab.update_plan import recorded_plan

    r = resolve_run(run, RUN)
    cfg = r.ppo_config()
    a, temperature = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.temperature
    t = r.step(1).tensors
    opt = recorded_plan(r.step(1), cfg).steps[0]  # optimizer step 0: every rank's micro-batches
    n_tokens = _pre_mask(t)[opt.rows()].sum()  # the global Σ loss_mask (one process holds every rank's rows)
    eps_low = a.clip_ratio_low if a.clip_ratio_low is not None else a.clip_ratio
    eps_high = a.clip_ratio_high if a.clip_ratio_high is not None else a.clip_ratio
    w = is_weights(r, t)
    batch = Batch({k: t[k] for k in ("prompts", "prompt_mask", "responses", "response_mask",
                                      "response_attention_mask") if k in t})
    models = run_models(r)  # the seeded adapter: the weights optimizer step 0 of step 1 started from
    params = models.actor_parameters()
    i = backprop_case(r)["index"]
    with REPLAY_LOCK:
        for p in params:
            p.grad = None
        try:
            for rank in opt.micro_batches:
                for mb in rank:
                    ids, mask, width = trimmed_inputs(batch.select(mb))
                    with models.actor() as model:
                        lp = forward_response(model, ids, mask, width, temperature, True, False).log_probs
                    idx = torch.as_tensor(mb)
                    old, adv = t["old_log_probs"][idx, :width], t["advantages"][idx, :width]
                    m = t["response_mask"][idx, :width].float()
                    ratio = torch.exp(torch.clamp(lp - old, -20, 20))
                    lc = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
                    loss = torch.where(adv < 0, torch.minimum(lc, -adv * a.clip_ratio_c), lc)
                    if w is not None:
                        loss = loss * w[idx, :width]
                    count = m.sum() if mistake == "local_tokens" else n_tokens
                    out = msum(loss, m) / count * (len(opt.micro_batches) if mistake == "dp_size" else 1)
                    (-out if mistake == "sign" else out).backward()
            return params[i].grad.detach().clone()
        finally:
            for p in params:
                p.grad = None

#: Each part's code at the run's own settings: what the lab compares with metrics.jsonl before it grades.
AT_RUN_SETTINGS = {"17.1": part_17_1, "17.2": part_17_2, "17.3": part_17_3, "17.4": part_17_4, "17.5": part_17_5,
                   "17.6": part_17_6, "17.7": part_17_7}


def _graded(fn, part):
    """``fn`` at the settings the graded answer asks for (17.7: 17.5's and 17.6's)."""
    def answer(run=None, mistake=None):
        if part == "17.7":
            has_critic = "critic_vpreds" in _setup(run)[2]
            return fn(run, mistake, actor_setting=what_if("17.5", run),
                      critic_setting=what_if("17.6", run) if has_critic else None)
        return fn(run, mistake, **what_if(part, run))
    answer.__name__ = f"{fn.__name__}[what-if]"
    return answer


SOLUTIONS = {**{part: _graded(fn, part) for part, fn in AT_RUN_SETTINGS.items()}, "17.8": part_17_8}


def _wrong(fn, mistake):
    def answer(run=None):
        return fn(run, mistake=mistake)
    answer.__name__ = f"{fn.__name__}[{mistake}]"
    return answer


G = SOLUTIONS
WRONG = {
    "17.1": [_wrong(G["17.1"], m) for m in ("beta_from_previous_step", "mask_after_rejection", "real_rows_only",
                                            "initial_beta", "run_estimator")],
    "17.2": [_wrong(G["17.2"], m) for m in ("real_rows_only", "first_option_only", "mask_after_rejection")],
    "17.3": [_wrong(G["17.3"], m) for m in ("no_whitening", "mask_before_rejection", "returns_after_whitening")],
    "17.4": [_wrong(G["17.4"], m) for m in ("no_dp_size", "no_dual_clip", "local_tokens", "response_mask_tokens",
                                            "mean_over_micro", "sum_over_micro")],
    "17.5": [_wrong(G["17.5"], m) for m in ("no_dp_size", "legacy", "no_dual_clip", "sum_over_ranks",
                                            "mean_over_micro", "sum_over_micro",
                                            "last_step_only", "sum_over_steps", "response_mask_tokens",
                                            "stage4_entropy")],
    "17.6": [_wrong(G["17.6"], m) for m in ("no_dp_size", "no_value_clip", "no_half")],
    # (stage 4's entropy in place of π_θ's is 17.5's to catch: in actor/loss it moves by entropy_coeff × a small
    # entropy difference, ~1e-6 on ppo_fire_tiny — inside 17.7's tolerance)
    "17.7": [_wrong(G["17.7"], m) for m in ("entropy_added", "no_kl_coef")],
    "17.8": [_wrong(part_17_8, m) for m in ("sign", "local_tokens", "dp_size")],
}
