"""Lab 01 — one update, end to end: verl's nine stages (chapter §1)."""
from __future__ import annotations

import inspect
import re

import torch

from ppolab.exercises import exercise
from ppolab.numbers.cases import second_epoch_case


@exercise("01.1", "Predict, then verify: recorded step 1 holds {rows} rows; its mini-batches are {mini} rows, "
                  "ppo_epochs = {epochs}, shuffle = false. Which rows does optimizer step {opt_step} train on? Answer "
                  "(first row, last row), 0-based row positions of the recorded batch.",
          hints=("Optimizer steps 0 … {per_epoch} − 1 are the mini-batches of the first epoch. What does the second "
                 "epoch go through, and in which order, when the mini-batches are not shuffled?",
                 "Without shuffle, epoch e takes the same contiguous slices again: optimizer step k trains on rows "
                 "(k mod {per_epoch})·{mini} … (k mod {per_epoch})·{mini} + {mini} − 1. The rows of step k are those "
                 "where actor_log_probs[k] is not NaN."),
          context=("run",), needs=("step1", "epochs", "unshuffled"), case=second_epoch_case)
def _e1(run=None) -> tuple[int, int]:
    from ppolab.numbers import step_tensors

    lp = step_tensors(run, 1).tensors["actor_log_probs"][second_epoch_case(run)["opt_step"]]
    rows = torch.nonzero(~torch.isnan(lp).all(dim=-1)).flatten()
    return int(rows.min()), int(rows.max())


@exercise("01.2", "How many response tokens of recorded step 1 enter the actor loss? Count each token once, real "
                  "rows only (not the prompt, not the padding).",
          hints=("Only positions with response_mask = 1 enter any loss; synthetic rows (is_pad = 1) have none.",
                 "int(t['response_mask'][~t['is_pad'].bool()].sum())"),
          context=("run",), needs=("step1",))
def _e2(run=None) -> int:
    from ppolab.numbers import step_tensors

    rec = step_tensors(run, 1)
    # the logged response_length/mean is the mean generated length over the real rows; rejection sampling (if on)
    # then dropped tokens from response_mask but not from loss_mask, the copy made at generation
    t = rec.tensors
    real = ~t["is_pad"].bool()
    rejected = int((t["loss_mask"].bool() & ~t["response_mask"].bool())[real].sum()) if "loss_mask" in t else 0
    return round(rec.info["metrics"]["response_length/mean"] * int(real.sum())) - rejected


def stage_methods() -> list[str]:
    """The stage methods of ``ppolab.trainer.PPOTrainer.step``, in the order it calls them."""
    from ppolab.trainer import PPOTrainer

    names = re.findall(r"self\.(\w+)\(", inspect.getsource(PPOTrainer.step))
    return [n for i, n in enumerate(names) if n not in names[:i] and n.startswith(
        ("generate_", "compute_", "balance_", "update_"))]


@exercise("01.3", "Which stage (its method name, e.g. \"compute_reward\") first creates the tensor that the "
                  "reference-KL paths need?",
          hints=("The reference KL compares a policy with π_ref. Which recorded tensor holds π_ref's log-probs, "
                 "and in the table of stages, which row adds it?",
                 "The stage that writes batch[\"ref_log_prob\"] — stage 5 of the nine."))
def _e3() -> str:
    from ppolab.trainer import PPOTrainer

    for name in stage_methods():
        if re.search(r"\[\"ref_log_prob\"\]\s*=", inspect.getsource(getattr(PPOTrainer, name))):
            return name
    raise LookupError("no stage of PPOTrainer.step writes ref_log_prob")
