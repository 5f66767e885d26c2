"""ppolab.algos — the formulas of PPO/GRPO post-training as small pure tensor functions.

Imports only torch (no transformers), so a lab imports it instantly. The trainer, the lab widgets and
the tests all call these same functions; names and signatures follow verl's ``core_algos.py``.
"""
from ppolab.algos.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    GRPO_EPS,
    compute_advantage,
    compute_gae_advantage_return,
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
)
from ppolab.algos.actor_loss import SUM_METRICS, ppo_loss, value_loss
from ppolab.algos.aggregation import agg_loss
from ppolab.algos.correction import ROLLOUT_IS_LEVELS, rollout_corr_metrics, rollout_is_weights, rollout_probs_diff
from ppolab.algos.kl import (
    KL_ESTIMATORS,
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)
from ppolab.algos.logprob import entropy_from_logits, logprobs_from_logits, scale_logits
from ppolab.algos.masked import MASKED_EPS, masked_mean, masked_sum, masked_var, masked_whiten
from ppolab.algos.policy_loss import (
    POLICY_LOSS_REGISTRY,
    compute_policy_loss_cispo,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    ppo_clip_terms,
    register_policy_loss,
)
from ppolab.algos.value_loss import clip_by_value, compute_value_loss, explained_variance, value_clip_terms
from ppolab.config.actor import LOSS_AGG_MODES

import types as _types

__all__ = [n for n, v in dict(globals()).items() if not n.startswith("_") and not isinstance(v, _types.ModuleType)]
