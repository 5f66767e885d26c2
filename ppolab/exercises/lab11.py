"""Lab 11 — loss aggregation: who is averaged over whom (chapter §10)."""
from __future__ import annotations

import torch

from ppolab import algos
from ppolab.exercises import exercise


def first_mini_batch(run=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ℓ = −advantages, response_mask) of the first mini-batch of the first recorded step, float64."""
    from ppolab.batching import mini_batch_indices
    from ppolab.widgets.common import step_tensors

    rec = step_tensors(run, None)
    t = rec.tensors
    plan = rec.info["batch_plan"]
    rows = mini_batch_indices(plan["n_trajectories"], plan["local_mini_batch"], plan["ppo_epochs"])[0][0]
    rows = torch.as_tensor(rows)
    return -t["advantages"][rows].double(), t["response_mask"][rows].double()


def weight_ratio(run=None, mode: str = "token-mean") -> float:
    """Weight of a longest row over weight of a shortest row of :func:`first_mini_batch` under ``mode``."""
    from ppolab.widgets.aggregation import trajectory_weights

    loss, mask = first_mini_batch(run)
    lengths = mask.sum(-1)
    _, w = trajectory_weights(loss, mask, mode)
    return (w[lengths.argmax()] / w[lengths.argmin()]).item()


@exercise("11.1", "Under token-mean, a batch holds a 3-token and a 9-token trajectory. What share of the total weight "
          "does the 3-token one get?",
          hints=("token-mean gives every valid token the same weight.",
                 "share = T_A / (T_A + T_B); trajectory_weights(ones, mask, 'token-mean') gives the weights "
                 "(chapter §10.1, §10.6)."))
def _e1() -> float:
    from ppolab.widgets.aggregation import trajectory_weights

    mask = torch.zeros(2, 9, dtype=torch.float64)
    mask[0, :3], mask[1, :] = 1, 1
    _, w = trajectory_weights(torch.ones(2, 9, dtype=torch.float64), mask, "token-mean")
    return (w[0] / w.sum()).item()


@exercise("11.2", "Four trajectories of 5 tokens each, every token loss 1. Rollout rejection drops one whole "
          "trajectory (its response_mask becomes 0, loss_mask stays). What does token-mean return when, as in the "
          "engine, batch_num_tokens = loss_mask.sum()?",
          hints=("The numerator loses a row; does the denominator?",
                 "agg_loss(ones, response_mask, 'token-mean', batch_num_tokens=loss_mask.sum()) = 15 / 20 "
                 "(chapter §9, §10.1)."))
def _e2() -> float:
    loss_mask = torch.ones(4, 5, dtype=torch.float64)
    response_mask = loss_mask.clone()
    response_mask[0] = 0
    return algos.agg_loss(torch.ones(4, 5, dtype=torch.float64), response_mask, "token-mean",
                          batch_num_tokens=loss_mask.sum()).item()


@exercise("11.3", "Predict, then verify: in the first mini-batch of the first recorded step, the weight of a longest "
          "trajectory divided by the weight of a shortest one — under token-mean and under seq-mean-token-mean. "
          "A pair of numbers.",
          hints=("token-mean weighs tokens equally, seq-mean-token-mean weighs non-empty trajectories equally. "
                 "The cell above printed the shortest and longest response lengths.",
                 "(T_max / T_min, 1.0): trajectory_weights(loss, mask, mode) for both modes, at the rows with the "
                 "largest and the smallest response_mask.sum(-1)."),
          rel=1e-6, abs=1e-9, context=("run",))
def _e3(run=None) -> tuple[float, float]:
    return weight_ratio(run, "token-mean"), weight_ratio(run, "seq-mean-token-mean")


@exercise("11.4", "Predict, then verify: seq-mean-token-mean of ℓ = −advantages on the first mini-batch of the first "
          "recorded step (a GRPO run; to 6 decimals).",
          hints=("GRPO gives every token of a trajectory the same advantage, and normalises the advantages inside "
                 "each group of rollout.n trajectories. What is a trajectory's token mean then, and what do the "
                 "means of one group add up to?",
                 "Each sequence mean is −A_i; Σ_i (s_i − μ)/(σ + ε) = 0 within a group, and the mini-batch holds "
                 "whole groups: agg_loss(−advantages, response_mask, 'seq-mean-token-mean') ≈ 0."),
          rel=0.0, abs=1e-6, context=("run",))
def _e4(run=None) -> float:
    loss, mask = first_mini_batch(run)
    return algos.agg_loss(loss, mask, "seq-mean-token-mean").item()
