"""Lab 11 — loss aggregation: who is averaged over whom (chapter §10)."""
from __future__ import annotations

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers import RunLacks

#: The lab's run: its global mini-batches hold synthetic padding rows and rejected tokens.
RUN = "ppo_fire_tiny"


def mini_batch(run=None, opt_step: int = 0, step: int | None = None) -> dict[str, torch.Tensor]:
    """The global mini-batch of actor optimizer step ``opt_step`` of recorded step ``step`` (default the first): its
    rows in the step's update plan (the rows whose ``actor_log_probs[opt_step]`` are not NaN) — on several ranks,
    each rank's share of it. Returns ``rows`` and, float64 for those rows, ``loss`` (ℓ = −advantages),
    ``response_mask``, ``loss_mask`` and ``is_pad``."""
    from ppolab.numbers import step_tensors

    rec = step_tensors(run, step, RUN)
    t = rec.tensors
    rows = torch.tensor(rec.opt_step(opt_step).rows(), dtype=torch.long)
    return {"rows": rows, "loss": -t["advantages"][rows].double(), "response_mask": t["response_mask"][rows].double(),
            "loss_mask": t["loss_mask"][rows].double(), "is_pad": t["is_pad"][rows].bool()}


def first_mini_batch(run=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ℓ = −advantages, response_mask) of the global mini-batch of the first optimizer step of the first recorded
    step, float64."""
    b = mini_batch(run, 0)
    return b["loss"], b["response_mask"]


def padded_mini_batch_step(run=None) -> int:
    """The first actor optimizer step of the first recorded step whose global mini-batch holds a padding row."""
    from ppolab.numbers import step_tensors

    from ppolab.run.reader import resolve_run

    rec = step_tensors(run, None, RUN)
    pad = rec.tensors["is_pad"].bool()
    found = next((k for k in range(len(rec.plan("actor").steps)) if pad[rec.opt_step(k).rows()].any()), None)
    if found is None:
        raise RunLacks("synthetic padding rows (is_pad) in the first recorded step", resolve_run(run, RUN))
    return found


def padding_case(run=None) -> dict:
    """Exercise 11.2: the trainer's B_agg (``gbs``) and the optimizer step whose mini-batch holds padding rows."""
    return {"gbs": global_batch_size(run), "opt_step": padded_mini_batch_step(run)}


def global_batch_size(run=None) -> int:
    """B_agg of the trainer — actor.ppo_mini_batch_size × rollout.n, which verl passes as global_batch_size — as the
    first recorded step's update plan holds it (every optimizer step's is the same)."""
    from ppolab.numbers import step_tensors

    return int(step_tensors(run, None, RUN).plan("actor").steps[0].global_batch_size)


def weight_ratio(run=None, mode: str = "token-mean") -> float:
    """Weight of a longest row over weight of a shortest non-empty row of :func:`first_mini_batch` under ``mode``."""
    from ppolab.numbers.aggregation import trajectory_weights

    loss, mask = first_mini_batch(run)
    lengths = mask.sum(-1)
    nonempty = lengths > 0
    _, w = trajectory_weights(loss[nonempty], mask[nonempty], mode)
    lengths = lengths[nonempty]
    return (w[lengths.argmax()] / w[lengths.argmin()]).item()


def ones_token_mean(run=None, opt_step: int = 0, denominator: str = "loss_mask") -> float:
    """token-mean of ℓ = 1 on a global mini-batch, with batch_num_tokens = Σ ``denominator``: the engine's count
    (Σ loss_mask, read from the step's plan) or, for another ``denominator``, what that count would give."""
    from ppolab.numbers import step_tensors

    b = mini_batch(run, opt_step)
    m = b["response_mask"]
    if denominator == "loss_mask":  # the count the worker divided by, as the step's plan holds it
        tokens = step_tensors(run, None, RUN).opt_step(opt_step).step.info().batch_num_tokens
    else:
        tokens = b[denominator].sum()  # what-if: another denominator than the worker's
    return algos.agg_loss(torch.ones_like(m), m, "token-mean", batch_num_tokens=tokens).item()


def ones_seq_mean(run=None, opt_step: int | None = None, fixed: bool = True) -> float:
    """seq-mean-token-mean of ℓ = 1 on the padded global mini-batch, with B_agg = global_batch_size (verl's fixed
    mini × n, padding rows counted) or, with ``fixed`` false, the fallback (the non-empty rows)."""
    b = mini_batch(run, padded_mini_batch_step(run) if opt_step is None else opt_step)
    m = b["response_mask"]
    gbs = global_batch_size(run) if fixed else None
    return algos.agg_loss(torch.ones_like(m), m, "seq-mean-token-mean", global_batch_size=gbs).item()


def rejection_case(run=None) -> dict:
    """Exercise 11.3's actor optimizer step of the first recorded step: of those whose rows differ from optimizer
    step 0's (the lab prints step 0), the one whose mini-batch lost the most tokens to rejection sampling; step 0
    when every optimizer step trains the same rows."""
    from ppolab.numbers import step_tensors

    t = step_tensors(run, None, RUN).tensors
    first = mini_batch(run, 0)["rows"]
    others = [k for k in range(t["actor_log_probs"].shape[0])
              if not torch.equal(mini_batch(run, k)["rows"], first)]

    def rejected(k: int) -> float:
        b = mini_batch(run, k)
        return float(b["loss_mask"].sum() - b["response_mask"].sum())

    return {"opt_step": max(others, key=lambda k: (rejected(k), -k)) if others else 0}


@exercise("11.3", "Predict, then verify: every token loss ℓ = 1 on the global mini-batch of actor optimizer step "
          "{opt_step} of the first recorded step. What does token-mean return with the engine's batch_num_tokens = "
          "Σ loss_mask of that mini-batch? (4 decimals)",
          kind="predict",
          hints=("The numerator counts the tokens response_mask keeps; does the denominator lose the tokens rejection "
                 "sampling dropped?",
                 "Σ response_mask / Σ loss_mask over the mini-batch = agg_loss(ones, response_mask, 'token-mean', "
                 "batch_num_tokens=loss_mask.sum()) on mini_batch(run, {opt_step}) (ppolab.exercises.lab11; chapter "
                 "§9, §10.1)."),
          rel=0.0, abs=1e-4, context=("run",), case=rejection_case, default_run=RUN)
def _e3(run=None) -> float:
    return ones_token_mean(run, rejection_case(run)["opt_step"])


@exercise("11.1", "Predict, then verify: in the global mini-batch of optimizer step 0 of the first recorded step, the "
          "weight of a longest trajectory divided by the weight of a shortest non-empty one — under token-mean and "
          "under seq-mean-token-mean. A pair of numbers.",
          kind="predict",
          hints=("token-mean weighs tokens equally, seq-mean-token-mean weighs non-empty trajectories equally. "
                 "The cell above printed the shortest and longest response lengths.",
                 "(T_max / T_min, 1.0): trajectory_weights(loss, mask, mode) for both modes, at the rows with the "
                 "largest and the smallest non-zero response_mask.sum(-1)."),
          rel=1e-6, abs=1e-9, context=("run",), default_run=RUN)
def _e1(run=None) -> tuple[float, float]:
    return weight_ratio(run, "token-mean"), weight_ratio(run, "seq-mean-token-mean")


@exercise("11.2", "Predict, then verify: every token loss ℓ = 1 on the global mini-batch that holds the synthetic "
          "padding rows (the first recorded step). What does seq-mean-token-mean return with the trainer's "
          "B_agg = global_batch_size = ppo_mini_batch_size × rollout.n? (4 decimals)",
          kind="predict",
          hints=("Every non-empty row has a sequence mean of 1 (up to the 1e-8 in its denominator); q_i = 0 removes a "
                 "padding row from the sum — but is it removed from B_agg?",
                 "(number of non-empty rows) / global_batch_size = agg_loss(ones, response_mask, "
                 "'seq-mean-token-mean', global_batch_size={gbs}) on that mini-batch (chapter §10.3–§10.4)."),
          rel=0.0, abs=1e-4, context=("run",), needs=("padding_rows",), case=padding_case, default_run=RUN)
def _e2(run=None) -> float:
    return ones_seq_mean(run)


def step_lengths(run=None, mask: str = "response_mask") -> torch.Tensor:
    """Σ ``mask`` of every real row (padding rows left out) of the first recorded step, float64 — the rows the
    explorer aggregates."""
    from ppolab.numbers import step_tensors

    t = step_tensors(run, None, RUN).tensors
    real = ~t["is_pad"].bool() if "is_pad" in t else torch.ones(t["responses"].shape[0], dtype=torch.bool)
    return t[mask][real].double().sum(-1)


def longest_case(run=None) -> dict:
    """Exercise 11.4: ``k`` — a quarter of the first recorded step's non-empty real rows, at least 1 — and ``n``, that
    row count."""
    from ppolab.run.reader import resolve_run

    n = int((step_lengths(run) > 0).sum())
    if n < 2:
        raise RunLacks("two non-empty trajectories in the first recorded step", resolve_run(run, RUN))
    return {"k": max(1, n // 4), "n": n}


def longest_share(run=None, mode: str = "token-mean", mask: str = "response_mask") -> float:
    """Share of the total weight that the ``k`` longest real trajectories of the first recorded step get under
    ``mode``, with the local counts (every real row, as the explorer): autograd's weights (trajectory_weights)."""
    from ppolab.numbers import step_tensors
    from ppolab.numbers.aggregation import trajectory_weights

    t = step_tensors(run, None, RUN).tensors
    real = ~t["is_pad"].bool() if "is_pad" in t else torch.ones(t["responses"].shape[0], dtype=torch.bool)
    m = t["response_mask"][real].double()
    _, w = trajectory_weights(torch.ones_like(m), m, mode)
    top = step_lengths(run, mask).argsort(descending=True, stable=True)[: longest_case(run)["k"]]
    return (w[top].sum() / w.sum()).item()


@exercise("11.4", "§10.6 on the recorded step: every token loss ℓ = 1 on every real row of the first recorded step "
          "(the explorer's local counts). What share of the total weight do its {k} longest trajectories (of {n} "
          "non-empty ones) get under token-mean, and under seq-mean-token-mean? A pair of shares.",
          kind="compute",
          hints=("token-mean weighs every valid token alike, seq-mean-token-mean every non-empty trajectory alike: "
                 "count tokens for the first, trajectories for the second.",
                 "L = response_mask[real].sum(-1); top = L.argsort(descending=True)[:{k}]: (L[top].sum() / L.sum(), "
                 "{k} / {n}) — or trajectory_weights(ones, response_mask[real], mode) summed over top "
                 "(chapter §10.1, §10.4, §10.6)."),
          rel=1e-6, abs=1e-9, context=("run",), case=longest_case, default_run=RUN)
def _e4(run=None) -> tuple[float, float]:
    return longest_share(run, "token-mean"), longest_share(run, "seq-mean-token-mean")
