"""The actor's config (verl's ``actor_rollout_ref.actor``): the one config object the policy losses read.

Field names and defaults follow verl's resolved ``ppo_trainer.yaml`` (verl `ppo_trainer.yaml`). The formula core
reads only the clip ratios, ``clip_ratio_c``, ``tau_pos/tau_neg``, ``loss_agg_mode`` and the mode-specific knobs
of ``policy_loss``; the workers and the trainer read the rest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ppolab.vocab import BYPASS_LOSS_TYPES, LOSS_AGG_MODES, check_loss_agg_mode  # noqa: F401 (re-exported)


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
@dataclass
class RolloutCorrectionConfig:
    """verl's ``RolloutCorrectionConfig`` (chapter §2–§3; verl `trainer/config/algorithm.py`), one class in two places:

    * ``algorithm.rollout_correction`` — the rollout/old gap at stage 7 (IS weights old/rollout, rejection), or
      ``bypass_mode`` (old := rollout). verl's ppo_trainer.yaml sets ``rollout_is: null`` there.
    * ``actor_rollout_ref.actor.policy_loss.rollout_correction`` — read only by ``loss_mode=bypass_mode``, which
      computes the correction against the *current* log-probs. verl's dataclass defaults apply (actor.yaml sets
      none), so ``rollout_is`` is ``"sequence"`` there.

    ``loss_type`` acts only under policy_loss, ``bypass_mode`` only under algorithm: setting either in the other
    place is refused (verl V1 reads neither there)."""

    rollout_is: Optional[str] = "sequence"
    """IS weights: None (off), token or sequence (π_old/π_rollout at stage 7; π_θ/π_rollout in bypass_mode)."""
    rollout_is_threshold: Any = 2.0
    """TIS upper bound (a number: w = min(w, threshold)) or IcePop ``"lower_upper"`` (a string)."""
    rollout_is_batch_normalize: bool = False
    """Divide the IS weights by their batch mean (token or sequence level) when it is > 1e-8."""
    rollout_rs: Optional[str] = None
    """Rejection sampling: None (off) or a comma list of token_k1/k2/k3, seq_sum_k1/k2/k3, seq_mean_k1/k2/k3,
    seq_max_k2/k3; a token or row failing any option is zeroed in response_mask (loss_mask is kept)."""
    rollout_rs_threshold: Any = None
    """Thresholds of rollout_rs: one shared, or one per option comma separated; *_k1 take "lower_upper" ratio
    bounds or u (= [1/u, u]), the others an upper bound. Required when rollout_rs is set."""
    bypass_mode: bool = False
    """(algorithm only) Use the rollout log-probs as old log-probs and skip the old-log-prob forward."""
    loss_type: str = "ppo_clip"
    """(policy_loss only) ppo_clip: vanilla PPO on the rejection-modified mask, no IS weights; reinforce:
    −A·log π·w."""


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
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """bypass_mode: IS weights, rejection sampling and loss_type computed inside the loss."""

    def __post_init__(self) -> None:
        if isinstance(self.rollout_correction, dict):
            self.rollout_correction = RolloutCorrectionConfig(**self.rollout_correction)

    def get(self, key: str, default: Any = None) -> Any:
        """Dict-style read, as verl's config objects allow."""
        return getattr(self, key, default)


@dataclass
class ActorConfig:
    """verl's ``actor_rollout_ref.actor``: clipping, loss assembly, batching and optimiser of the actor."""

    clip_ratio: float = 0.2
    """ε, the symmetric PPO clip range — only where the two below are null: verl 0.9.1 sets both to 0.2 by default,
    so ``clip_ratio`` alone moves nothing (``ppolab.algos.policy_loss.clip_bounds``; lab 04)."""
    clip_ratio_low: Optional[float] = 0.2
    """ε_low: ratio lower bound is 1 − ε_low (verl's default 0.2); null means clip_ratio."""
    clip_ratio_high: Optional[float] = 0.2
    """ε_high: ratio upper bound is 1 + ε_high (verl's default 0.2); null means clip_ratio."""
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
    use_remove_padding: Optional[bool] = None
    """The actor's forwards on packed rows; None = ``actor_rollout_ref.model.use_remove_padding`` (verl's
    ``actor/dp_actor.yaml`` interpolates it from there the same way)."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per training step."""
    shuffle: bool = False
    """Shuffle rows before cutting mini-batches (same permutation every step, as verl)."""
    data_loader_seed: int = 42
    """Seed of the mini-batch shuffler (plus the DP rank)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser of the actor."""
    global_batch_info: dict[str, Any] = field(default_factory=dict)
    """verl's run-time channel for the global mini-batch counts (its engine writes them here per mini-batch). ppolab
    passes them to the losses as an argument (``ppolab.algos.GlobalBatchInfo``) and never writes this dict; a loss
    reads it only when called without that argument (a config built by hand, the parity tests). Not a config-file
    key: a non-empty value in a config is refused."""

    def __post_init__(self) -> None:
        check_loss_agg_mode(self.loss_agg_mode, "actor.loss_agg_mode")
        if isinstance(self.policy_loss, dict):
            self.policy_loss = PolicyLossConfig(**self.policy_loss)
        if isinstance(self.optim, dict):
            self.optim = OptimConfig(**self.optim)

    def get(self, key: str, default: Any = None) -> Any:
        """Dict-style read, as verl's config objects allow (``config.get("clip_ratio_c", 3.0)``)."""
        return getattr(self, key, default)
