"""The names verl's config accepts, in one torch-free place: loss modes, estimators, aggregation modes, KL
estimators and rollout-correction options — and the one rule that says which clip ratio is the window
(:func:`clip_bounds`), which the config checks, the doctor and the losses all read.

Config validation (no torch) and ``ppolab.algos`` (the registries) both import these tuples, so neither imports
the other and no second copy of a name list exists. ``tests/test_algos_verl_modes.py`` checks the registries hold
exactly these names (verl 0.9.1 ``core_algos.py``).
"""
from __future__ import annotations

#: verl 0.9.1's twelve ``actor.policy_loss.loss_mode`` names (``POLICY_LOSS_REGISTRY``, chapter §5.2).
POLICY_LOSS_MODES = ("vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro",
                     "cispo", "bypass_mode")

#: verl 0.9.1's fourteen ``algorithm.adv_estimator`` names (``ADV_ESTIMATOR_REGISTRY``, chapter §6).
ADV_ESTIMATORS = ("gae", "grpo", "grpo_vectorized", "gdpo", "grpo_passk", "reinforce_plus_plus_baseline", "rloo",
                  "opo", "reinforce_plus_plus", "remax", "gpg", "rloo_vectorized", "optimal_token_baseline",
                  "tir_optimal_token_baseline")

#: Estimators that compare the n responses of one prompt: they need ``rollout.n`` > 1.
GROUP_ADV_ESTIMATORS = ("grpo", "grpo_vectorized", "gdpo", "rloo", "rloo_vectorized", "grpo_passk",
                        "reinforce_plus_plus_baseline", "opo", "gpg", "optimal_token_baseline",
                        "tir_optimal_token_baseline")

#: The five loss aggregation modes verl's ActorConfig accepts (chapter §10).
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

#: KL estimators of ``kl_penalty`` (verl ``core_algos.kl_penalty``); each also with a straight-through "+" variant.
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_PENALTY_TYPES = KL_ESTIMATORS + tuple(name + "+" for name in KL_ESTIMATORS)

#: ``algorithm.rollout_correction.rollout_is`` levels and ``rollout_rs`` options (verl ``rollout_corr_helper.py``).
ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                      "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")

#: ``policy_loss.rollout_correction.loss_type`` of ``loss_mode=bypass_mode``.
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


def check_loss_agg_mode(mode: str, field_name: str = "loss_agg_mode") -> None:
    """Raise ``ValueError`` naming the field and the five valid modes if ``mode`` is not one of them."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"{field_name}={mode!r} is not valid; choose one of {', '.join(LOSS_AGG_MODES)}")


def clip_bounds(config) -> tuple[float, float]:
    """(ε_low, ε_high) the clip window is: ``clip_ratio_low`` and ``clip_ratio_high``, each falling back to
    ``clip_ratio`` only when None (chapter §4.4; verl `core_algos.py::compute_policy_loss_vanilla`). verl 0.9.1's
    config sets both to 0.2, so a ``clip_ratio`` set alone is not the window: every reader of ε reads it here."""
    eps = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else eps
    high = config.clip_ratio_high if config.clip_ratio_high is not None else eps
    return low, high


#: verl 0.9.1's ``actor.clip_ratio`` (and ``clip_ratio_low`` / ``clip_ratio_high``) default.
DEFAULT_CLIP_RATIO = 0.2


def clip_ratio_unread(config) -> bool:
    """Whether ``clip_ratio`` was moved from verl's 0.2 while the window (:func:`clip_bounds`) does not read it — a
    setting that changes nothing (what ``ppolab doctor`` and the config notices say in one line)."""
    return config.clip_ratio != DEFAULT_CLIP_RATIO and config.clip_ratio not in clip_bounds(config)
