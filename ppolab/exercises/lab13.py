"""Lab 13 — micro-batch invariance, checked on the real update (chapter §13, §10.5, §11.5).

Every truth here is a replay of the actor worker's update (what ``PPOTrainer.update_actor`` runs) on recorded
step 1 (``ppolab.replay``), computed when the check runs; replays are cached for the whole process
(``ppolab.numbers.invariance.cached_replay``), so the lab's own cells, the explorer and these checks share them.
"""
from __future__ import annotations

from ppolab.exercises import exercise

SUM_NORM = "seq-mean-token-sum-norm"
#: Relative tolerance of "the same gradient" (as the explorer): gap ≤ TOL · max(1, max |g_ref|).
TOL = 1e-5


def _replays(run, mode: str, factor):
    """(rows of the mini-batch, {micro-batch size: replay}) for every size that divides the mini-batch."""
    from ppolab.replay import replay_rows
    from ppolab.numbers.invariance import cached_replay, divisors

    rows = replay_rows(run)
    return rows, {s: cached_replay(run, loss_agg_mode=mode, loss_scale_factor=factor, micro_batch_size=s)
                  for s in divisors(len(rows))}


def _factor(run) -> int:
    from ppolab.run.reader import resolve_run

    return resolve_run(run).ppo_config().data.max_response_length


def _same(a: dict, ref: dict) -> bool:
    from ppolab.replay import max_abs_diff

    g_max = max(float(g.abs().max()) for g in ref["grads"])
    return max_abs_diff(a["grads"], ref["grads"]) <= TOL * max(1.0, g_max)


@exercise("13.1", "Predict, then verify: recorded step 1's mini-batch, replayed with one row per micro-batch and with "
                  "the whole mini-batch in one micro-batch. Is the gradient the same (within float rounding) "
                  "(a) with token-mean, (b) with seq-mean-token-sum-norm and loss_scale_factor=None? "
                  "Answer (a, b) as two booleans.",
          kind="predict",
          hints=("Ask of each mode: is its denominator a property of the whole mini-batch (counted before the "
                 "micro-batch loop), or of the micro-batch a row lands in?",
                 "token-mean divides by batch_num_tokens of the mini-batch → invariant; sum-norm with "
                 "loss_scale_factor=None divides each micro-batch by B·T_k, T_k its own padded width → not "
                 "(unless every micro-batch keeps the full width)."),
          context=("run",), needs=("step1", "step1_gradient"))
def _e1(run=None) -> tuple[bool, bool]:
    from ppolab.replay import replay_rows
    from ppolab.numbers.invariance import cached_replay

    whole = len(replay_rows(run))
    factor = float(_factor(run))
    out = []
    for mode, f in (("token-mean", factor), (SUM_NORM, None)):
        one, ref = (cached_replay(run, loss_agg_mode=mode, loss_scale_factor=f, micro_batch_size=s) for s in (1, whole))
        out.append(_same(one, ref))
    return tuple(out)


@exercise("13.2", "seq-mean-token-sum-norm, loss_scale_factor=None, micro-batches of 16 rows: each micro-batch is "
                  "trimmed to its own longest response T_k and divides its rows' token sums by B·T_k. At step 1 the "
                  "ratio is 1 on every token, so a token's policy loss is −A. Compute actor/pg_loss of that update "
                  "from the recorded advantages and response mask of the mini-batch's rows (B = number of rows).",
          kind="compute",
          hints=("Split the 64 rows into 4 contiguous micro-batches of 16. For each, T_k is the longest "
                 "response_mask row sum inside it — not the width of the whole mini-batch.",
                 "pg_loss = Σ_k Σ_{i∈k} (−Σ_t A_{i,t} m_{i,t}) / (B · T_k); the replay "
                 "cached_replay(run, loss_agg_mode='seq-mean-token-sum-norm', loss_scale_factor=None, "
                 "micro_batch_size=16)['metrics']['actor/pg_loss'] is the truth."),
          rel=1e-5, abs=1e-7, context=("run",), needs=("step1",))
def _e2(run=None) -> float:
    from ppolab.numbers.invariance import cached_replay

    return float(cached_replay(run, loss_agg_mode=SUM_NORM, loss_scale_factor=None,
                               micro_batch_size=16)["metrics"]["actor/pg_loss"])


@exercise("13.3", "seq-mean-token-sum-norm with loss_scale_factor=None: which fixed micro-batch sizes (divisors of "
                  "the mini-batch) still give the gradient of one whole-mini-batch micro-batch? Answer from the "
                  "response lengths alone (a list of sizes, ascending); the check replays every size.",
          kind="compute",
          hints=("A micro-batch's denominator is B·T_k with T_k its own longest response. When is T_k the same "
                 "as the mini-batch's longest response for every k?",
                 "sizes s for which every contiguous chunk rows[i:i+s] contains a row of the mini-batch's maximal "
                 "response length: all(r_len[i:i+s].max() == r_len.max() for i in range(0, M, s))."),
          context=("run",), needs=("step1", "step1_gradient"))
def _e3(run=None) -> list[int]:
    rows, outs = _replays(run, SUM_NORM, None)
    ref = outs[len(rows)]
    return [s for s, o in outs.items() if _same(o, ref)]


def bnpo_case(run=None) -> dict:
    """Exercise 13.4's split and row: micro-batches of ``micro`` rows on one rank — the smallest size above one with a
    row whose weight tells bnpo apart (not the token mean's, and its micro-batch partners of another length, so that
    one row a micro-batch gives another answer; else one row) — and, of those rows, the one of median weight (not
    the largest or smallest, which the explorer's note prints)."""
    from ppolab.numbers import three_trainers as tt

    d = tt.step_mask(run, 1)
    mask = d["mask"]
    rows = mask.shape[0]
    rule = tt.TRL_RULES["bnpo"]
    lengths = mask.sum(-1)
    for micro in [m for m in range(2, rows) if rows % m == 0] + [1]:
        w = tt.token_weights(mask, rule, tt.Split(micro), d["max_length"]).sum(-1) / lengths.clamp(min=1)
        tokens = lengths.view(-1, micro).sum(-1).repeat_interleave(micro)  # T_k of each row's micro-batch
        # a row whose weight tells the rule apart: not the token mean's 1, not what one row a micro-batch gives
        telling = (lengths > 0) & ((w * mask.sum() - 1).abs() > 1e-6) & ((tokens != lengths * micro) | (micro == 1))
        if telling.any():
            break
    candidates = sorted(range(rows), key=lambda i: (float(w[i]), i))
    candidates = [i for i in candidates if telling[i]]
    row = candidates[len(candidates) // 2]
    return {"micro": micro, "acc": rows // micro, "row": row, "rows": rows}


@exercise("13.4", "Compute — the same tokens in TRL: TRL 1.16's GRPOTrainer with loss_type='bnpo' on one process, "
                  "trained on step 1's first optimizer step ({rows} rows) with per_device_train_batch_size={micro} "
                  "and gradient_accumulation_steps={acc} (rows in order). How many times the token mean's weight "
                  "1/N (N: the optimizer step's loss tokens) does one loss token of row {row} weigh in the "
                  "optimizer step's gradient? Answer w × N, a number.",
          kind="compute",
          hints=("bnpo divides each micro-batch's token-loss sum by that micro-batch's own loss tokens, then by "
                 "gradient_accumulation_steps (trl/trainer/grpo_trainer.py::GRPOTrainer._compute_loss); the "
                 "optimizer sums the accumulated micro-batches.",
                 "m = the step's response_mask (step_mask(run, 1)['mask'] in ppolab.numbers.three_trainers); row "
                 "{row} sits in micro-batch k = {row} // {micro}; answer N / (T_k · {acc}) with N = m.sum() and "
                 "T_k = m[k·{micro}:(k+1)·{micro}].sum()."),
          rel=1e-6, abs=1e-9, context=("run",), needs=("step1", "step1_ragged"), case=bnpo_case)
def _e4(run=None) -> float:
    from ppolab.numbers import three_trainers as tt

    c = bnpo_case(run)
    d = tt.step_mask(run, 1)
    mask = d["mask"]
    w = tt.token_weights(mask, tt.TRL_RULES["bnpo"], tt.Split(c["micro"]), d["max_length"])
    on = mask[c["row"]].bool()
    return float(w[c["row"]][on][0] * mask.sum())
