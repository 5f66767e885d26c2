"""What a training step logs besides the losses: verl's data metrics, and how per-micro-batch and per-step metrics
reduce (chapter §15; verl `metric_utils.compute_data_metrics`, `reduce_metrics`, `losses.ppo_loss`)."""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterable, Iterator

import numpy as np
import torch

from ppolab import algos
from ppolab.algos import SUM_METRICS
from ppolab.batch import Batch


def reduce_metrics(per_step: Iterable[dict[str, float]]) -> dict[str, float]:
    """Average over optimizer steps (np.max / np.min for keys naming max / min), as verl's reduce_metrics."""
    collected: dict[str, list[float]] = defaultdict(list)
    for metrics in per_step:
        for k, v in metrics.items():
            collected[k].append(v)
    out = {}
    for k, values in collected.items():
        reducer = np.max if "max" in k else np.min if "min" in k else np.mean
        out[k] = float(reducer(values))
    return out


def accumulate_micro_metrics(micro: list[dict[str, float]]) -> dict[str, float]:
    """Within one mini-batch: loss metrics SUM over micro-batches (each is a share of the global value),
    ratios (clipfrac, ppo_kl, …) a plain MEAN — not token-weighted (chapter §15)."""
    collected: dict[str, list[float]] = defaultdict(list)
    for metrics in micro:
        for k, v in metrics.items():
            collected[k].append(v)
    return {k: float(np.sum(v) if k in SUM_METRICS else np.mean(v)) for k, v in collected.items()}


def data_metrics(batch: Batch, use_critic: bool, max_response_length: int) -> dict[str, float]:
    """verl's ``compute_data_metrics``: score / reward / advantage / return / value statistics and lengths."""
    real = ~batch["is_pad"]
    mask = batch["response_mask"][real].bool()
    out: dict[str, float] = {}

    def stats(name: str, values: torch.Tensor) -> None:
        if values.numel():
            out.update({f"{name}/mean": float(values.mean()), f"{name}/max": float(values.max()),
                        f"{name}/min": float(values.min())})

    stats("critic/score", batch["token_level_scores"][real].sum(-1))
    stats("critic/rewards", batch["token_level_rewards"][real].sum(-1))
    stats("critic/advantages", batch["advantages"][real][mask])
    stats("critic/returns", batch["returns"][real][mask])
    if use_critic:
        stats("critic/values", batch["values"][real][mask])
        if mask.sum() > 1:
            out["critic/vf_explained_var"] = float(algos.explained_variance(
                batch["returns"][real], batch["values"][real], batch["response_mask"][real]))
    # Lengths from loss_mask, the mask as generated: rejection sampling (rollout_rs) zeroes tokens of response_mask
    # but does not shorten a response (verl counts lengths from the attention mask).
    lengths = batch.tensors.get("loss_mask", batch["response_mask"])[real].sum(-1)
    stats("response_length", lengths)
    out["response_length/clip_ratio"] = float((lengths >= max_response_length).float().mean())
    stats("prompt_length", batch["prompt_mask"][real].sum(-1).float())
    return out


def timing_metrics(batch: Batch, timing: dict[str, float], dp_size: int) -> dict[str, float]:
    """``timing_s/<stage>`` and verl's ``perf/total_num_tokens``, ``perf/time_per_step`` and ``perf/throughput``
    (prompt + response tokens of the step per second per rank)."""
    tokens = float((batch["prompt_mask"].sum() + batch["response_mask"].sum()))
    return {**{f"timing_s/{k}": v for k, v in timing.items()}, "perf/total_num_tokens": tokens,
            "perf/time_per_step": timing["step"], "perf/throughput": tokens / timing["step"] / dp_size}


@contextmanager
def timer(timing: dict[str, float], name: str) -> Iterator[None]:
    """Time the block into ``timing[name]`` (seconds): the ``timing_s/<stage>`` metrics."""
    start = time.perf_counter()
    yield
    timing[name] = time.perf_counter() - start


#: ppolab's own metrics (verl logs none of these): how much learning signal a step carried.
SIGNAL_METRICS = ("ppolab/signal/uniform_group_frac", "ppolab/signal/identical_group_frac",
                  "ppolab/signal/zero_adv_frac")


def signal_metrics(batch: Batch) -> dict[str, float]:
    """How much a step can teach, over its real rows: the fraction of prompt groups (rows sharing a ``uid``, ≥ 2
    of them) whose scores are all equal — GRPO-style advantages are 0 there — and whose responses are token for
    token identical; and the fraction of response tokens whose advantage is 0. With one response per prompt the
    whole batch is the group. Read by :class:`ppolab.watch.LearningSignalWatch`."""
    real = ~batch["is_pad"].bool()
    scores = batch["token_level_scores"][real].sum(-1)
    responses, mask = batch["responses"][real], batch["response_mask"][real].bool()
    uid = batch["uid"][real]
    groups = [torch.nonzero(uid == u).flatten() for u in torch.unique(uid)]
    groups = [g for g in groups if len(g) > 1] or ([torch.arange(len(uid))] if len(uid) > 1 else [])
    if not groups:
        return {}
    uniform = [bool(scores[g].max() - scores[g].min() <= 1e-9) for g in groups]
    identical = [bool((responses[g] == responses[g[0]]).all()) for g in groups]
    advantages = batch["advantages"][real][mask]
    return {SIGNAL_METRICS[0]: float(np.mean(uniform)), SIGNAL_METRICS[1]: float(np.mean(identical)),
            SIGNAL_METRICS[2]: float((advantages.abs() <= 1e-8).float().mean()) if advantages.numel() else 1.0}
