"""Lab 10 — how response_mask reaches the loss (chapter §9)."""
from __future__ import annotations

import math

import torch

from ppolab import algos
from ppolab.exercises import exercise


def _record(run=None):
    from ppolab.widgets.common import step_tensors

    return step_tensors(run, None)


def nan_loss_and_mask() -> tuple[torch.Tensor, torch.Tensor]:
    """Two real rows; the first has a NaN at its one padded position (mask 0)."""
    loss = torch.tensor([[1.0, 2.0, math.nan], [3.0, 4.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    return loss, mask


@exercise("10.1", "How many token losses of row 3 of the first recorded step enter the numerator of every loss?",
          hints=("Only positions with response_mask = 1 are multiplied by 1; the others by 0.",
                 "int(response_mask[3].sum()) — equivalently agg_loss(ones, response_mask[3:4], 'token-sum')."),
          context=("run",))
def _e1(run=None) -> int:
    t = _record(run).tensors
    ones = torch.ones(1, t["responses"].shape[1], dtype=torch.float64)
    return int(algos.agg_loss(ones, t["response_mask"][3:4].double(), "token-sum").item())


@exercise("10.2", "With the prompt width P of the first recorded step, the logits at which sequence position score "
          "response token j = 4?",
          hints=("Position t of a causal LM predicts the token at t + 1; response token j sits at position P + j.",
                 "logit position = P − 1 + j (the one-token shift; shift_table(rec, tokenizer, row)['logit "
                 "position'])."),
          context=("run",))
def _e2(run=None) -> int:
    from ppolab.widgets.masks import run_tokenizer, shift_table
    from ppolab.widgets.common import resolve_run

    rec = _record(run)
    return int(shift_table(rec, run_tokenizer(resolve_run(run)), 0)["logit position"][4])


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


def doctored_seq_mean(run=None, fixed_global_batch_size: bool = True) -> float:
    """seq-mean-token-mean of ℓ = 1 on the first recorded step plus two synthetic padding rows (the trainer's
    add_padding_samples), with B_agg = all rows (verl's fixed global_batch_size) or the fallback (non-empty rows)."""
    from ppolab.engine import Batch
    from ppolab.trainer import add_padding_samples
    from ppolab.widgets.common import resolve_run
    from ppolab.widgets.masks import run_tokenizer

    rec = _record(run)
    t = rec.tensors
    n = t["responses"].shape[0]
    padded = add_padding_samples(Batch({k: v for k, v in t.items() if v.shape[0] == n}), 2,
                                 run_tokenizer(resolve_run(run)))
    mask = padded["response_mask"].double()
    gbs = mask.shape[0] if fixed_global_batch_size else None
    return algos.agg_loss(torch.ones_like(mask), mask, "seq-mean-token-mean", global_batch_size=gbs).item()


@exercise("10.4", "Predict, then verify: the doctored copy appends 2 synthetic padding rows to the first recorded "
          "step. With every token loss ℓ = 1, what does seq-mean-token-mean return when B_agg counts every row of the "
          "copy, as verl's fixed global_batch_size does? (4 decimals)",
          hints=("Every real row has a sequence mean of exactly 1 (up to the 1e-8 in its denominator); a pad row is "
                 "left out of the sum by q_i = 0 — but is it left out of the divisor?",
                 "(number of non-empty rows) / (number of all rows) = agg_loss(ones, padded['response_mask'], "
                 "'seq-mean-token-mean', global_batch_size=len(padded))."),
          rel=0.0, abs=1e-4, context=("run",))
def _e4(run=None) -> float:
    return doctored_seq_mean(run, True)
