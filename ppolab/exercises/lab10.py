"""Lab 10 — how response_mask reaches the loss (chapter §9)."""
from __future__ import annotations

import math

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers import RunLacks


#: The lab's run: synthetic padding rows and rejection sampling are both real in it.
RUN = "ppo_fire_tiny"


def _record(run=None):
    from ppolab.numbers import step_tensors

    return step_tensors(run, None, RUN)


def rejected_tokens(run=None) -> torch.Tensor:
    """(N, R) bool: the tokens of the first recorded step that rejection sampling zeroed — sampled by the policy
    (``loss_mask`` 1) but dropped from ``response_mask``."""
    t = _record(run).tensors
    return t["loss_mask"].bool() & ~t["response_mask"].bool()


def nan_loss_and_mask() -> tuple[torch.Tensor, torch.Tensor]:
    """Two real rows; the first has a NaN at its one padded position (mask 0)."""
    loss = torch.tensor([[1.0, 2.0, math.nan], [3.0, 4.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    return loss, mask


@exercise("10.1", "How many token losses of row 2 of the first recorded step enter the numerator of every loss?",
          hints=("Only positions with response_mask = 1 are multiplied by 1; the others by 0 — and with rejection "
                 "sampling on, response_mask and loss_mask can differ.",
                 "int(response_mask[2].sum()) — equivalently agg_loss(ones, response_mask[2:3], 'token-sum'); "
                 "loss_mask only counts the denominator (chapter §9)."),
          context=("run",), default_run=RUN)
def _e1(run=None) -> int:
    t = _record(run).tensors
    ones = torch.ones(1, t["responses"].shape[1], dtype=torch.float64)
    return int(algos.agg_loss(ones, t["response_mask"][2:3].double(), "token-sum").item())


@exercise("10.2", "With the prompt width P of the first recorded step, the logits at which sequence position score "
          "response token j = 4?",
          hints=("Position t of a causal LM predicts the token at t + 1; response token j sits at position P + j.",
                 "logit position = P − 1 + j (the one-token shift; shift_table(rec, tokenizer, row)['logit "
                 "position'])."),
          context=("run",), default_run=RUN)
def _e2(run=None) -> int:
    from ppolab.numbers.masks import run_tokenizer, shift_table
    from ppolab.record import resolve_run

    rec = _record(run)
    if rec.tensors["responses"].shape[1] < 5:
        raise RunLacks("responses at least 5 tokens wide (data.max_response_length)", resolve_run(run, RUN))
    return int(shift_table(rec, run_tokenizer(resolve_run(run, RUN)), 0)["logit position"][4])


@exercise("10.3", "A NaN sits at a masked position (mask 0) of a token-loss matrix. For which of the five "
          "loss_agg_modes is the aggregated loss NaN? A set of mode names.",
          hints=("masked_sum replaces masked positions by 0 before it multiplies; which modes call masked_sum, and "
                 "which multiply loss_mat * loss_mask themselves? What is NaN · 0?",
                 "token-mean and token-sum use masked_sum (torch.where, then × mask); the seq-mean-* modes compute "
                 "torch.sum(loss_mat * loss_mask, dim=-1), and NaN·0 = NaN (verl core_algos.py::agg_loss). Run "
                 "agg_loss on such a matrix for every mode in LOSS_AGG_MODES."))
def _e3() -> set[str]:
    loss, mask = nan_loss_and_mask()
    return {mode for mode in algos.LOSS_AGG_MODES if torch.isnan(algos.agg_loss(loss, mask, mode)).item()}


def padding_case(run=None) -> dict:
    """Exercise 10.4's batch arithmetic, read off the run's config: prompts, n, ranks, mini-batch sizes."""
    from ppolab.record import resolve_run

    r = resolve_run(run, RUN)
    c = r.ppo_config()
    n = c.actor_rollout_ref.rollout.n
    return {"tb": c.data.train_batch_size, "n": n, "dp": int(_record(r).info.get("dp_size", 1) or 1),
            "mini": c.actor_rollout_ref.actor.ppo_mini_batch_size,
            "mini_n": c.actor_rollout_ref.actor.ppo_mini_batch_size * n,
            "critic_n": (c.critic.ppo_mini_batch_size * n) if c.use_critic else "—"}


@exercise("10.4", "Predict, then verify: data.train_batch_size {tb} prompts × rollout.n {n}, trained on {dp} ranks "
          "with "
          "ppo_mini_batch_size {mini} (actor and critic). How many synthetic padding rows (is_pad) does a step of this "
          "run hold?",
          hints=("balance_batch pads the batch so it divides evenly among the ranks AND into mini-batches of mini × n "
                 "rows (of the actor, and of the critic when there is one).",
                 "pad to the next multiple of lcm(dp_size, actor mini × n, critic mini × n) = lcm({dp}, {mini_n}, "
                 "{critic_n}): int(is_pad.sum()) — or batch_plan['padding_rows'] (verl padding_utils.py, chapter §9)."),
          context=("run",), needs=("padding_rows",), case=padding_case, default_run=RUN)
def _e4(run=None) -> int:
    return int(_record(run).tensors["is_pad"].sum())


@exercise("10.5", "Count the tokens of the first recorded step that rollout rejection sampling zeroed: sampled by the "
          "policy, then dropped from response_mask.",
          hints=("Rejection rewrites response_mask and leaves loss_mask, the copy made at generation: compare the two "
                 "masks position by position.",
                 "int((loss_mask.bool() & ~response_mask.bool()).sum()) — the same as loss_mask.sum() − "
                 "response_mask.sum(); rollout_corr/rollout_rs_masked_fraction × loss_mask.sum() (verl "
                 "rollout_corr_helper.py)."),
          context=("run",), needs=("rejection",), default_run=RUN)
def _e5(run=None) -> int:
    return int(rejected_tokens(run).sum())


def first_step_log_ratio(run=None, opt_step: int = 0, mask: str = "response_mask", against: str = "old_log_probs"
                         ) -> float:
    """max |actor_log_probs[opt_step] − ``against``| over the tokens of optimizer step ``opt_step``'s global mini-batch
    (first recorded step) where ``mask`` is 1."""
    t = _record(run).tensors
    lp = t["actor_log_probs"][opt_step]
    rows = ~torch.isnan(lp).all(-1)
    keep = t[mask][rows] > 0
    return (lp[rows] - t[against][rows])[keep].abs().max().item()


@exercise("10.6", "Predict, then verify: the largest |log π_θ − log π_old| (actor_log_probs[0] − old_log_probs) over "
          "the tokens with response_mask 1 of the actor's first optimizer step (global mini-batch 0) of the first "
          "recorded step. (4 decimals)",
          hints=("Before the first gradient step the actor IS π_old. What else would have to be the same for its "
                 "forward to give the same log-probs — and does rejection sampling change what the model reads?",
                 "The update's forward attends with response_attention_mask (rejected tokens stay attended), so it "
                 "recomputes old_log_probs exactly: (actor_log_probs[0] − old_log_probs)[rows][response_mask[rows] "
                 "> 0].abs().max() is 0 — not the bf16 rollout gap, which is π_rollout vs π_old."),
          rel=0.0, abs=1e-4, context=("run",), default_run=RUN)
def _e6(run=None) -> float:
    return first_step_log_ratio(run)
