"""Chapter §5's per-token gradient weights of every registered policy loss, by autograd."""
from __future__ import annotations

import copy
import math
from typing import Any, Sequence

import torch

from ppolab.algos import POLICY_LOSS_REGISTRY, agg_loss
from ppolab.algos.masked import row_token_mean
from ppolab.config.actor import ActorConfig


#: π_old of the grid tokens. Only dppo_tv / dppo_kl read probabilities (their cut-off in r is ≈ 1 ± δ/π_old); every
#: other mode gives the same weight for any π_old. 0.4 keeps π_θ = r·π_old ≤ 1 on the whole grid.
DEFAULT_OLD_PROB = 0.4


#: ``policy_loss.dro_beta`` used when the run sets none (verl's default None makes dro raise).
DRO_BETA_SHOWN = 0.1


#: The branches a token can be on, for the modes whose choice is a batch property; first = the default branch.
#: Each is a change of ``policy_loss`` (``rollout_correction`` for bypass_mode) that puts every grid token there.
BRANCHES: dict[str, dict[str, dict[str, Any]]] = {
    # empty covariance window (strict bounds) → no candidate; open window with ratio 1 → every unclipped token drawn
    "clip_cov": {"not drawn": dict(clip_cov_lb=0.0, clip_cov_ub=0.0),
                 "drawn (loss zeroed)": dict(clip_cov_lb=-math.inf, clip_cov_ub=math.inf, clip_cov_ratio=1.0)},
    # a zero coefficient makes the selection irrelevant; ratio 1 selects every token
    "kl_cov": {"not selected": dict(ppo_kl_coef=0.0), "selected (|log r| penalty)": dict(kl_cov_ratio=1.0)},
    "bypass_mode": {"loss_type=ppo_clip": dict(loss_type="ppo_clip"),
                    "loss_type=reinforce": dict(loss_type="reinforce")},
}


def mode_config(base: ActorConfig, mode: str, branch: str | None = None) -> ActorConfig:
    """A copy of ``base`` with ``policy_loss.loss_mode = mode``, dro's β filled in (:data:`DRO_BETA_SHOWN`) when
    None, and the overrides of ``BRANCHES[mode][branch]`` applied (no branch: the config as it is)."""
    if mode not in POLICY_LOSS_REGISTRY:
        raise ValueError(f"loss_mode={mode!r} is not registered; choose one of {', '.join(POLICY_LOSS_REGISTRY)}")
    cfg = copy.deepcopy(base)
    cfg.policy_loss.loss_mode = mode
    if mode == "dro" and cfg.policy_loss.dro_beta is None:
        cfg.policy_loss.dro_beta = DRO_BETA_SHOWN
    if branch is not None:
        if branch not in BRANCHES.get(mode, {}):
            raise ValueError(f"mode {mode!r} has no branch {branch!r}; branches: {list(BRANCHES.get(mode, {}))}")
        target = cfg.policy_loss.rollout_correction if mode == "bypass_mode" else cfg.policy_loss
        for key, value in BRANCHES[mode][branch].items():
            setattr(target, key, value)
    return cfg


def token_share(mode: str, response_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """s_t = ∂L/∂ℓ_t: the weight a token's loss ℓ_t gets in the mode's aggregation, by autograd. Shape (bs, T).

    ``sapo`` always aggregates with seq-mean-token-mean and ``geo_mean`` takes a plain mean over the rows of
    per-row token means (its geometric mean is a mean in the exponent); every other mode uses ``loss_agg_mode``.
    """
    x = torch.zeros_like(response_mask, dtype=torch.float64, requires_grad=True)
    m = response_mask.double()
    if mode == "geo_mean":
        total = torch.mean(row_token_mean(x, m))
    else:
        total = agg_loss(x, m, "seq-mean-token-mean" if mode == "sapo" else loss_agg_mode)
    (share,) = torch.autograd.grad(total, x)
    return share


def token_weights(mode: str, cfg: ActorConfig, old: torch.Tensor, lp: torch.Tensor, adv: torch.Tensor,
             mask: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """w = −(∂pg_loss/∂log_prob)/s by autograd through the registered loss; 0 where the mask is 0."""
    lp = lp.detach().double().requires_grad_(True)
    extra = {"generator": generator} if mode == "clip_cov" else {}
    loss, _ = POLICY_LOSS_REGISTRY[mode](old.double(), lp, adv.double(), mask.double(), cfg.loss_agg_mode, cfg,
                                         **extra)
    (grad,) = torch.autograd.grad(loss, lp)
    share = token_share(mode, mask, cfg.loss_agg_mode)
    # + 0.0 turns autograd's −0.0 (a zero gradient times −1) into 0.0
    return torch.where(share > 0, -grad / share.clamp(min=1e-300), torch.zeros_like(grad)) + 0.0


def gradient_weights(
    mode: str,
    ratio: torch.Tensor | Sequence[float] | float,
    advantage: torch.Tensor | float = 1.0,
    config: ActorConfig | None = None,
    *,
    old_prob: torch.Tensor | float = DEFAULT_OLD_PROB,
    branch: str | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """Per-token gradient weight w = −∂L/∂log π_θ ÷ s (s = aggregation share) of loss ``mode`` at each ratio.

    Shapes: ``ratio`` (n,) (or a number) → (n,) float64. ``advantage`` and ``old_prob`` (π_old) are numbers or (n,).
    The batch is n one-token sequences (old_log_prob = log π_old, log_prob = log π_old + log r, mask 1), so
    sequence-level modes see a one-token sequence and no token influences another — except through the covariance
    of clip_cov / kl_cov, which is why those take a ``branch`` (:data:`BRANCHES`). Positive w raises log π_θ.
    ``config`` defaults to a bare :class:`ActorConfig` (ε = 0.2, c = 3); ``seed`` seeds clip_cov's draw.
    Raises ``ValueError`` for a ratio ≤ 0 or π_θ = r·π_old > 1 (not a probability).
    """
    r = torch.as_tensor(ratio, dtype=torch.float64).reshape(-1)
    n = r.numel()
    a = torch.as_tensor(advantage, dtype=torch.float64).expand(n)
    p_old = torch.as_tensor(old_prob, dtype=torch.float64).expand(n)
    if (r <= 0).any() or (p_old <= 0).any() or (r * p_old > 1 + 1e-12).any():
        raise ValueError("need ratio > 0, 0 < old_prob and ratio·old_prob ≤ 1 (π_θ = r·π_old is a probability)")
    cfg = mode_config(config if config is not None else ActorConfig(), mode, branch)
    old = torch.log(p_old).unsqueeze(-1)
    lp = old + torch.log(r).unsqueeze(-1)
    gen = torch.Generator().manual_seed(seed)
    return token_weights(mode, cfg, old, lp, a.unsqueeze(-1).clone(), torch.ones_like(lp), gen).squeeze(-1)
