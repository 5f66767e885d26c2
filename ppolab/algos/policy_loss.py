"""Policy losses, found by name through a registry (chapter §3–§5; verl `core_algos.compute_policy_loss_vanilla`;
`core_algos` policy losses).

Every loss has verl's signature ``fn(old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode="token-mean", config=None, rollout_is_weights=None) -> (pg_loss, metrics)``, with all
tensors (bs, T) and ``config`` a :class:`ppolab.config.ActorConfig`, plus one keyword: ``global_batch_info``, a
:class:`GlobalBatchInfo` with the global mini-batch counts (dp_size, batch_num_tokens, global_batch_size,
loss_scale_factor) that :func:`agg_loss` normalises by. The engine computes it once per mini-batch, before the
micro-batch loop, and passes it in plain sight. verl instead writes it into ``config.global_batch_info`` at run
time; a config built by hand with that dict is still read (how the parity tests drive both libraries), and with
neither the normalisation is local to the micro-batch.

The advantage estimator and the loss mode are orthogonal (chapter §5.1): ``adv_estimator=grpo``
still runs the ``vanilla`` clipped loss unless ``policy_loss.loss_mode`` says otherwise.
"""
from __future__ import annotations

from typing import Callable

import torch

from ppolab.algos.aggregation import GlobalBatchInfo, agg_loss, batch_info_kwargs
from ppolab.vocab import clip_bounds  # noqa: F401 (re-exported: algos.policy_loss.clip_bounds)
from ppolab.algos.masked import masked_mean

#: Log-ratio clamp before exp (vanilla, sapo, cispo): keeps the ratio in [e^-20, e^20] (chapter §3).
LOG_RATIO_CLAMP = 20.0
#: GSPO clamps its per-token log-ratio only from above, at 10.
GSPO_LOG_RATIO_MAX = 10.0

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a loss to :data:`POLICY_LOSS_REGISTRY` under its config name.

    Registering the same function again is a no-op; a *different* function under a taken name raises
    ``ValueError`` (verl's advantage registry does this; its policy-loss registry silently overwrites, which
    would let a typo'd plug-in replace ``vanilla`` unnoticed).
    """

    def add(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSS_REGISTRY and POLICY_LOSS_REGISTRY[name] is not fn:
            raise ValueError(f"policy loss {name!r} is already registered: {POLICY_LOSS_REGISTRY[name]} vs {fn}")
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return add


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The loss registered as ``actor.policy_loss.loss_mode = name``; unknown names list the valid ones."""
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"policy_loss.loss_mode={name!r} is not registered; choose one of {', '.join(POLICY_LOSS_REGISTRY)}"
        )
    return POLICY_LOSS_REGISTRY[name]


def _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_batch_info):
    """Multiply the (detached) rollout IS weights in after clipping, then aggregate with the global counts (verl
    `core_algos.compute_policy_loss_vanilla` step 7–8)."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **batch_info_kwargs(config, global_batch_info))


def _float(x: torch.Tensor) -> float:
    return float(x.detach().item())


def ppo_clip_terms(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
) -> dict[str, torch.Tensor]:
    """Every intermediate of the vanilla PPO loss, token by token (chapter §3, §4; verl
    `core_algos.compute_policy_loss_vanilla` steps 1–6).

    Shapes: all (bs, T) (or any common shape) → a dict of tensors of that shape:
    ``log_ratio`` d = clamp(lp − old, ±20), ``ratio`` r = e^d, ``pg_losses1`` −A·r,
    ``pg_losses2`` −A·clip(r, 1−ε_low, 1+ε_high), ``pg_losses_clip`` max of the two,
    ``pg_losses3`` −A·c, ``pg_losses`` the final per-token loss (dual clip where A < 0),
    ``clipped`` (L2 > L1) and ``dual_clipped`` (L_clip > L3 and A < 0) as 0/1 floats.
    The labs call this to show which tokens are clipped; the loss below calls it to compute them.
    """
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses_clip = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    pg_losses = torch.where(advantages < 0, torch.min(pg_losses3, pg_losses_clip), pg_losses_clip)
    return {
        "log_ratio": log_ratio,
        "ratio": ratio,
        "pg_losses1": pg_losses1,
        "pg_losses2": pg_losses2,
        "pg_losses_clip": pg_losses_clip,
        "pg_losses3": pg_losses3,
        "pg_losses": pg_losses,
        "clipped": torch.gt(pg_losses2, pg_losses1).float(),
        "dual_clipped": torch.gt(pg_losses_clip, pg_losses3).float() * (advantages < 0).float(),
    }


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric and dual clip (chapter §3, §4.1–4.4; verl
    `core_algos.compute_policy_loss_vanilla`).

    d = clamp(lp − old, −20, 20),  r = e^d
    L_clip = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high))       (min of objectives = max of losses)
    L = min(L_clip, −A·c)  where A < 0, else L_clip          (dual clip, c = clip_ratio_c > 1)

    Metrics: ``actor/pg_clipfrac`` = share of tokens where the clipped loss is strictly larger (before
    dual clip), ``actor/ppo_kl`` = masked mean of old − lp (current vs the PPO anchor, *not* the
    reference KL, chapter §7.5), ``actor/pg_clipfrac_lower`` = share where the dual clip bites.
    """
    assert config is not None, "compute_policy_loss_vanilla needs an ActorConfig"
    eps_low, eps_high = clip_bounds(config)
    clip_ratio_c = config.get("clip_ratio_c", 3.0)
    assert clip_ratio_c > 1.0, f"clip_ratio_c must be > 1.0 for dual clip, got {clip_ratio_c}"
    terms = ppo_clip_terms(old_log_prob, log_prob, advantages, eps_low, eps_high, clip_ratio_c)
    pg_loss = _aggregate(terms["pg_losses"], response_mask, loss_agg_mode, config, rollout_is_weights,
                         global_batch_info)
    return pg_loss, {
        "actor/pg_clipfrac": _float(masked_mean(terms["clipped"], response_mask)),
        "actor/ppo_kl": _float(masked_mean(-terms["log_ratio"], response_mask)),
        "actor/pg_clipfrac_lower": _float(masked_mean(terms["dual_clipped"], response_mask)),
    }


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: one sequence-level ratio s_i = exp(Σ_t (lp−old)·m / max(T_i, 1)) per trajectory (verl `core_algos` policy
    losses).

    Per token: log r = lp − sg(lp) + sg(log s_i), clamped at max 10; then the PPO clip (no dual clip).
    The value of r is s_i on every token of the row; the gradient flows through each token's lp.
    Aggregated with the configured ``loss_agg_mode`` (verl 0.9.1; later verl forces seq-mean-token-mean).
    """
    assert config is not None, "compute_policy_loss_gspo needs an ActorConfig"
    eps_low, eps_high = clip_bounds(config)
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    seq_log_ratio = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=GSPO_LOG_RATIO_MAX))

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_batch_info)
    return pg_loss, {
        "actor/pg_clipfrac": _float(masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)),
        "actor/ppo_kl": _float(masked_mean(-negative_approx_kl, response_mask)),
        "actor/pg_clipfrac_lower": 0.0,
    }


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: L = −sg(clip(r, 1−ε_low, 1+ε_high))·A·log π_θ (verl `core_algos` policy losses).

    The clip bounds the *weight*, never the gradient path: unlike vanilla, a clipped token still
    pushes its log-prob. ``pg_clipfrac`` = share of tokens whose ratio was changed by the clip.
    """
    assert config is not None, "compute_policy_loss_cispo needs an ActorConfig"
    eps_low, eps_high = clip_bounds(config)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(negative_approx_kl)
    clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high).detach()
    pg_losses = -clipped_ratio * advantages * log_prob
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_batch_info)
    return pg_loss, {
        "actor/pg_clipfrac": _float(masked_mean((ratio != clipped_ratio).float(), response_mask)),
        "actor/ppo_kl": _float(masked_mean(-negative_approx_kl, response_mask)),
        "actor/pg_clipfrac_lower": 0.0,
    }


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG: L = −log π_θ·A, no ratio and no clip; returns no metrics (verl `core_algos` policy losses)."""
    assert config is not None, "compute_policy_loss_gpg needs an ActorConfig"
    pg_losses = -log_prob * advantages
    return _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_batch_info), {}


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO: a smooth sigmoid gate replaces the hard clip (verl `core_algos` policy losses).

    r = exp(clamp(lp − old, ±20)), τ = tau_pos if A > 0 else tau_neg,
    gate = σ(τ·(r − 1))·4/τ, L = −gate·A. Always aggregated with ``seq-mean-token-mean``,
    whatever ``loss_agg_mode`` says; the clip fractions are reported as 0.
    """
    assert config is not None, "compute_policy_loss_sapo needs an ActorConfig"
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(negative_approx_kl)
    tau = torch.where(advantages > 0, torch.full_like(ratio, config.tau_pos), torch.full_like(ratio, config.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gate * advantages
    pg_loss = _aggregate(pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights,
                         global_batch_info)
    return pg_loss, {
        "actor/pg_clipfrac": 0.0,
        "actor/ppo_kl": _float(masked_mean(-negative_approx_kl, response_mask)),
        "actor/pg_clipfrac_lower": 0.0,
    }
