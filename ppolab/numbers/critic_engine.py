"""The critic's micro-batches as verl V1 wires them, and the cases labs 09–11 ask about.

verl V1 `trainer_base.py` hands the critic engine one key, ``critic.ppo_infer_max_token_len_per_gpu``, for both its
value forward (stage 6) and its update (stage 8); the top-level ``critic.use_dynamic_bsz``,
``critic.ppo_max_token_len_per_gpu``, ``critic.ppo_micro_batch_size_per_gpu`` and
``critic.ppo_infer_micro_batch_size_per_gpu`` never reach it (chapter §8 last paragraph, §11.6, §14.1). The functions
here read the critic's recorded update plan, or ask ppolab's one planner (``ppolab.update_plan``) to cut the recorded
rows under the run's config with overrides — a what-if.
"""
from __future__ import annotations

import copy
from typing import Any, Iterable

import torch

from ppolab.numbers.needs import RunLacks, require
from ppolab.run.reader import Run, resolve_run
from ppolab.update_plan import InferBatching, UpdatePlan, recorded_plan, train_batching

#: The default shipped run of these helpers: PPO + GAE with rejection sampling and padding rows.
RUN = "ppo_fire_tiny"


def config_with(run: Run | str | None = None, overrides: Iterable[str] = ()) -> Any:
    """The run's :class:`~ppolab.config.PPOConfig` with verl-style overrides (``"key=value"``; a leading ``+``, as
    verl's Hydra command line needs for a key its YAML does not declare, is accepted), parsed as ``ppolab train``
    parses them (:func:`ppolab.config.loader.override_tree`: a mistyped key is named with its nearest). Not
    validated."""
    from ppolab.config import from_dict
    from ppolab.config.loader import merge_tree, override_tree

    return from_dict(merge_tree(copy.deepcopy(resolve_run(run, RUN).config), override_tree(overrides)))


def critic_batching(cfg: Any) -> Any:
    """How the critic engine of config ``cfg`` cuts its rows (an :class:`~ppolab.update_plan.InferBatching`):
    :func:`ppolab.update_plan.train_batching` of ``cfg.critic``, the call the critic worker makes."""
    return train_batching(cfg.critic, "critic")


def critic_plan(run: Run | str | None = None, step: int | None = None, overrides: Iterable[str] = (),
                max_token_len: int | None = None) -> UpdatePlan:
    """The critic's update plan at recorded step ``step`` (default the first): the recorded one, or — given
    ``overrides`` or a ``max_token_len`` — the planner's what-if on the recorded rows."""
    r = resolve_run(run, RUN)
    rec = r.step(r.steps[0] if step is None else step)
    cfg = r.ppo_config()
    overrides = list(overrides)
    if not overrides and max_token_len is None:
        return rec.plan("critic")
    if overrides:
        cfg = config_with(r, overrides)
    batching = critic_batching(cfg)
    if max_token_len is not None:
        batching = InferBatching(None, int(max_token_len))
    return recorded_plan(rec, cfg, "critic", batching=batching, config=cfg.critic)


def rank_rows(run: Run | str | None = None, update: int = 0, rank: int = 0, step: int | None = None) -> torch.Tensor:
    """Row ids (of the balanced batch) that rank ``rank`` trained on in critic optimizer step ``update`` of recorded
    step ``step`` (default the first), ascending: that rank's share of the step's mini-batch (the update plan)."""
    plan = critic_plan(run, step)
    return torch.as_tensor(sorted(plan.steps[update].rows(rank)), dtype=torch.long)


def critic_micro_batches(run: Run | str | None = None, update: int = 0, rank: int = 0,
                         overrides: Iterable[str] = (), step: int | None = None,
                         max_token_len: int | None = None) -> list[torch.Tensor]:
    """The micro-batches (row ids of the balanced batch) of rank ``rank``'s share of critic optimizer step
    ``update``, as the critic engine of the run's config with ``overrides`` cuts them — or, given
    ``max_token_len``, by that token budget: the update plan (:func:`critic_plan`), recorded or planned by
    ``ppolab.update_plan.plan_update`` on the recorded rows."""
    plan = critic_plan(run, step, overrides, max_token_len)
    return [torch.as_tensor(mb, dtype=torch.long) for mb in plan.steps[update].micro_batches[rank]]


def smallest_budget(run: Run | str | None = None) -> int:
    """The smallest critic token budget ppolab's validation accepts: one full-length sequence,
    data.max_prompt_length + data.max_response_length."""
    d = resolve_run(run, RUN).ppo_config().data
    return int(d.max_prompt_length + d.max_response_length)


def critic_engine_case(run: Run | str | None = None, prefer: int = 3) -> dict:
    """Lab 09's V1 exercise: critic optimizer step ``update`` (``prefer``, or the last when the step took fewer) of
    the first recorded step, rank 0's rows and attended tokens there, the run's budget and the smallest one."""
    r = resolve_run(run, RUN)
    require(r, "critic")
    rec = r.step(r.steps[0])
    t = rec.tensors
    n = int(t["critic_vpreds"].shape[0])
    update = min(prefer, n - 1)
    mine = rank_rows(r, update, 0)
    if len(mine) == 0:
        raise RunLacks("rows on rank 0 in a critic optimizer step", r)
    attended = t["response_attention_mask"] if "response_attention_mask" in t else t["response_mask"]
    tokens = int(t["prompt_mask"][mine].sum() + attended[mine].sum())
    return {"update": update, "rows": len(mine), "tokens": tokens, "dp": int(rec.info.get("dp_size", 1) or 1),
            "budget": int(r.ppo_config().critic.ppo_infer_max_token_len_per_gpu), "small": smallest_budget(r),
            "micro": 2}


def window_case(run: Run | str | None = None, prefer: int = 1) -> dict:
    """Lab 09's first-update exercise: critic optimizer step ``prefer`` (the first after a gradient step) of the first
    recorded step, or the last when the step took fewer; with the run's ε_v."""
    r = resolve_run(run, RUN)
    require(r, "critic", "critic_updates")
    n = int(r.step(r.steps[0]).tensors["critic_vpreds"].shape[0])
    return {"update": min(prefer, n - 1), "eps_v": r.ppo_config().critic.cliprange_value}
