"""Advantage estimators, found by ``algorithm.adv_estimator`` (chapter §1, §5.1; verl `core_algos` advantages).

Each returns ``(advantages, returns)`` shaped (bs, T) and runs without gradient. The score of a
trajectory is s_i = Σ_t token_level_rewards[i, t] (the reward sits on the last response token).
Groups are keyed by ``index`` — one id per prompt (verl's ``uid``), an array of length bs.
The estimator decides *how* advantages are computed; the policy loss that consumes them is chosen
separately by ``actor.policy_loss.loss_mode`` (chapter §5.1).

Every registered function keeps verl 0.9.1's signature exactly (names, order, defaults, and ``**kwargs`` only where
verl has it: gae, grpo and grpo_vectorized have none), and the trainer calls them as verl's trainer does
(:mod:`ppolab.algos.advantages_dispatch`), so a keyword an estimator does not declare raises TypeError instead of
vanishing. Arguments verl declares and never reads are unused here too: ``epsilon`` of rloo, rloo_vectorized,
opo, reinforce_plus_plus_baseline and gpg, gpg's ``alpha``, grpo_passk's ``norm_adv_by_std_in_grpo`` (it reads
the config's), and the ``config`` the OTB estimators receive in ``**kwargs`` (tests/test_estimator_signatures.py;
tests/parity/test_verl_parity_modes.py checks the same of verl).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ppolab.algos.masked import masked_whiten

#: ε added to the group std by GRPO-style estimators (hard-coded in verl's call).
GRPO_EPS = 1e-6

AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATOR_REGISTRY: dict[str, AdvEstimatorFn] = {}


def register_adv_est(name: str) -> Callable[[AdvEstimatorFn], AdvEstimatorFn]:
    """Decorator adding an estimator to :data:`ADV_ESTIMATOR_REGISTRY` under its config name.

    As verl's ``register_adv_est``: the same function again is a no-op, a different function under a taken name
    raises ``ValueError``.
    """

    def add(fn: AdvEstimatorFn) -> AdvEstimatorFn:
        if name in ADV_ESTIMATOR_REGISTRY and ADV_ESTIMATOR_REGISTRY[name] is not fn:
            raise ValueError(f"adv estimator {name!r} is already registered: {ADV_ESTIMATOR_REGISTRY[name]} vs {fn}")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return add


def get_adv_estimator_fn(name: str) -> AdvEstimatorFn:
    """The estimator registered as ``algorithm.adv_estimator = name``; unknown names list the valid ones."""
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"algorithm.adv_estimator={name!r} is not registered; choose one of {', '.join(ADV_ESTIMATOR_REGISTRY)}"
        )
    return ADV_ESTIMATOR_REGISTRY[name]


def _groups(index: Sequence[Any]) -> dict[Any, list[int]]:
    """Row positions of each group id, in row order."""
    rows: dict[Any, list[int]] = defaultdict(list)
    for i, uid in enumerate(index):
        rows[uid.item() if hasattr(uid, "item") else uid].append(i)
    return rows


def _group_stats(scores: torch.Tensor, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, unbiased std) of a group; a singleton has mean 0 and std 1, as verl."""
    if len(rows) == 1:
        return torch.tensor(0.0, dtype=scores.dtype), torch.tensor(1.0, dtype=scores.dtype)
    group = scores[rows]
    return torch.mean(group), torch.std(group)


@register_adv_est("gae")
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation, backwards over t (verl `core_algos` advantages).

    δ_t = r_t + γ·V_next − V_t;  gae_t = δ_t + γλ·gae_{t+1}. Masked tokens (padding, tool
    observations) are skipped: V_next and gae keep their values across them. returns = adv + V
    *before* whitening; advantages are then whitened over the whole batch (unbiased var, 1e-8) and
    not re-masked. Raises ValueError on a batch with fewer than 2 valid tokens (masked_var).
    """
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    advantages_reversed = []
    for t in reversed(range(token_level_rewards.shape[1])):
        m = response_mask[:, t].to(values.dtype)
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * last_gae
        next_value = values[:, t] * m + (1 - m) * next_value
        last_gae = candidate * m + (1 - m) * last_gae
        advantages_reversed.append(last_gae)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, response_mask), returns


@register_adv_est("grpo")
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = GRPO_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: a_i = (s_i − mean_g)/(std_g + ε), or s_i − mean_g without std (Dr. GRPO) (verl `core_algos` advantages).

    std is unbiased (``torch.std``); a singleton group uses mean 0, std 1 (so a = s/(1+1e-6)); a group
    whose scores are all equal gets 0 — no signal (chapter §16, mistake 9). One scalar per
    trajectory, broadcast over its tokens × mask. returns = advantages.
    """
    scores = token_level_rewards.sum(dim=-1)
    out = scores.clone()
    for rows in _groups(index).values():
        mean, std = _group_stats(scores, rows)
        out[rows] = (scores[rows] - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores[rows] - mean
    advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


def _config_get(config: Any, name: str, default: Any = None) -> Any:
    """``config.get(name, default)`` as verl reads an AlgoConfig, for a mapping or a plain dataclass."""
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def scores_at_last_valid_response_token(scores: Any, attention_mask: torch.Tensor, prompt_length: int,
                                        response_mask: torch.Tensor) -> torch.Tensor:
    """(bs, T) float32 zeros with ``scores[i]`` at row i's last attended response position (verl gdpo's ``rm_scores``).

    Shapes: scores (bs,) (any array-like, cast to float32 as verl); attention_mask (bs, P + T) with the prompt in its
    first ``prompt_length`` columns; response_mask (bs, T) (only its shape and device are used). The position is
    Σ attention_mask[i, P:] − 1, i.e. the last response token for a right-padded response; a row with no attended
    response token gets its score in the last column (index −1), exactly as verl's indexing does.
    """
    device = response_mask.device
    valid_response_length = attention_mask[:, prompt_length:].sum(dim=1).long() - 1
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    out[torch.arange(out.size(0), device=device), valid_response_length.to(device)] = torch.tensor(
        np.asarray(scores, dtype=np.float32), device=device)
    return out


@register_adv_est("gdpo")
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = GRPO_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    batch: Mapping[str, torch.Tensor] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO: GRPO-normalise each reward component on its own, weight, sum, whiten over the batch (chapter §5.1;
    verl `core_algos.py::compute_gdpo_outcome_advantage`, same signature).

    Shapes: token_level_rewards, response_mask (bs, T). As verl's trainer calls it, ``non_tensor_batch`` maps
    each key of ``config.gdpo_reward_keys`` (required; each must be present) to bs per-row scores, and ``batch``
    holds ``prompts`` (bs, P) and ``attention_mask`` (bs, P + T): component k's score is placed at each row's last
    attended response token (:func:`scores_at_last_valid_response_token`), weights ``config.gdpo_reward_weights``
    (default all 1):

        A_k = grpo(score_k, index, ε, norm_adv_by_std_in_grpo)      (scores float32, as verl)
        A   = masked_whiten(Σ_k w_k·A_k, mask) × mask               (weights float32)

    Unless config, non_tensor_batch and batch are all given it falls back to one component, ``token_level_rewards``
    (= GRPO then a batch whitening), as verl does. verl's trainer passes no ``norm_adv_by_std_in_grpo``, so it
    stays True there. ``**kwargs`` swallows anything else, as verl's does. returns = advantages.
    """
    score_list, reward_weights = None, None
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = _config_get(config, "gdpo_reward_keys")
        if not keys:
            raise ValueError("GDPO requires 'algorithm.gdpo_reward_keys' listing the individual reward component keys "
                             "returned by compute_score (e.g. ['format_reward', 'accuracy_reward']).")
        missing = [k for k in keys if k not in non_tensor_batch]
        if missing:
            raise ValueError(f"GDPO reward key {missing[0]!r} not found in non_tensor_batch; available: "
                             f"{list(non_tensor_batch)}. Make sure compute_score returns a dict containing it.")
        prompt_length = batch["prompts"].size(1)
        score_list = [scores_at_last_valid_response_token(non_tensor_batch[k], batch["attention_mask"], prompt_length,
                                                          response_mask) for k in keys]
        gdpo_weights = _config_get(config, "gdpo_reward_weights")
        reward_weights = list(gdpo_weights) if gdpo_weights is not None else None
    if score_list is None:
        score_list = [token_level_rewards]
    w = torch.tensor(reward_weights if reward_weights is not None else [1.0] * len(score_list), dtype=torch.float32,
                     device=token_level_rewards.device)
    total = None
    for k, scores in enumerate(score_list):
        a_k, _ = compute_grpo_outcome_advantage(scores, response_mask, index, epsilon=epsilon,
                                                norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config)
        total = w[k] * a_k if total is None else total + w[k] * a_k
    advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages


@register_adv_est("rloo")
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = GRPO_EPS,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: a_i = s_i − mean of the *other* samples = (s_i − μ)·n/(n−1); a singleton keeps a_i = s_i."""
    scores = token_level_rewards.sum(dim=-1)
    out = scores.clone()
    for rows in _groups(index).values():
        n = len(rows)
        if n > 1:
            mean = torch.mean(scores[rows])
            out[rows] = scores[rows] * n / (n - 1) - mean * n / (n - 1)
    advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go G_t (γ = config.gamma), whitened over the batch × mask.

    The running return is carried unchanged across masked spans (verl fix #7278). Returns are not whitened.
    """
    gamma = config.gamma if config is not None else 1.0
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        m = response_mask[:, t].to(token_level_rewards.dtype)
        new = token_level_rewards[:, t] + gamma * running
        returns[:, t] = new * m
        running = new * m + (1 - m) * running
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@register_adv_est("reinforce_plus_plus_baseline")
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = GRPO_EPS,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with baseline: a_i = s_i − group mean (singleton mean 0), tiled × mask, whitened batch-wide ×
    mask."""
    scores = token_level_rewards.sum(dim=-1)
    out = scores.clone()
    for rows in _groups(index).values():
        mean, _ = _group_stats(scores, rows)
        out[rows] = scores[rows] - mean
    tiled = out.unsqueeze(-1).tile(1, response_mask.shape[-1]) * response_mask
    advantages = masked_whiten(tiled, response_mask) * response_mask
    return advantages, advantages


@register_adv_est("opo")
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = GRPO_EPS,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: length-weighted baseline b = Σ_j len_j·s_j / Σ_j len_j (singleton b = 0); a_i = s_i − b."""
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    out = scores.clone()
    for rows in _groups(index).values():
        if len(rows) > 1:
            baseline = (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()
            out[rows] = scores[rows] - baseline
    advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("gpg")
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = GRPO_EPS,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: a_i = α·(s_i − group mean)/f_norm with α = bs / max(#non-zero scores, 1); the std is unused.

    ``epsilon`` and the ``alpha`` argument are in verl's signature but unused there too (verl overwrites alpha with
    the batch ratio before reading it; tests/parity checks both change nothing)."""
    scores = token_level_rewards.sum(dim=-1)
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
    out = scores.clone()
    for rows in _groups(index).values():
        mean, _ = _group_stats(scores, rows)
        out[rows] = alpha * (scores[rows] - mean) / f_norm
    advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("grpo_passk")
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = GRPO_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO: only each group's best sample gets r_max − r_second (÷ (std + ε) if
    ``config.norm_adv_by_std_in_grpo`` — read from the config: the argument of that name is in verl's signature
    and overwritten from the config before use); all others get 0. Groups need ≥ 2 samples."""
    norm = getattr(config, "norm_adv_by_std_in_grpo", True) if config is not None else True
    scores = token_level_rewards.sum(dim=-1)
    out = torch.zeros_like(scores)
    for uid, rows in _groups(index).items():
        if len(rows) < 2:
            raise ValueError(f"grpo_passk needs at least 2 samples per group; group {uid!r} has {len(rows)}")
        group = scores[rows]
        top, top_idx = torch.topk(group, 2)
        advantage = top[0] - top[1]
        if norm:
            advantage = advantage / (torch.std(group) + epsilon)
        out[rows[int(top_idx[0])]] = advantage
    advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("remax")
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: returns = reverse cumsum of r·mask; adv = returns − b·mask with b the greedy rollout's score."""
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


#: Estimators that need the actor's Σπ² and old log-probs (``actor.calculate_sum_pi_squared=True``).
OTB_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")
