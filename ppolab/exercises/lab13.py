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
