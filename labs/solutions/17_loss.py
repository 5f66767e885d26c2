"""Lab 17, part II: a learner's three losses in plain torch — no ``ppolab.algos`` — and twelve plausible wrong versions.

``policy_loss`` has verl's registry signature and is plugged into the trainer as a ``loss_mode``; ``actor_loss``
assembles a micro-batch's loss from it, the entropy bonus and the loss-side KL; ``value_loss`` is the critic's clipped
loss. ``loss_set(mistake)`` returns the three with one mistake built in; ``FIRST_STAGE`` names the stage of
``ppolab.experiments.capstone_grade.grade_hidden`` that must catch it (the first that can see it).
"""
import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("solutions_17", Path(__file__).with_name("17.py"))
_part_one = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_part_one)
kl_estimate = _part_one.kl_estimate  # part I's estimators (k1 / abs / k2 / k3 with verl's clamps)
EPS = 1e-8


def _msum(x, m, dim=None):
    y = torch.where(m.bool(), x, torch.zeros_like(x)) * m
    return y.sum() if dim is None else y.sum(dim)


def _mmean(x, m):
    return _msum(x, m) / (m.sum() + EPS)


def aggregate(loss, mask, mode, info, mistake=None):
    """A micro-batch's share of the global mini-batch's loss under ``mode``: the global counts when the engine
    gives them (this micro-batch's own otherwise), × dp_size."""
    dp = 1 if mistake == "dp_factor" else info.dp_size
    if mistake == "aggregation":
        mode = "token-mean"
    if mode == "token-mean":
        n = info.batch_num_tokens if info.batch_num_tokens is not None and mistake != "local_counts" else mask.sum()
        return _msum(loss, mask) / n * dp
    if mode == "token-sum":
        return _msum(loss, mask) * dp
    lengths = mask.sum(-1)
    nonempty = (lengths > 0).to(loss.dtype)
    rows = (loss * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        rows = rows / (lengths + EPS)
    b = info.global_batch_size if info.global_batch_size is not None and mistake != "local_counts" \
        else nonempty.sum()
    out = (rows * nonempty).sum() / b * dp
    if mode == "seq-mean-token-sum-norm":
        out = out / (info.loss_scale_factor if info.loss_scale_factor is not None else mask.shape[-1])
    return out


def make_policy_loss(mistake=None):
    def policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                    rollout_is_weights=None, *, global_batch_info=None):
        from ppolab.algos.aggregation import GlobalBatchInfo

        info = global_batch_info or GlobalBatchInfo()
        low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
        high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
        if mistake == "clip_bounds":
            high = low
        c = config.clip_ratio_c
        A = advantages
        log_ratio = log_prob - old_log_prob if mistake == "ratio_clamp" else torch.clamp(log_prob - old_log_prob,
                                                                                          -20.0, 20.0)
        ratio = torch.exp(log_ratio)
        sign = -1.0 if mistake != "sign" else 1.0
        l1 = sign * A * ratio
        l2 = sign * A * torch.clamp(ratio, 1 - low, 1 + high)
        clipped = torch.maximum(l1, l2)
        l3 = -A * c
        losses = clipped if mistake == "dual_clip" else torch.where(A < 0, torch.minimum(l3, clipped), clipped)
        if rollout_is_weights is not None:
            losses = losses * rollout_is_weights
        mask = torch.ones_like(response_mask) if mistake == "mask" else response_mask
        pg_loss = aggregate(losses, mask, loss_agg_mode, info, mistake)
        metrics = {"actor/pg_clipfrac": float(_mmean((l2 > l1).to(A.dtype), response_mask).detach()),
                   "actor/ppo_kl": float(_mmean(-log_ratio, response_mask).detach()),
                   "actor/pg_clipfrac_lower": float(_mmean(((clipped > l3) & (A < 0)).to(A.dtype),
                                                                 response_mask).detach())}
        return pg_loss, metrics
    return policy_loss


def make_actor_loss(mistake=None):
    def actor_loss(pg_loss, entropy, log_prob, ref_log_prob, response_mask, config, *, global_batch_info=None):
        info, mode = global_batch_info, config.loss_agg_mode
        loss = pg_loss
        if entropy is not None:
            bonus = config.entropy_coeff * aggregate(entropy, response_mask, mode, info)
            loss = loss + bonus if mistake == "entropy_sign" else loss - bonus
        if config.use_kl_loss:
            lp = log_prob.detach() if mistake == "kl_placement" else log_prob  # the KL moves π_θ, not a constant
            kld = kl_estimate(lp, ref_log_prob, config.kl_loss_type)
            if mistake == "k3_clamp" and config.kl_loss_type.rstrip("+") in ("low_var_kl", "k3"):
                x = torch.clamp(ref_log_prob - lp, -20, 20)
                kld = torch.exp(x) - x - 1  # k3 without its clamp to [−10, 10]
            loss = loss + config.kl_loss_coef * aggregate(kld, response_mask, mode, info)
        return loss
    return actor_loss


def make_value_loss(mistake=None):
    def value_loss(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode="token-mean", *,
                   global_batch_info=None):
        from ppolab.algos.aggregation import GlobalBatchInfo

        info = global_batch_info or GlobalBatchInfo()
        centre = returns if mistake == "value_clip" else values
        v_clip = torch.clamp(vpreds, centre - cliprange_value, centre + cliprange_value)
        e1, e2 = (vpreds - returns).square(), (v_clip - returns).square()
        loss = 0.5 * aggregate(torch.maximum(e1, e2), response_mask, loss_agg_mode, info)
        return loss, _mmean((e2 > e1).to(vpreds.dtype), response_mask)
    return value_loss


def loss_set(mistake=None):
    """(policy_loss, actor_loss, value_loss) with ``mistake`` built into the one it belongs to."""
    return make_policy_loss(mistake), make_actor_loss(mistake), make_value_loss(mistake)


#: The twelve plausible wrong losses and the stage of grade (a) that must catch each first.
FIRST_STAGE = {
    "sign": "surrogate",              # −A·r written A·r: the update climbs the loss
    "clip_bounds": "clip",            # one ε for both sides: clip_ratio_high ignored
    "dual_clip": "dual clip",         # no −A·c bound for negative advantages
    "ratio_clamp": "ratio clamp",     # r = exp(log_prob − old_log_prob) without the ±20 clamp
    "mask": "mask",                   # padded positions counted
    "aggregation": "aggregation",     # token-mean whatever loss_agg_mode says
    "local_counts": "global counts",  # each micro-batch averaged by itself, then summed: a mean of micro-batches
    "dp_factor": "dp factor",         # no × dp_size: every rank's gradient shrinks by the rank count
    "entropy_sign": "entropy",        # the bonus added: entropy is pushed down
    "kl_placement": "kl loss",        # the KL of a detached π_θ: the term is there, its gradient is not
    "k3_clamp": "kl clamp",           # low_var_kl without its clamp to [−10, 10]
    "value_clip": "value clip",       # V clipped around the return instead of V_old
}
