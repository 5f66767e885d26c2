"""Reference-KL estimators, the KL controllers and the reward-side penalty (chapter §7; verl `core_algos.kl_penalty`,
`core_algos` KL controllers).

Two paths use the same estimators on different pairs of policies (chapter §7, table):
* reward-side (``algorithm.use_kl_in_reward``): old_log_probs vs ref_log_prob, subtracted from the
  token rewards *before* the advantage — :func:`apply_kl_penalty`;
* loss-side (``actor.use_kl_loss``): the current log_prob vs ref_log_prob, added to the actor loss in
  every micro-batch — the trainer calls :func:`kl_penalty` then ``agg_loss``.
"""
from __future__ import annotations

import torch

from ppolab.algos.masked import masked_mean
from ppolab.vocab import KL_ESTIMATORS, KL_PENALTY_TYPES  # noqa: F401 (re-exported)

#: k3 clamps its inner log-ratio to ±20 and its output to ±10 (verl `core_algos.kl_penalty`).
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """The per-token estimator value with d = logprob − ref_logprob (chapter §7.3).

    ===================  ==================================================
    kl / k1              d
    abs                  |d|
    mse / k2             ½·d²
    low_var_kl / k3      clip(e^{−d̃} + d̃ − 1, −10, 10), d̃ = clip(d, −20, 20)
    ===================  ==================================================
    Shapes: (bs, T) → (bs, T); no masking here, callers mask.
    """
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-K3_LOG_RATIO_CLAMP, max=K3_LOG_RATIO_CLAMP)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-K3_VALUE_CLAMP, max=K3_VALUE_CLAMP)
    if kl_penalty == "full":
        raise NotImplementedError(
            "kl_penalty='full' needs the whole vocabulary distribution of both policies, but the trainer only "
            "keeps the log-prob of the sampled token; verl does not implement it either. Use k1, k2 or k3."
        )
    raise NotImplementedError(f"kl_penalty={kl_penalty!r} is unknown; choose one of {', '.join(KL_PENALTY_TYPES)}")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate; a trailing '+' makes it straight-through (chapter §7.3; verl `core_algos.kl_penalty`).

    Without '+': the forward value of :func:`kl_penalty_forward`. With '+' (``k3+``, ``k1+`` …): the
    value of the estimator but the gradient of k2 = ½(logprob − ref)², i.e. ∂/∂logprob = logprob − ref —
    k1 and k3 are unbiased in value but not in gradient; k2's gradient is the right one.
    """
    if not kl_penalty.endswith("+"):
        return kl_penalty_forward(logprob, ref_logprob, kl_penalty)
    forward_score = kl_penalty_forward(logprob, ref_logprob, kl_penalty[:-1])
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


kl_penalty_fn = kl_penalty  # apply_kl_penalty's parameter is named kl_penalty (verl's name) and shadows it


class FixedKLController:
    """β stays at ``kl_coef``; ``update`` does nothing (``algorithm.kl_ctrl.type=fixed``)."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op, kept so both controllers share one interface."""


class AdaptiveKLController:
    """β tracks a target KL (chapter §7.1): e = clip(KL/target − 1, ±0.2); β ← β·(1 + e·n_steps/horizon)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """``n_steps`` is the number of sequences in the batch, not optimizer steps (chapter §7.1)."""
        proportional_error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


def get_kl_controller(kl_ctrl) -> FixedKLController | AdaptiveKLController:
    """Build the controller named by ``kl_ctrl.type`` (``fixed`` or ``adaptive``) from an algorithm.kl_ctrl config."""
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_coef=kl_ctrl.kl_coef)
    if kl_ctrl.type == "adaptive":
        assert kl_ctrl.horizon > 0, f"horizon must be larger than 0. Got {kl_ctrl.horizon}"
        return AdaptiveKLController(init_kl_coef=kl_ctrl.kl_coef, target_kl=kl_ctrl.target_kl, horizon=kl_ctrl.horizon)
    raise NotImplementedError(f"algorithm.kl_ctrl.type={kl_ctrl.type!r} is unknown; choose fixed or adaptive")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Reward-side KL (chapter §7.1): r_t = score_t − β·KL̂_t, then update the controller.

    Shapes: all (bs, T). kld = kl_penalty(old, ref)·mask — it uses the *old* log-probs, not the
    rollout ones. β is read before the update. current_kl is the batch mean of per-sequence token
    means (padding rows count as 0, which biases it down, verl `padding_utils.py`). Returns
    (token_level_rewards, {actor/reward_kl_penalty, actor/reward_kl_penalty_coeff}).
    """
    kld = kl_penalty_fn(old_log_probs, ref_log_prob, kl_penalty) * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = torch.mean(masked_mean(kld, response_mask, axis=-1)).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}



# ---------------------------------------------------------------------------------- over full distributions
def full_log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(z / T) over the vocabulary (the last dimension), float64: (…, V) → (…, V)."""
    return torch.log_softmax(logits.double() / temperature, dim=-1)


def exact_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p‖q) = Σ_a p(a)·(log p(a) − log q(a)) over the last dimension, from full log-probabilities (…, V) → (…).
    What every estimator of chapter §7.3 estimates from one sampled token."""
    return (logp.exp() * (logp - logq)).sum(-1)


def estimator_moments(lp_theta: torch.Tensor, lp_ref: torch.Tensor, lp_sample: torch.Tensor,
                      name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact mean and variance of ``kl_penalty(log π_θ(a), log π_ref(a), name)`` for a ∼ q, at every position.

    All three arguments are full log-distributions (…, V); q = exp(``lp_sample``). Nothing is sampled: the mean
    is Σ_a q(a)·k(a) and the variance Σ_a q(a)·(k(a) − mean)², so the numbers are the estimator's expectation
    and per-token variance, clamps included (chapter §7.3). Returns two tensors of shape (…).
    """
    k = kl_penalty(lp_theta, lp_ref, name)
    q = lp_sample.exp()
    mean = (q * k).sum(-1)
    return mean, (q * (k - mean.unsqueeze(-1)).square()).sum(-1)


def expected_estimator_gradient(theta_logits: torch.Tensor, lp_ref: torch.Tensor, name: str) -> torch.Tensor:
    """∇ of E_{a∼π_θ}[kl_penalty(log π_θ(a), log π_ref(a), name)] w.r.t. π_θ's (temperature-scaled) logits,
    with the sampled tokens held fixed — what the trainer's loss gradient is on average: samples are data, so
    no score-function term. ``theta_logits`` (…, V) are the logits π_θ = softmax(theta_logits); returns (…, V)."""
    u = theta_logits.detach().double().clone().requires_grad_(True)
    lp = torch.log_softmax(u, dim=-1)
    q = lp.detach().exp()
    (q * kl_penalty(lp, lp_ref, name)).sum().backward()
    return u.grad


def kl_gradient(theta_logits: torch.Tensor, lp_ref: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """∇ of the exact KL(π_θ‖π_ref) (or, with ``reverse``, KL(π_ref‖π_θ)) w.r.t. π_θ's logits, summed over
    positions; (…, V)."""
    u = theta_logits.detach().double().clone().requires_grad_(True)
    lp = torch.log_softmax(u, dim=-1)
    (exact_kl(lp_ref, lp) if reverse else exact_kl(lp, lp_ref)).sum().backward()
    return u.grad


# ---------------------------------------------------------------------------------- names
#: verl 0.9.1's other name for each estimator (``core_algos.kl_penalty_forward`` accepts both); ppolab writes k1/k2/k3.
KL_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}


def canonical_kl_name(name: str) -> str | None:
    """ppolab's name of the KL estimator ``name``, or None when ``name`` names no estimator.

    verl's aliases map to ppolab's names (``kl`` → ``k1``, ``mse`` → ``k2``, ``low_var_kl`` → ``k3``), a trailing
    ``+`` (the straight-through form) is kept (``low_var_kl+`` → ``k3+``), ``abs`` and ``full`` keep theirs; case and
    surrounding blanks are ignored. ``full`` is a name verl knows although it raises (see :func:`kl_penalty_forward`).
    """
    if not isinstance(name, str):
        return None
    base = name.strip().lower()
    plus = base.endswith("+")
    base = base[:-1] if plus else base
    if base not in KL_ESTIMATORS and base != "full":
        return None
    return KL_ALIASES.get(base, base) + ("+" if plus else "")
