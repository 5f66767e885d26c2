"""Lab 10 — how response_mask reaches the loss (chapter §9)."""
from __future__ import annotations

import math

import torch

from ppolab import algos
from ppolab.exercises import exercise


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


def short_row_case(run=None) -> dict:
    """Exercise 10.6's row: the first real row of the first recorded step whose last sampled token (loss_mask 1)
    sits before the padded width's last column (else the first real row with a sampled token)."""
    from ppolab.numbers import RunLacks, real_rows

    rec = _record(run)
    m = rec.tensors["loss_mask"] if "loss_mask" in rec.tensors else rec.tensors["response_mask"]
    rows = [i for i in range(m.shape[0]) if bool(real_rows(rec)[i]) and bool(m[i].any())]
    if not rows:
        raise RunLacks("a real row with a sampled response token", None)
    short = [i for i in rows if int(torch.nonzero(m[i]).max()) < m.shape[1] - 1]
    return {"row": (short or rows)[0]}


@exercise("10.6", "The one-token shift on row {row} of the first recorded step: the logits at which positions of the "
          "concatenated sequence prompt ‖ response (0-based) score its first and its last sampled response tokens "
          "(loss_mask 1)? Answer (first, last).",
          kind="compute",
          hints=("Position t of a causal LM predicts the token at t + 1, and response token j sits at position P + j "
                 "(P the padded prompt width). Which j are the row's first and last sampled tokens? Responses are "
                 "right-padded, so its last is not the last column.",
                 "j = torch.nonzero(t['loss_mask'][{row}]).flatten(); answer (P − 1 + j.min(), P − 1 + j.max()) with "
                 "P = t['prompts'].shape[1] — shift_table(rec, tokenizer, {row})['logit position'] lists them."),
          context=("run",), needs=("steps",), case=short_row_case, default_run=RUN)
def _e6(run=None) -> tuple[int, int]:
    from ppolab.numbers.masks import run_tokenizer, shift_table
    from ppolab.run.reader import resolve_run

    rec = _record(run)
    row = short_row_case(run)["row"]
    table = shift_table(rec, run_tokenizer(resolve_run(run, RUN)), row)
    keep = table["loss_mask"] if table["loss_mask"][0] is not None else table["response_mask"]  # as the case reads
    sampled = [pos for pos, k in zip(table["logit position"], keep) if k]
    return sampled[0], sampled[-1]


@exercise("10.1", "A NaN sits at a masked position (mask 0) of a token-loss matrix. For which of the five "
          "loss_agg_modes is the aggregated loss NaN? A set of mode names.",
          kind="lookup",
          hints=("masked_sum replaces masked positions by 0 before it multiplies; which modes call masked_sum, and "
                 "which multiply loss_mat * loss_mask themselves? What is NaN · 0?",
                 "token-mean and token-sum use masked_sum (torch.where, then × mask); the seq-mean-* modes compute "
                 "torch.sum(loss_mat * loss_mask, dim=-1), and NaN·0 = NaN (verl core_algos.py::agg_loss). Run "
                 "agg_loss on such a matrix for every mode in LOSS_AGG_MODES."))
def _e1() -> set[str]:
    loss, mask = nan_loss_and_mask()
    return {mode for mode in algos.LOSS_AGG_MODES if torch.isnan(algos.agg_loss(loss, mask, mode)).item()}


def padding_case(run=None) -> dict:
    """Exercise 10.2's batch arithmetic, read off the run's config: prompts, n, ranks, mini-batch sizes."""
    from ppolab.run.reader import resolve_run

    r = resolve_run(run, RUN)
    c = r.ppo_config()
    n = c.actor_rollout_ref.rollout.n
    return {"tb": c.data.train_batch_size, "n": n, "dp": int(_record(r).info.get("dp_size", 1) or 1),
            "mini": c.actor_rollout_ref.actor.ppo_mini_batch_size,
            "mini_n": c.actor_rollout_ref.actor.ppo_mini_batch_size * n,
            "critic_n": (c.critic.ppo_mini_batch_size * n) if c.use_critic else "—"}


@exercise("10.2", "Predict, then verify: data.train_batch_size {tb} prompts × rollout.n {n}, trained on {dp} ranks "
          "with "
          "ppo_mini_batch_size {mini} (actor and critic). How many synthetic padding rows (is_pad) does a step of this "
          "run hold?",
          kind="predict",
          hints=("balance_batch pads the batch so it divides evenly among the ranks AND into mini-batches of mini × n "
                 "rows (of the actor, and of the critic when there is one).",
                 "pad to the next multiple of lcm(dp_size, actor mini × n, critic mini × n) = lcm({dp}, {mini_n}, "
                 "{critic_n}): int(is_pad.sum()) — or batch_plan['padding_rows'] (verl padding_utils.py, chapter §9)."),
          context=("run",), needs=("padding_rows",), case=padding_case, default_run=RUN)
def _e2(run=None) -> int:
    return int(_record(run).tensors["is_pad"].sum())


def rejection_what_if_case(run=None) -> dict:
    """Exercise 10.3's what-if threshold: ``token_k1`` alone at a ratio bound T chosen on the run's own first
    recorded step — the 85th percentile of its sampled tokens' max(π_old/π_rollout, π_rollout/π_old), rounded up to 3
    decimals, moved up by 0.001 while a token's ratio lies within 1e-6 of a bound (a rounding there would decide)."""
    from ppolab.run.reader import resolve_run

    rec = _record(run)
    t = rec.tensors
    lr = (t["old_log_probs"] - t["rollout_log_probs"])[t["loss_mask"].bool()].double()
    bound = math.ceil(float(torch.quantile(lr.abs(), 0.85).exp()) * 1000) / 1000
    bound = max(bound, 1.001)
    while bool(((lr.abs() - math.log(bound)).abs() < 1e-6).any()):
        bound = round(bound + 0.001, 3)
    corr = resolve_run(run, RUN).ppo_config().algorithm.rollout_correction
    return {"step": rec.step, "threshold": f"{bound:.3f}", "run_rs": corr.rollout_rs,
            "run_threshold": corr.rollout_rs_threshold}


@exercise("10.3", "A what-if: had algorithm.rollout_correction.rollout_rs been token_k1 alone at rollout_rs_threshold "
          "= {threshold} (the run: {run_rs} at {run_threshold}), how many sampled tokens of recorded step {step} "
          "would rejection sampling have zeroed in response_mask?",
          kind="compute",
          hints=("token_k1 tests each sampled token (loss_mask 1, the mask as generated) on its own: it is kept when "
                 "1/T ≤ π_rollout/π_old ≤ T, compared in log space on the recorded old_log_probs and "
                 "rollout_log_probs; a rejected token leaves response_mask and stays in loss_mask.",
                 "lr = old_log_probs − rollout_log_probs; k1 = −lr; kept = (k1 >= −log T) & (k1 <= log T); "
                 "int((loss_mask.bool() & ~kept).sum()) (verl rollout_corr_helper.py::"
                 "compute_rollout_rejection_mask)."),
          context=("run",), needs=("rejection",), case=rejection_what_if_case, default_run=RUN)
def _e3(run=None) -> int:
    t = _record(run).tensors
    threshold = rejection_what_if_case(run)["threshold"]
    kept, _ = algos.rollout_rejection_mask(t["old_log_probs"], t["rollout_log_probs"], t["loss_mask"], "token_k1",
                                           threshold)
    return int((t["loss_mask"].bool() & ~kept.bool()).sum())


def after_rejected(run=None, include_self: bool = False) -> torch.Tensor:
    """(N, R) bool: positions of the first recorded step that come after a rejected token of their row (or are one,
    with ``include_self``) — the positions whose prefix would change if a forward attended with ``response_mask``."""
    rej = rejected_tokens(run).long()
    before = rej.cumsum(-1) if include_self else rej.cumsum(-1) - rej
    return before > 0


@exercise("10.4", "Predict, then verify: had the update's forward attended with the rewritten response_mask instead "
          "of response_attention_mask, the tokens after a rejected token would read another prefix. How many sampled "
          "tokens (loss_mask 1) of the first recorded step come after a rejected token in their row?",
          kind="predict",
          hints=("A rejected token changes the prefix of every later token of its own row — rejected or not — and of "
                 "no other row; padding after the response is not sampled.",
                 "rejected = loss_mask.bool() & ~response_mask.bool(); after = (rejected.long().cumsum(-1) − "
                 "rejected.long()) > 0; int((after & loss_mask.bool()).sum()) (chapter §9)."),
          context=("run",), needs=("rejection",), default_run=RUN)
def _e4(run=None) -> int:
    t = _record(run).tensors
    return int((after_rejected(run) & t["loss_mask"].bool()).sum())


def masks_row_case(run=None) -> dict:
    """Exercise 10.5's row: the row of the first recorded step with the most tokens attended but outside
    ``response_mask`` (rejected tokens, tool observations), the first on a tie; row 0 where no mask differs."""
    t = _record(run).tensors
    gap = (attended(run).bool() & ~t["response_mask"].bool()).sum(-1)
    return {"row": int(gap.argmax()) if int(gap.max()) > 0 else 0}


def attended(run=None) -> torch.Tensor:
    """(N, R): the response positions every forward pass attends to — ``response_attention_mask`` where the run
    recorded it (it differs from ``response_mask``), else ``response_mask``
    (``ppolab.batch.Batch.response_attention``)."""
    from ppolab.batch import Batch

    t = _record(run).tensors
    keys = ("response_mask",) + (("response_attention_mask",) if "response_attention_mask" in t else ())
    return Batch({k: t[k] for k in keys}).response_attention()


def three_masks(run=None, row: int | None = None) -> tuple[int, int, int]:
    """(attended positions of the whole sequence — prompt and response —, numerator tokens, token-mean denominator
    tokens) of ``row`` (default: :func:`masks_row_case`'s)."""
    t = _record(run).tensors
    row = masks_row_case(run)["row"] if row is None else row
    return (int(t["prompt_mask"][row].sum()) + int(attended(run)[row].sum()), int(t["response_mask"][row].sum()),
            int(t["loss_mask"][row].sum()))


@exercise("10.5", "Row {row} of the first recorded step: (a) how many positions of its whole sequence — prompt and "
          "response — does every forward pass attend to, and of its response tokens, how many (b) enter the "
          "numerator of every loss, (c) count in token-mean's denominator (the engine's batch_num_tokens)? A triple "
          "of counts.",
          kind="compute",
          hints=("Three masks, three jobs (the table \"Three masks\"): the attention mask (prompt_mask, then "
                 "response_attention_mask), response_mask, loss_mask. Rejection rewrites only one of them; a tool "
                 "observation is 0 in two; the prompt is attended but never in a loss.",
                 "(int(prompt_mask[{row}].sum() + response_attention_mask[{row}].sum()), "
                 "int(response_mask[{row}].sum()), int(loss_mask[{row}].sum())) — where the run recorded no "
                 "response_attention_mask, it equals response_mask (chapter §9)."),
          context=("run",), case=masks_row_case, default_run=RUN)
def _e5(run=None) -> tuple[int, int, int]:
    return three_masks(run)
