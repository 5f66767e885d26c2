"""How verl's trainer calls the advantage estimators (chapter §5.1; verl `ray_trainer.py::compute_advantage`, which
the V1 trainer imports): which keyword arguments each registered estimator gets, from DataProto's two halves.

No formula lives here: the estimators are in :mod:`ppolab.algos.advantages` (and ``_vectorized``, ``_otb``). The
trainer calls :func:`compute_advantage_from_data` with its whole batch; labs and tests call
:func:`compute_advantage` with tensors. Nothing is filtered: a keyword an estimator does not declare raises
TypeError, as in verl.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ppolab.algos.advantages import (OTB_ESTIMATORS, compute_gae_advantage_return, compute_grpo_outcome_advantage,
                                     get_adv_estimator_fn)


def estimator_kwargs(adv_estimator: str, batch: Mapping[str, torch.Tensor], non_tensor_batch: Mapping[str, Any],
                     config: Any = None) -> dict[str, Any]:
    """The keyword arguments verl's trainer passes a registry estimator (every one but gae and grpo; verl
    `ray_trainer.py::compute_advantage`, which the V1 trainer calls), built from DataProto's two halves: ``batch``
    (name → (bs, …) tensor) and ``non_tensor_batch`` (name → bs per-row values).

    Always token_level_rewards, response_mask and ``config``; ``index`` = non_tensor_batch["uid"] when present;
    ``reward_baselines`` when the batch has it; gdpo also gets ``non_tensor_batch`` and ``batch`` whole; the OTB
    estimators get ``sum_pi_squared``, ``old_log_probs`` and ``rollout_is_weights`` (None when absent). Nothing else
    and nothing filtered: an estimator whose signature lacks a keyword it is given raises TypeError, as in verl.
    """
    kwargs: dict[str, Any] = {"token_level_rewards": batch["token_level_rewards"],
                              "response_mask": batch["response_mask"], "config": config}
    if "uid" in non_tensor_batch:
        kwargs["index"] = non_tensor_batch["uid"]
    if "reward_baselines" in batch:
        kwargs["reward_baselines"] = batch["reward_baselines"]
    if adv_estimator == "gdpo":
        kwargs["non_tensor_batch"] = non_tensor_batch
        kwargs["batch"] = batch
    if adv_estimator in OTB_ESTIMATORS:
        if "sum_pi_squared" not in batch or "old_log_probs" not in batch:
            raise ValueError(f"adv_estimator={adv_estimator} needs sum_pi_squared and old_log_probs from the actor; "
                             "set actor_rollout_ref.actor.calculate_sum_pi_squared=true")
        kwargs.update(sum_pi_squared=batch["sum_pi_squared"], old_log_probs=batch["old_log_probs"],
                      rollout_is_weights=batch.get("rollout_is_weights"))
    return kwargs


def compute_advantage_from_data(
    batch: Mapping[str, torch.Tensor],
    non_tensor_batch: Mapping[str, Any],
    adv_estimator: str,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), dispatched exactly as verl's ``compute_advantage(data, adv_estimator, gamma, lam,
    norm_adv_by_std_in_grpo=…, config=…)`` (chapter §5.1; verl `ray_trainer.py`), with ``data`` as its two halves.

    * ``gae`` gets (token_level_rewards, values, response_mask, γ, λ);
    * ``grpo`` gets (token_level_rewards, response_mask, index = uid, norm_adv_by_std_in_grpo): ε stays 1e-6 and
      no config is passed;
    * every other estimator gets :func:`estimator_kwargs` — *not* ``norm_adv_by_std_in_grpo``, so grpo_vectorized
      and gdpo keep their default True (grpo_passk reads it from the config).
    """
    if adv_estimator == "gae":
        if "values" not in batch:
            raise ValueError("adv_estimator=gae needs critic values; enable the critic")
        return compute_gae_advantage_return(token_level_rewards=batch["token_level_rewards"], values=batch["values"],
                                            response_mask=batch["response_mask"], gamma=gamma, lam=lam)
    if adv_estimator == "grpo":
        return compute_grpo_outcome_advantage(token_level_rewards=batch["token_level_rewards"],
                                              response_mask=batch["response_mask"], index=non_tensor_batch["uid"],
                                              norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    fn = get_adv_estimator_fn(adv_estimator)
    return fn(**estimator_kwargs(adv_estimator, batch, non_tensor_batch, config))


def compute_advantage(
    adv_estimator: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    batch: Mapping[str, torch.Tensor] | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compute_advantage_from_data` with the tensors as arguments (for labs and tests): they are put into
    ``batch`` (index into ``non_tensor_batch["uid"]``), and the result is the one verl's trainer computes.

    ``non_tensor_batch`` / ``batch``: verl's per-row values (gdpo's reward components) and any further tensors
    (gdpo's ``prompts`` and ``attention_mask``). Without an ``attention_mask``, ``response_mask`` stands in for it
    (with an empty prompt): gdpo then puts each component score at the last response token, which is where the
    trainer's batch puts it too, and GRPO only reads its row sum.
    """
    tensors: dict[str, torch.Tensor] = dict(batch or {})
    tensors.update(token_level_rewards=token_level_rewards, response_mask=response_mask)
    for key, value in (("values", values), ("reward_baselines", reward_baselines), ("sum_pi_squared", sum_pi_squared),
                       ("old_log_probs", old_log_probs), ("rollout_is_weights", rollout_is_weights)):
        if value is not None:
            tensors[key] = value
    if "attention_mask" not in tensors:
        tensors["prompts"] = response_mask.new_zeros((response_mask.shape[0], 0), dtype=torch.long)
        tensors["attention_mask"] = response_mask
    rows: dict[str, Any] = dict(non_tensor_batch or {})
    if index is not None:
        rows["uid"] = index
    return compute_advantage_from_data(tensors, rows, adv_estimator, gamma=gamma, lam=lam,
                                       norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config)
