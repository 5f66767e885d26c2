"""The critic's micro-batches as verl V1 wires them, and the cases labs 09–11 ask about.

verl V1 `trainer_base.py` hands the critic engine one key, ``critic.ppo_infer_max_token_len_per_gpu``, for both its
value forward (stage 6) and its update (stage 8); the top-level ``critic.use_dynamic_bsz``,
``critic.ppo_max_token_len_per_gpu``, ``critic.ppo_micro_batch_size_per_gpu`` and
``critic.ppo_infer_micro_batch_size_per_gpu`` never reach it (chapter §8 last paragraph, §11.6, §14.1). The functions
here cut a recorded critic mini-batch with ppolab's own wiring (``CriticWorker.engine_batching``) and its own
micro-batch planner (``ppolab.engine.micro_batches``), under the run's config or the run's config with overrides.
"""
from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any, Iterable

import torch

from ppolab.numbers.needs import RunLacks, require
from ppolab.record import Run, resolve_run

#: The default shipped run of these helpers: PPO + GAE with rejection sampling and padding rows.
RUN = "ppo_fire_tiny"


def config_with(run: Run | str | None = None, overrides: Iterable[str] = ()) -> Any:
    """The run's :class:`~ppolab.config.PPOConfig` with verl-style overrides (``"key=value"``; a leading ``+``, as
    verl's Hydra command line needs for a key its YAML does not declare, is accepted). Not validated."""
    import yaml

    from ppolab.config import from_dict

    tree = copy.deepcopy(resolve_run(run, RUN).config)
    for item in overrides:
        key, value = item.split("=", 1)
        *parents, last = key.strip().lstrip("+").split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = yaml.safe_load(value)
    return from_dict(tree)


def critic_batching(cfg: Any) -> Any:
    """How the critic engine of config ``cfg`` cuts its rows: ppolab's ``CriticWorker.engine_batching`` (an
    :class:`~ppolab.worker.InferBatching`), read from ``cfg.critic`` as the worker reads its own config."""
    from ppolab.worker import CriticWorker

    return CriticWorker.engine_batching(SimpleNamespace(config=cfg.critic))


def rank_rows(run: Run | str | None = None, update: int = 0, rank: int = 0, step: int | None = None) -> torch.Tensor:
    """Row ids (of the balanced batch) that rank ``rank`` trained on in critic optimizer step ``update`` of recorded
    step ``step`` (default the first): the rows of that global mini-batch in the rank's contiguous chunk."""
    r = resolve_run(run, RUN)
    rec = r.step(r.steps[0] if step is None else step)
    t = rec.tensors
    dp = int(rec.info.get("dp_size", 1) or 1)
    chunk = t["responses"].shape[0] // dp
    rows = (~torch.isnan(t["critic_vpreds"][update]).all(-1)).nonzero().flatten()
    return rows[(rows // chunk) == rank]


def critic_micro_batches(run: Run | str | None = None, update: int = 0, rank: int = 0,
                         overrides: Iterable[str] = (), step: int | None = None,
                         max_token_len: int | None = None) -> list[torch.Tensor]:
    """The micro-batches (row ids of the balanced batch) of rank ``rank``'s share of critic optimizer step
    ``update``, cut as the critic engine of the run's config with ``overrides`` cuts them — or, given
    ``max_token_len``, by that token budget. ppolab's planner (``ppolab.engine.micro_batches``) on the rows' attended
    lengths."""
    from ppolab.engine import Batch, micro_batches

    r = resolve_run(run, RUN)
    rec = r.step(r.steps[0] if step is None else step)
    t = rec.tensors
    mine = rank_rows(r, update, rank, step)
    if len(mine) == 0:
        return []
    if max_token_len is not None:
        size, budget = None, max_token_len
    else:
        overrides = list(overrides)
        batching = critic_batching(config_with(r, overrides) if overrides else r.ppo_config())
        size, budget = batching.micro_batch_size, batching.max_token_len
    keys = [k for k in ("prompt_mask", "response_mask", "response_attention_mask") if k in t]
    dp = int(rec.info.get("dp_size", 1) or 1)
    shares = [Batch({k: t[k][rank_rows(r, update, k_rank, step)] for k in keys}) for k_rank in range(dp)]
    # every rank's lengths: the engine agrees the count over the ranks (verl all-reduces it, MAX)
    plan = micro_batches(shares[rank], size, budget, dp_lengths=[b.lengths() for b in shares], rank=rank)
    return [mine[torch.as_tensor(m, dtype=torch.long)] for m in plan]


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
