"""The actor's config (verl's ``actor_rollout_ref.actor``): the one config object the policy losses read.

Field names and defaults follow verl's resolved ``ppo_trainer.yaml`` (verl `ppo_trainer.yaml`). The formula core
reads only the clip ratios, ``clip_ratio_c``, ``tau_pos/tau_neg``, ``loss_agg_mode``, the mode-specific knobs of
``policy_loss`` and ``global_batch_info``; the trainer reads the rest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

#: The five loss aggregation modes verl's ActorConfig accepts (chapter §10).
LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def check_loss_agg_mode(mode: str, field_name: str = "loss_agg_mode") -> None:
    """Raise ``ValueError`` naming the field and the five valid modes if ``mode`` is not one of them."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"{field_name}={mode!r} is not valid; choose one of {', '.join(LOSS_AGG_MODES)}")


@dataclass
class OptimConfig:
    """AdamW settings (verl ``actor.optim`` / ``critic.optim``)."""

    lr: float = 1e-6
    """Learning rate (constant schedule after warm-up)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    clip_grad: float = 1.0
    """Max global grad norm per optimizer step; a non-finite norm skips the step."""
    lr_warmup_steps: int = 0
    """Linear warm-up length in training steps (the scheduler steps once per training step)."""


#: ``policy_loss.rollout_correction.loss_type`` values of ``loss_mode=bypass_mode`` (verl
#: `core_algos.compute_policy_loss_bypass_mode`).
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


@dataclass
class LossRolloutCorrectionConfig:
    """verl's ``actor.policy_loss.rollout_correction`` (a ``RolloutCorrectionConfig``), read only by
    ``loss_mode=bypass_mode``. Same keys as ``algorithm.rollout_correction``, but verl's *dataclass* defaults
    apply here (actor.yaml sets none), so ``rollout_is`` defaults to ``"sequence"``."""

    rollout_is: Optional[str] = "sequence"
    """IS weights π_θ/π_rollout computed inside bypass_mode: None (off), token or sequence."""
    rollout_is_threshold: Any = 2.0
    """TIS upper bound (a number) or IcePop ``"lower_upper"`` (a string)."""
    rollout_is_batch_normalize: bool = False
    """Divide the IS weights by their batch mean (token or sequence level) when it is > 1e-8."""
    rollout_rs: Optional[str] = None
    """Rejection sampling options (comma list, see algorithm.rollout_correction.rollout_rs); None = off."""
    rollout_rs_threshold: Any = None
    """Thresholds of rollout_rs; required when rollout_rs is set."""
    bypass_mode: bool = False
    """Carried for parity with verl's class; the loss does not read it."""
    loss_type: str = "ppo_clip"
    """ppo_clip: vanilla PPO on the rejection-modified mask, no IS weights; reinforce: −A·log π·w."""


@dataclass
class PolicyLossConfig:
    """Which policy loss the actor uses and its mode-specific knobs (verl ``actor.policy_loss``)."""

    loss_mode: str = "vanilla"
    """Registry name of the policy loss (verl's ``policy_loss.loss_mode``): vanilla, dppo_tv, dppo_kl, gspo, sapo,
    gpg, clip_cov, kl_cov, geo_mean, dro, cispo, bypass_mode."""
    clip_cov_ratio: float = 0.0002
    """clip_cov: share of valid tokens (at least one) whose loss is zeroed."""
    clip_cov_lb: float = 1.0
    """clip_cov: lower bound (exclusive) of the covariance of a token that may be zeroed."""
    clip_cov_ub: float = 5.0
    """clip_cov: upper bound (exclusive) of that covariance."""
    kl_cov_ratio: float = 0.0002
    """kl_cov: share of valid tokens (at least one), the top by covariance, that get the |log-ratio| penalty."""
    ppo_kl_coef: float = 0.1
    """kl_cov: weight of the |lp − old| penalty on the selected tokens."""
    dro_beta: Optional[float] = None
    """dro: β of the quadratic log-ratio penalty; required (> 0) when loss_mode=dro."""
    rollout_correction: LossRolloutCorrectionConfig = field(default_factory=LossRolloutCorrectionConfig)
    """bypass_mode: IS weights, rejection sampling and loss_type computed inside the loss."""

    def __post_init__(self) -> None:
        if isinstance(self.rollout_correction, dict):
            self.rollout_correction = LossRolloutCorrectionConfig(**self.rollout_correction)

    def get(self, key: str, default: Any = None) -> Any:
        """Dict-style read, as verl's config objects allow."""
        return getattr(self, key, default)


@dataclass
class ActorConfig:
    """verl's ``actor_rollout_ref.actor``: clipping, loss assembly, batching and optimiser of the actor."""

    clip_ratio: float = 0.2
    """ε, the symmetric PPO clip range (fallback for the two below)."""
    clip_ratio_low: Optional[float] = None
    """ε_low: ratio lower bound is 1 − ε_low; None means clip_ratio."""
    clip_ratio_high: Optional[float] = None
    """ε_high: ratio upper bound is 1 + ε_high; None means clip_ratio."""
    clip_ratio_c: float = 3.0
    """Dual-clip constant C > 1 bounding the loss of negative-advantage tokens at −A·C."""
    tau_pos: float = 1.0
    """SAPO gate temperature for A > 0."""
    tau_neg: float = 1.05
    """SAPO gate temperature for A ≤ 0."""
    entropy_coeff: float = 0.0
    """c_H: weight of the entropy bonus subtracted from the loss (chapter §6)."""
    calculate_entropy: bool = False
    """Compute entropy in the update forward even when entropy_coeff is 0 (for the metric)."""
    calculate_sum_pi_squared: bool = False
    """Compute Σ_v π(v)² per position in the old-log-prob forward (needed by the optimal-token-baseline
    estimators)."""
    use_kl_loss: bool = False
    """Loss-side KL to the reference policy (chapter §7.2)."""
    kl_loss_coef: float = 0.001
    """c_KL: weight of the loss-side KL term."""
    kl_loss_type: str = "low_var_kl"
    """Estimator for the loss-side KL: kl/k1, abs, mse/k2, low_var_kl/k3, with optional trailing '+'."""
    loss_agg_mode: str = "token-mean"
    """How token losses become one scalar (chapter §10)."""
    loss_scale_factor: Optional[float] = None
    """C_norm of seq-mean-token-sum-norm; None falls back to the padded width (breaks micro-batch invariance)."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Policy-loss selection."""
    ppo_mini_batch_size: int = 256
    """Mini-batch size in prompts; the trainer multiplies it by rollout.n (chapter §11.2)."""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """Trajectories per micro-batch per rank; required unless use_dynamic_bsz."""
    use_dynamic_bsz: bool = False
    """Pack micro-batches by token budget instead of a fixed row count (chapter §11.5)."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget per micro-batch per rank when use_dynamic_bsz."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per training step."""
    shuffle: bool = False
    """Shuffle rows before cutting mini-batches (same permutation every step, as verl)."""
    data_loader_seed: int = 42
    """Seed of the mini-batch shuffler (plus the DP rank)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser of the actor."""
    global_batch_info: dict[str, Any] = field(default_factory=dict)
    """Filled per micro-batch by the trainer: dp_size, batch_num_tokens, global_batch_size, loss_scale_factor."""

    def __post_init__(self) -> None:
        check_loss_agg_mode(self.loss_agg_mode, "actor.loss_agg_mode")
        if isinstance(self.policy_loss, dict):
            self.policy_loss = PolicyLossConfig(**self.policy_loss)
        if isinstance(self.optim, dict):
            self.optim = OptimConfig(**self.optim)

    def get(self, key: str, default: Any = None) -> Any:
        """Dict-style read, as verl's config objects allow (``config.get("clip_ratio_c", 3.0)``)."""
        return getattr(self, key, default)
