"""ppolab.algos — the formulas of PPO/GRPO post-training as small pure tensor functions.

Imports only torch (no transformers), so a lab imports it instantly. The trainer, the lab widgets and
the tests all call these same functions; names and signatures follow verl's ``core_algos.py``.
"""
from ppolab.algos.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    GRPO_EPS,
    OTB_ESTIMATORS,
    compute_gae_advantage_return,
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
    register_adv_est,
    scores_at_last_valid_response_token,
)
from ppolab.algos.advantages_dispatch import compute_advantage, compute_advantage_from_data, estimator_kwargs
from ppolab.algos.advantages_otb import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from ppolab.algos.advantages_vectorized import (
    compute_grpo_vectorized_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    group_mean_std,
)
from ppolab.algos.losses import LOSS_TERMS, SUM_METRICS, ppo_loss, ppo_loss_terms, value_loss
from ppolab.algos.aggregation import SCALED_MODES, GlobalBatchInfo, agg_loss, batch_info_kwargs
from ppolab.algos.correction import (
    ROLLOUT_IS_LEVELS,
    ROLLOUT_RS_OPTIONS,
    parse_is_threshold,
    parse_rollout_rs,
    raw_is_weights,
    rollout_is_weights,
    rollout_probs_diff,
    rollout_rejection_mask,
    truncate_is_weights,
)
from ppolab.algos.correction_metrics import (
    batch_normalize_is_weights,
    offpolicy_metrics,
    rollout_correction_and_rejection_mask,
    rollout_is_weight_metrics,
)
from ppolab.algos.kl import (
    KL_ESTIMATORS,
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    estimator_moments,
    exact_kl,
    expected_estimator_gradient,
    full_log_probs,
    get_kl_controller,
    kl_gradient,
    kl_penalty,
    kl_penalty_forward,
)
from ppolab.algos.logprob import (
    CHUNK_LOGITS_THRESHOLD,
    CHUNK_VOCAB,
    calculate_sum_pi_squared_from_logits,
    chunked_logprobs_entropy,
    entropy_from_logits,
    logprobs_from_logits,
    scale_logits,
    top_k_top_p_filter,
    use_chunked_logits,
)
from ppolab.algos.masked import MASKED_EPS, masked_mean, masked_sum, masked_var, masked_whiten, row_token_mean
from ppolab.algos.policy_loss import (
    POLICY_LOSS_REGISTRY,
    compute_policy_loss_cispo,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    ppo_clip_terms,
    register_policy_loss,
)
from ppolab.algos.policy_loss_bypass import compute_policy_loss_bypass_mode, compute_policy_loss_reinforce
from ppolab.algos.policy_loss_cov import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from ppolab.algos.policy_loss_trust import (
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
)
from ppolab.algos.value import clip_by_value, compute_value_loss, explained_variance, value_clip_terms
from ppolab.vocab import LOSS_AGG_MODES

import types as _types

__all__ = [n for n, v in dict(globals()).items() if not n.startswith("_") and not isinstance(v, _types.ModuleType)]
