"""The actor's and critic's per-micro-batch loss assembly (chapter §5, §8; verl ``workers/utils/losses.py``:
``ppo_loss``, ``value_loss``).

L_actor = L_PG − c_H·H + c_KL·K̂_ref (chapter §5), each term aggregated by ``agg_loss`` with the *global*
mini-batch counts passed as ``global_batch_info``, so the micro-batch losses of one mini-batch add up to the
mini-batch objective (chapter §13).
"""
from __future__ import annotations

from typing import Callable

import torch

from ppolab.algos.aggregation import GlobalBatchInfo, agg_loss, batch_info_kwargs
from ppolab.algos.kl import kl_penalty
from ppolab.algos.masked import masked_mean
from ppolab.algos.policy_loss import get_policy_loss_fn
from ppolab.algos.value import compute_value_loss

#: Metrics that are SUM-aggregated over micro-batches (each already divided by the global count);
#: every other actor/critic metric is a plain MEAN over micro-batches (verl `losses.ppo_loss`, chapter §15).
SUM_METRICS = ("actor/pg_loss", "actor/entropy_loss", "actor/kl_loss", "critic/vf_loss")


def ppo_loss_terms(
    config,
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    entropy: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The actor loss of one micro-batch as its terms (chapter §5), each a scalar tensor as it enters the sum —
    (terms, metrics), terms keyed by :data:`LOSS_TERMS`; the arguments as :func:`ppo_loss`.

    ``pg``: the policy-gradient loss from the registry entry ``config.policy_loss.loss_mode`` (rollout IS weights,
    if any, multiply only this term — chapter §3); ``entropy`` (if ``entropy`` is given): −entropy_coeff · agg(H);
    ``kl`` (if ``config.use_kl_loss``): kl_loss_coef · agg(kl_penalty(log_prob, ref, kl_loss_type)). Separate
    backward passes of the terms give each term's share of the gradient; their sum is the loss.
    """
    mode, info = config.loss_agg_mode, batch_info_kwargs(config, global_batch_info)
    policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
    pg_loss, metrics = policy_loss_fn(old_log_prob, log_prob, advantages, response_mask, mode, config,
                                      rollout_is_weights, global_batch_info=global_batch_info)
    metrics = dict(metrics)
    metrics["actor/pg_loss"] = float(pg_loss.detach())
    terms = {"pg": pg_loss}
    if entropy is not None:
        entropy_loss = agg_loss(entropy, response_mask, mode, **info)
        terms["entropy"] = -(config.entropy_coeff * entropy_loss)
        metrics["actor/entropy_loss"] = float(entropy_loss.detach())
    if config.use_kl_loss:
        kld = kl_penalty(log_prob, ref_log_prob, config.kl_loss_type)
        kl_loss = agg_loss(kld, response_mask, mode, **info)
        terms["kl"] = config.kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = float(kl_loss.detach())
        metrics["actor/kl_coef"] = float(config.kl_loss_coef)
    return terms, metrics


#: The terms of the actor loss, in the order they are summed (:func:`ppo_loss_terms`).
LOSS_TERMS = ("pg", "entropy", "kl")


def ppo_loss(
    config,
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    entropy: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
    terms: tuple[str, ...] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch of the actor loss (chapter §5): all tensors (bs, T); returns (loss, metrics).

    Every tensor is a keyword (two log-prob tensors of the same shape must not be swappable by position);
    ``global_batch_info``: the global mini-batch counts every term is normalised by (None: this micro-batch's own).

    1. pg_loss from the registry entry ``config.policy_loss.loss_mode`` (rollout IS weights, if any,
       multiply only this term — chapter §3);
    2. if ``entropy`` is given: loss −= entropy_coeff · agg(H);
    3. if ``config.use_kl_loss``: loss += kl_loss_coef · agg(kl_penalty(log_prob, ref, kl_loss_type)).

    ``terms``: only these of :data:`LOSS_TERMS` enter the returned loss (a reading of one term's gradient); None, as
    the trainer calls it: all of them.
    """
    parts, metrics = ppo_loss_terms(config, old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                                    response_mask=response_mask, entropy=entropy, ref_log_prob=ref_log_prob,
                                    rollout_is_weights=rollout_is_weights, global_batch_info=global_batch_info)
    loss = None
    for name in LOSS_TERMS:  # pg − c·H + β·KL, in the chapter's order
        if name in parts and (terms is None or name in terms):
            loss = parts[name] if loss is None else loss + parts[name]
    if loss is None:  # a term the run has none of: no gradient from it
        loss = parts["pg"] * 0.0
    return loss, metrics


def value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str,
    global_batch_info: GlobalBatchInfo | None = None,
    loss_fn: Callable | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch of the critic loss (chapter §8): clipped value loss with global normalisation.

    Metrics: ``critic/vf_loss``, ``critic/vf_clipfrac`` and ``critic/vpred_mean`` = masked mean of vpreds.
    ``loss_fn``: None — verl's :func:`compute_value_loss`; else a value loss of lab 17's form, called as
    ``loss_fn(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode,
    global_batch_info=global_batch_info) -> (vf_loss, vf_clipfrac)`` (verl has no registry for the value loss;
    this is how lab 17's part II trains a critic with the learner's).
    """
    if loss_fn is None:
        info = global_batch_info.as_kwargs() if global_batch_info is not None else {}
        loss, clipfrac = compute_value_loss(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode,
                                            **info)
    else:
        loss, clipfrac = loss_fn(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode,
                                 global_batch_info=global_batch_info)
    return loss, {
        "critic/vf_loss": float(loss.detach()),
        "critic/vf_clipfrac": float(clipfrac),
        "critic/vpred_mean": float(masked_mean(vpreds.detach(), response_mask)),
    }
