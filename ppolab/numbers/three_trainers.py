"""One batch's token losses as verl 0.9.1, TRL and OpenRLHF aggregate them (chapter §13, §10).

Every trainer here turns a mini-batch's (B, R) token losses ℓ into the loss it backpropagates, micro-batch by
micro-batch, and the optimizer then sees the gradients summed over the accumulation steps and averaged over the
data-parallel ranks. Every rule is linear in ℓ, so the whole story of a rule under a split is one weight per
token: the gradient of the optimizer step is Σ_{i,t} w_{i,t} ∇ℓ_{i,t}. :func:`token_weights` computes w by
autograd through the rule's own micro-batch loss, summed and averaged as the trainer does; a rule is
*invariant* when w does not change with the split (:func:`split_factors`).

A split: ``ranks`` data-parallel ranks each take B / ranks consecutive rows, cut into micro-batches of ``micro``
rows, so each rank accumulates ``B / (ranks · micro)`` micro-batches into one optimizer step (verl: one mini-batch;
TRL: ``per_device_train_batch_size = micro``, ``gradient_accumulation_steps = B / (ranks · micro)``; OpenRLHF:
``micro_train_batch_size = micro``). Which rows share a micro-batch changes the weights of a rule that counts
locally, not whether it counts locally.

The rules, each written from the trainer's own code (tests/parity/test_trainers_parity.py checks them against the
installed packages):

* verl 0.9.1 — :func:`ppolab.algos.agg_loss` with the global counts (``GlobalBatchInfo``) computed before the
  micro-batch loop, FSDP averaging the ranks' gradients (verl ``workers/utils/losses.py::ppo_loss``,
  ``trainer/ppo/core_algos.py::agg_loss``).
* TRL 1.16 ``GRPOTrainer`` — ``trl/trainer/grpo_trainer.py::GRPOTrainer._compute_loss``, whose ``loss_type``
  decides the normaliser; the Trainer adds no division of its own (``GRPOTrainer.loss_is_scaled_for_ga = True``,
  Accelerate's accumulation set to 1) and DDP averages the ranks. ``dapo``'s normaliser is the generation batch's
  token count rescaled to one accumulation window (the ``× gradient_accumulation_steps / steps_per_generation``
  of huggingface/trl#6024; :data:`TRL_DAPO_BEFORE_6024` is the rule before that fix).
* OpenRLHF 0.11.2 — ``openrlhf/models/loss.py::aggregate_loss`` with the counts of
  ``openrlhf/utils/loss_utils.py::_optimizer_step_loss_norm`` (the optimizer step's tokens or sequences over all
  ranks, ÷ the accumulation steps), DeepSpeed scaling each backward by 1 / accumulation steps and averaging ranks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ppolab.algos import agg_loss


@dataclass(frozen=True)
class Split:
    """How one optimizer step's B rows are cut: ``ranks`` data-parallel ranks, ``micro`` rows a micro-batch."""

    micro: int
    """Rows of one micro-batch on one rank."""
    ranks: int = 1
    """Data-parallel ranks; each takes B / ranks consecutive rows."""

    def accumulation(self, rows: int) -> int:
        """Micro-batches each rank accumulates into the optimizer step (TRL's ``gradient_accumulation_steps``)."""
        return rows // (self.micro * self.ranks)

    def check(self, rows: int) -> None:
        """A one-line ValueError unless ``micro × ranks`` divides the B rows."""
        if self.micro < 1 or self.ranks < 1 or rows % (self.micro * self.ranks):
            raise ValueError(f"Split(micro={self.micro}, ranks={self.ranks}): micro × ranks must divide the "
                             f"optimizer step's {rows} rows; pick divisors of {rows}")


@dataclass(frozen=True)
class Counts:
    """What a micro-batch loss may read besides its own rows: the split and the optimizer step's totals."""

    rows: int
    """B: rows of the optimizer step, all ranks."""
    tokens: float
    """N: loss tokens of the optimizer step, all ranks."""
    sequences: float
    """Rows with at least one loss token, all ranks."""
    accumulation: int
    """Micro-batches a rank accumulates."""
    ranks: int
    """Data-parallel ranks."""
    max_length: int
    """The response budget (verl ``data.max_response_length``, TRL ``max_completion_length``)."""
    steps_per_generation: int
    """TRL's micro-steps per generation batch (its default: the accumulation steps)."""


@dataclass(frozen=True)
class Rule:
    """One trainer's aggregation: ``micro_loss(x, m, counts)`` — x a micro-batch's token losses ℓ, m its loss
    mask — is the loss its backward sees for one micro-batch before the trainer's own scaling
    ``backward_scale(counts)``; the ranks' gradients are then averaged."""

    trainer: str
    mode: str
    cite: str
    micro_loss: Callable[[torch.Tensor, torch.Tensor, Counts], torch.Tensor]
    backward_scale: Callable[[Counts], float] = lambda c: 1.0

    @property
    def name(self) -> str:
        return f"{self.trainer} · {self.mode}"


def _verl(mode: str, factor: float | None) -> Callable:
    def loss(x, m, c: Counts):
        return agg_loss(x, m, mode, dp_size=c.ranks, batch_num_tokens=c.tokens, global_batch_size=c.rows,
                        loss_scale_factor=factor)
    return loss


def verl_rule(mode: str = "token-mean", loss_scale_factor: float | None = None) -> Rule:
    """verl 0.9.1's rule for ``loss_agg_mode`` — ppolab's own ``agg_loss`` with the global counts."""
    return Rule("verl 0.9.1", mode, "verl trainer/ppo/core_algos.py::agg_loss", _verl(mode, loss_scale_factor))


def _trl_grpo(x, m, c):
    return ((x * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean() / c.accumulation


def _trl_bnpo(x, m, c):
    return (x * m).sum() / m.sum().clamp(min=1.0) / c.accumulation


def _trl_dr_grpo(x, m, c):
    return (x * m).sum() / (x.shape[0] * c.max_length) / c.accumulation


def _trl_dapo(x, m, c):
    # num_items_in_batch counts the generation batch (steps_per_generation micro-steps, every process)
    generation_tokens = c.tokens * c.steps_per_generation / c.accumulation
    normaliser = max(generation_tokens, 1.0) / c.ranks * c.accumulation / c.steps_per_generation
    return (x * m).sum() / normaliser


def _trl_dapo_before_6024(x, m, c):
    generation_tokens = c.tokens * c.steps_per_generation / c.accumulation
    return (x * m).sum() / (max(generation_tokens, 1.0) / c.ranks)


_TRL = "trl/trainer/grpo_trainer.py::GRPOTrainer._compute_loss"
TRL_RULES = {
    "grpo": Rule("TRL 1.16", "loss_type=grpo", _TRL, _trl_grpo),
    "bnpo": Rule("TRL 1.16", "loss_type=bnpo", _TRL, _trl_bnpo),
    "dr_grpo": Rule("TRL 1.16", "loss_type=dr_grpo", _TRL, _trl_dr_grpo),
    "dapo": Rule("TRL 1.16", "loss_type=dapo", _TRL, _trl_dapo),
}
#: TRL's ``dapo`` before huggingface/trl#6024: the generation batch's tokens per process, not rescaled to one
#: accumulation window — off by ``gradient_accumulation_steps / steps_per_generation`` when the two differ.
TRL_DAPO_BEFORE_6024 = Rule("TRL before #6024", "loss_type=dapo", "huggingface/trl#6024", _trl_dapo_before_6024)


def _openrlhf(token_level: bool) -> Callable:
    def loss(x, m, c: Counts):
        if token_level:
            return (x * m).sum() / (c.tokens / c.accumulation) * c.ranks
        counts = m.sum(dim=-1)
        seq = (x * m).sum(dim=-1) / (counts + 1e-8)
        return (seq * (counts > 0).to(x.dtype)).sum() / (c.sequences / c.accumulation) * c.ranks
    return loss


_ORL = "openrlhf/models/loss.py::aggregate_loss, openrlhf/utils/loss_utils.py::_optimizer_step_loss_norm"
OPENRLHF_RULES = {
    "token": Rule("OpenRLHF 0.11.2", "token_level_loss=True", _ORL, _openrlhf(True), lambda c: 1 / c.accumulation),
    "sample": Rule("OpenRLHF 0.11.2", "token_level_loss=False", _ORL, _openrlhf(False),
                   lambda c: 1 / c.accumulation),
}


def rules(verl_mode: str = "token-mean", loss_scale_factor: float | None = None) -> list[Rule]:
    """The rules the lab compares: verl's for ``verl_mode``, TRL's four token-level loss types, OpenRLHF's two."""
    return [verl_rule(verl_mode, loss_scale_factor), *TRL_RULES.values(), *OPENRLHF_RULES.values()]


def counts(mask: torch.Tensor, split: Split, max_length: int, steps_per_generation: int | None = None) -> Counts:
    """The optimizer step's totals a rule may read, for ``mask`` (B, R) cut by ``split``."""
    rows = mask.shape[0]
    split.check(rows)
    acc = split.accumulation(rows)
    return Counts(rows=rows, tokens=float(mask.sum()), sequences=float((mask.sum(-1) > 0).sum()),
                  accumulation=acc, ranks=split.ranks, max_length=int(max_length),
                  steps_per_generation=int(steps_per_generation or acc))


def micro_batches(rows: int, split: Split) -> list[list[range]]:
    """Each rank's micro-batches as row ranges: rank r takes rows [r·B/ranks, (r+1)·B/ranks), cut in order."""
    split.check(rows)
    share = rows // split.ranks
    return [[range(r * share + k, r * share + k + split.micro) for k in range(0, share, split.micro)]
            for r in range(split.ranks)]


def token_weights(mask: torch.Tensor, rule: Rule, split: Split, max_length: int,
                  steps_per_generation: int | None = None) -> torch.Tensor:
    """(B, R) float64: w_{i,t} = ∂(what the optimizer steps on)/∂ℓ_{i,t} under ``rule`` and ``split`` — each
    micro-batch's loss scaled as the trainer's backward scales it, summed over a rank's micro-batches, averaged over
    ranks. 0 off the mask. Every micro-batch is trimmed through its last loss token, as the trainers trim to their
    longest response."""
    m = mask.to(torch.float64)
    c = counts(m, split, max_length, steps_per_generation)
    losses = torch.zeros_like(m, requires_grad=True)
    total = losses.new_zeros(())
    for rank in micro_batches(m.shape[0], split):
        for rows in rank:
            mb = m[rows.start:rows.stop]
            on = mb.nonzero()
            width = int(on[:, 1].max()) + 1 if len(on) else 1  # through the last loss token of the micro-batch
            total = total + rule.micro_loss(losses[rows.start:rows.stop, :width], mb[:, :width], c) \
                * rule.backward_scale(c)
    (total / split.ranks).backward()
    return losses.grad * m


def split_factors(mask: torch.Tensor, rule: Rule, split: Split, max_length: int,
                  steps_per_generation: int | None = None, *, here: torch.Tensor | None = None,
                  whole: torch.Tensor | None = None) -> torch.Tensor:
    """Per loss token, the weight under ``split`` over its weight with the whole step in one micro-batch on one
    rank — all 1 where ``rule`` is invariant. (n_tokens,) float64, in row order. ``here`` / ``whole``: those two
    :func:`token_weights` when the caller holds them already (an explorer moving only the split)."""
    if whole is None:
        whole = token_weights(mask, rule, Split(mask.shape[0], 1), max_length)
    if here is None:
        here = token_weights(mask, rule, split, max_length, steps_per_generation)
    on = mask.bool()
    return here[on] / whole[on]


def versus_token_mean(mask: torch.Tensor, rule: Rule, split: Split, max_length: int,
                      steps_per_generation: int | None = None, *, here: torch.Tensor | None = None) -> torch.Tensor:
    """Per loss token, the weight under ``rule`` and ``split`` × N (the step's loss tokens): 1 for every token is
    the token mean over the whole optimizer step (verl's default ``token-mean``, DAPO's objective). ``here``: those
    :func:`token_weights` when the caller holds them already."""
    w = token_weights(mask, rule, split, max_length, steps_per_generation) if here is None else here
    return w[mask.bool()] * float(mask.sum())


def table(mask: torch.Tensor, max_length: int, splits: list[Split], the_rules: list[Rule]) -> list[dict]:
    """One row per rule and split: the smallest and largest split factor over the step's tokens and the smallest
    and largest weight against the token mean (what :func:`split_factors` and :func:`versus_token_mean` give)."""
    out = []
    for rule in the_rules:
        whole = token_weights(mask, rule, Split(mask.shape[0]), max_length)
        for split in splits:
            here = token_weights(mask, rule, split, max_length)
            f = split_factors(mask, rule, split, max_length, here=here, whole=whole)
            v = versus_token_mean(mask, rule, split, max_length, here=here)
            out.append({"rule": rule.name, "micro": split.micro, "ranks": split.ranks,
                        "accumulation": split.accumulation(mask.shape[0]),
                        "split_min": float(f.min()), "split_max": float(f.max()),
                        "vs_mean_min": float(v.min()), "vs_mean_max": float(v.max())})
    return out


def step_mask(run=None, step: int | None = None, opt_step: int = 0) -> dict:
    """What the lab compares on a run: the loss mask (B, R) of the actor's optimizer step ``opt_step`` at ``step``
    (the run's first step by default) as the worker trained it, the run's ``max_response_length`` and its own
    ``loss_agg_mode`` and ``loss_scale_factor``."""
    from ppolab.numbers.steps import optimizer_step_batch
    from ppolab.run.reader import resolve_run

    r = resolve_run(run)
    rec = r.step(r.steps[0] if step is None else step)
    cfg = r.ppo_config()
    actor = cfg.actor_rollout_ref.actor
    return {"mask": optimizer_step_batch(rec, opt_step)["response_mask"].to(torch.float64),
            "max_length": int(cfg.data.max_response_length), "loss_agg_mode": actor.loss_agg_mode,
            "loss_scale_factor": actor.loss_scale_factor, "step": rec.step}
