"""Lab 12 — batch, mini-batch, micro-batch (chapter §11–§12, §9 for the synthetic padding rows)."""
from __future__ import annotations

import torch

from ppolab.exercises import exercise


@exercise("12.1", "Predict, then verify: recorded step 1 of the run — how many actor optimizer steps did it take, "
                  "and how many rows (trajectories) did each one train on? Answer (optimizer steps, rows).",
          hints=("Read the run's config: data.train_batch_size, rollout.n, actor.ppo_mini_batch_size, ppo_epochs. "
                 "ppo_mini_batch_size counts prompts; the trainer multiplies it by rollout.n (§11.2).",
                 "rows = ppo_mini_batch_size × n; steps = (train_batch_size × n) / rows × ppo_epochs. On the "
                 "recorded tensors: actor_log_probs.shape[0], and the rows of actor_log_probs[k] that are not NaN."),
          context=("run",), needs=("step1",))
def _e1(run=None) -> tuple[int, int]:
    from ppolab.numbers import step_tensors

    lp = step_tensors(run, 1).tensors["actor_log_probs"]
    rows = (~torch.isnan(lp).all(-1)).sum(-1)
    assert (rows == rows[0]).all()
    return int(lp.shape[0]), int(rows[0])


@exercise("12.2", "train_batch_size = 64, rollout.n = 4, ppo_mini_batch_size = 16, 4 DP ranks, "
                  "ppo_micro_batch_size_per_gpu = 4, 1 epoch: how many optimizer steps per training step, and how "
                  "many gradient-accumulation waves per mini-batch? Answer (optimizer steps, waves).",
          hints=("First turn every size into trajectories (× n), then split the global mini-batch over the DP "
                 "ranks before you cut it into micro-batches.",
                 "steps = (64·4)/(16·4) × 1; waves = local mini / micro = (16·4/4)/4 — plan_batches(64, 4, 16, 4, "
                 "4, 1).optimizer_steps and .micro_batches_per_mini."))
def _e2() -> tuple[int, int]:
    from ppolab.batching import plan_batches

    p = plan_batches(64, 4, 16, 4, 4, 1)
    return p.optimizer_steps, p.micro_batches_per_mini


@exercise("12.3", "train_batch_size = 32, rollout.n = 5, ppo_mini_batch_size = 6, 1 DP rank, "
                  "ppo_micro_batch_size_per_gpu = 2, 1 epoch, no critic: the V1 trainer pads the batch with "
                  "synthetic rows instead of rejecting it. How many synthetic rows does the balance stage append, "
                  "and how many optimizer steps per epoch does the padded batch take? "
                  "Answer (synthetic rows, optimizer steps per epoch).",
          hints=("The batch must become a multiple of the global mini-batch (and of the DP size) — counted in "
                 "trajectories, not prompts. The synthetic rows count like any other row for the step count.",
                 "multiple = lcm(dp_size, ppo_mini_batch_size × n) = lcm(1, 6 × 5); synthetic = (−32·5) mod "
                 "multiple; steps = (160 + synthetic) / 30 — plan_batches(32, 5, 6, 1, 2, 1, "
                 "pad_to=padding_multiple(1, 30)).padding_rows and .optimizer_steps_per_epoch."))
def _e3() -> tuple[int, int]:
    from ppolab.batching import padding_multiple, plan_batches

    plan = plan_batches(32, 5, 6, 1, 2, 1, pad_to=padding_multiple(1, 6 * 5))
    return plan.padding_rows, plan.optimizer_steps_per_epoch


@exercise("12.4", "Predict, then verify: the first mini-batch of recorded step 1, use_dynamic_bsz with "
                  "ppo_max_token_len_per_gpu = 128. How many micro-batches does the engine cut (verl 0.9.1 "
                  "behaviour, which ppolab follows)?",
          hints=("Start from ceil(total tokens / budget), tokens = prompt + response per row. Then remember what "
                 "0.9.1 does when a Karmarkar–Karp partition overshoots the budget.",
                 "len(plan_dynamic_micro_batches(recorded_seq_lens(rec, local_mini_batch), 128)): ceil(ΣL / 128), "
                 "plus one micro-batch per retry of the fit loop until every micro-batch holds ≤ 128 tokens."),
          context=("run",), needs=("step1",))
def _e4(run=None) -> int:
    from ppolab.batching import plan_dynamic_micro_batches
    from ppolab.numbers.aggregation import recorded_seq_lens
    from ppolab.numbers import step_tensors

    rec = step_tensors(run, 1)
    return len(plan_dynamic_micro_batches(recorded_seq_lens(rec, rec.info["batch_plan"]["local_mini_batch"]), 128))
