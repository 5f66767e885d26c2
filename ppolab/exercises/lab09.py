"""Lab 09 — the critic's clipped value loss (chapter §8)."""
from __future__ import annotations

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers.cases import critic_case

#: The lab's run: PPO + GAE whose critic is clipped at ε_v = 0.1, so the value clip binds at every step.
RUN = "ppo_fire_tiny"


def _record(run=None, step: int | None = None):
    from ppolab.numbers import resolve_run, step_tensors

    r = resolve_run(run, RUN)
    return r, step_tensors(r, step, RUN)


def critic_batch(run=None, update: int = 0, step: int | None = None):
    """(vpreds, returns, values, response_mask) of critic optimizer step ``update`` of recorded step ``step`` (default
    the first): its global mini-batch, the rows whose ``critic_vpreds[update]`` are not NaN, as
    ``value_clip_explorer(...).batch`` gives them. vpreds past a micro-batch's own width (NaN in the recording, mask 0)
    hold V_old, so a masked position contributes nothing whatever the arithmetic."""
    _, rec = _record(run, step)
    b = rec.opt_step(update, "critic").batch()
    return b["vpreds"], b["returns"], b["values"], b["response_mask"]


def clipfrac(run=None, update: int = 0, cliprange_value: float | None = None, step: int | None = None) -> float:
    """vf_clipfrac of one critic optimizer step pooled over its global mini-batch (ε_v default: the run's)."""
    r, _ = _record(run, step)
    eps = r.ppo_config().critic.cliprange_value if cliprange_value is None else cliprange_value
    vp, g, v, m = critic_batch(run, update, step)
    return float(algos.compute_value_loss(vp, g, v, m, eps)[1])


def logged_clipfrac(run=None, update: int = 0, cliprange_value: float | None = None,
                    step: int | None = None, max_token_len: int | None = None) -> float:
    """vf_clipfrac of one critic optimizer step as the trainer logs it: every rank computes masked_mean(L2 > L1) on
    each of its micro-batches; the values are averaged over micro-batches, then over ranks (verl
    ``workers/utils/losses.py::value_loss`` returns a float, averaged like every ratio metric; not token-weighted).
    Rank k trains on the k-th contiguous chunk of the balanced batch, cut as the critic engine cuts it: token-budget
    micro-batches of ``critic.ppo_infer_max_token_len_per_gpu`` (verl V1; the top-level micro-batch fields never
    reach the critic, chapter §8 — one micro-batch a rank in the shipped runs), or of ``max_token_len`` when given
    (what the same predictions would log under another budget)."""
    from ppolab.numbers.critic_engine import critic_batching, critic_micro_batches

    r, rec = _record(run, step)
    t = rec.tensors
    cfg = r.ppo_config()
    eps = cfg.critic.cliprange_value if cliprange_value is None else cliprange_value
    budget = critic_batching(cfg).max_token_len if max_token_len is None else max_token_len
    dp = int(rec.info.get("dp_size", 1) or 1)
    vp = t["critic_vpreds"][update]
    per_rank = []
    for k in range(dp):
        shares = []
        for sel in critic_micro_batches(r, update, k, step=rec.step, max_token_len=budget):
            m = t["response_mask"][sel]
            vps = torch.where(m > 0, vp[sel], t["values"][sel])
            shares.append(float(algos.compute_value_loss(vps, t["returns"][sel], t["values"][sel], m, eps)[1]))
        if shares:
            per_rank.append(sum(shares) / len(shares))
    return sum(per_rank) / len(per_rank)


def update_case(run=None) -> dict:
    """Exercises 09.2–09.4's critic optimizer steps: update 3 (or the last when there are fewer), the last one."""
    return critic_case(run, 3, default=RUN)


@exercise("09.2", "Critic optimizer step {update} of the first recorded step, at the run's own ε_v "
          "(critic.cliprange_value): "
          "compute vf_clipfrac yourself from value_clip_terms — the share of valid tokens of its global mini-batch "
          "where (V_clip − G)² > (V_new − G)².",
          kind="compute",
          hints=("value_clip_terms returns V_clip and both squared errors; compare them token by token, then "
                 "average over the response mask.",
                 "masked_mean((err_clip > err_new).float(), response_mask) with "
                 "_, err_new, err_clip, _ = value_clip_terms(vpreds, returns, values, eps_v)."),
          context=("run",), needs=("critic", "critic_updates"), case=update_case, default_run=RUN)
def _e2(run=None) -> float:
    return clipfrac(run, update_case(run)["update"])


@exercise("09.3", "Predict, then verify with the explorer: vf_clipfrac of critic optimizer step {last} (the last) of "
          "the first recorded step, pooled over its global mini-batch, if ε_v were 0.05 instead of the run's {eps_v} "
          "(2 decimals).",
          kind="predict",
          hints=("A narrower window around V_old: can a token that was clipped at ε_v = {eps_v} escape the clip at "
                 "0.05? "
                 "Start from the share at the run's ε_v.",
                 "compute_value_loss(vpreds, returns, values, response_mask, 0.05)[1] on w.batch({last}) — or set "
                 "update {last} and ε_v 0.05 in the explorer and read the summary."),
          rel=0.0, abs=5e-3, context=("run",), needs=("critic", "critic_updates"), case=update_case, default_run=RUN)
def _e3(run=None) -> float:
    return clipfrac(run, update_case(run)["last"], 0.05)


@exercise("09.4", "critic/vf_clipfrac is logged per micro-batch and averaged, not pooled over tokens. For critic "
          "optimizer step {update} of the first recorded step, at the run's ε_v: the value the trainer logged for "
          "that optimizer step — the mean over the {dp} rank(s) of each rank's share, each rank's share the mean over "
          "its micro-batches.",
          kind="compute",
          hints=("Rank k trains on the k-th contiguous half of the balanced batch (rows 0–31 and 32–63); each computes "
                 "masked_mean over its own micro-batch; the logged value is the plain mean of those shares.",
                 "For each rank's rows of w.batch({update})'s row ids (row // 32 == k): masked_mean((err_clip > "
                 "err_new).float(), response_mask); then the mean of the two numbers."),
          rel=1e-6, abs=1e-9, context=("run",), needs=("critic", "critic_updates"), case=update_case,
          default_run=RUN)
def _e4(run=None) -> float:
    return logged_clipfrac(run, update_case(run)["update"])


def first_update_vf_loss(run=None, step: int | None = None, half: bool = True,
                         denominator: str = "loss_mask") -> float:
    """vf_loss of critic optimizer step 0 of recorded step ``step`` from ``values`` and ``returns`` alone (V_new =
    V_old there): ½·Σ (V_old − G)²·response_mask ÷ Σ ``denominator`` over its global mini-batch (the rows whose
    ``critic_vpreds[0]`` are not NaN)."""
    _, rec = _record(run, step)
    t = rec.tensors
    rows = rec.opt_step(0, "critic").rows()
    m = t["response_mask"][rows].double()
    v, g = t["values"][rows].double(), t["returns"][rows].double()
    total = ((v - g).square() * m).sum() / t[denominator][rows].double().sum()
    return float((0.5 if half else 1.0) * total)


def critic_engine_case(run=None) -> dict:
    """Exercise 09.5's critic optimizer step (update 3, or the last), rank 0's rows and tokens, the budgets."""
    from ppolab.numbers.critic_engine import critic_engine_case as find_case

    return find_case(run, 3)


def v1_micro_batches(run=None, micro: int = 2, budget: int | None = None) -> tuple[int, float]:
    """(how many micro-batches rank 0 runs in exercise 09.5's critic optimizer step once
    ``critic.ppo_micro_batch_size_per_gpu={micro}`` is added to the run's config, the vf_clipfrac logged for that
    optimizer step had ``+critic.ppo_infer_max_token_len_per_gpu`` been ``budget`` — default the smallest one)."""
    from ppolab.numbers.critic_engine import critic_micro_batches

    c = critic_engine_case(run)
    budget = c["small"] if budget is None else budget
    n = len(critic_micro_batches(run, c["update"], 0, [f"critic.ppo_micro_batch_size_per_gpu={micro}"]))
    return n, logged_clipfrac(run, c["update"], max_token_len=budget)


@exercise("09.5", "Critic optimizer step {update} of the first recorded step; rank 0 holds {rows} of its rows, "
          "{tokens} attended tokens (prompt + response). (a) Add critic.ppo_micro_batch_size_per_gpu={micro} to the "
          "run's config: into how many micro-batches does the critic engine cut rank 0's rows? (b) Instead set "
          "+critic.ppo_infer_max_token_len_per_gpu={small}: the vf_clipfrac the trainer would log for that optimizer "
          "step (the same predictions, cut by that budget). A pair (count, share).",
          kind="compute",
          hints=("verl V1 hands the critic engine one key, critic.ppo_infer_max_token_len_per_gpu (here {budget}); "
                 "which of the two settings reaches it? The logged share is a mean over each rank's micro-batches.",
                 "(a) len(critic_micro_batches(RUN, {update}, 0, ['critic.ppo_micro_batch_size_per_gpu={micro}'])) — "
                 "the field is ignored, so as many as at the run's budget; (b) for each rank k, "
                 "critic_micro_batches(RUN, {update}, k, max_token_len={small}), masked_mean(L2 > L1) on each, the "
                 "mean over the micro-batches, then over the ranks (chapter §8, §11.6)."),
          rel=1e-6, abs=1e-9, context=("run",), needs=("critic",), case=critic_engine_case, default_run=RUN)
def _e5(run=None) -> tuple[int, float]:
    return v1_micro_batches(run)


def window_case(run=None) -> dict:
    """Exercise 09.6's critic optimizer step: update 1 (the first after a gradient step), or the last."""
    from ppolab.numbers.critic_engine import window_case as find_case

    return find_case(run, 1)


def window_counts(run=None, update: int | None = None, mask: str = "response_mask", strict: bool = True
                  ) -> tuple[int, int]:
    """(tokens whose V_new left [V_old − ε_v, V_old + ε_v], tokens where (V_clip − G)² > (V_new − G)²) over the
    ``mask`` tokens of critic optimizer step ``update``'s global mini-batch (first recorded step, run's ε_v)."""
    r, rec = _record(run)
    t = rec.tensors
    update = window_case(r)["update"] if update is None else update
    eps = r.ppo_config().critic.cliprange_value
    vp = t["critic_vpreds"][update]
    rows = rec.opt_step(update, "critic").rows()
    keep = t[mask][rows] > 0
    v, g = t["values"][rows], t["returns"][rows]
    vpred = torch.where(t["response_mask"][rows] > 0, vp[rows], v)
    v_clip, err_new, err_clip, _ = algos.value_clip_terms(vpred, g, v, eps)
    left = (v_clip != vpred) & keep
    clipped = ((err_clip > err_new) if strict else (err_clip >= err_new)) & keep
    return int(left.sum()), int(clipped.sum())


@exercise("09.6", "Critic optimizer step {update} of the first recorded step (after one gradient step of the "
          "critic), at the run's ε_v = {eps_v}, over the tokens with response_mask 1 of its global mini-batch: how "
          "many predictions V_new left the window [V_old − ε_v, V_old + ε_v], and on how many tokens is the clipped "
          "error the larger one, (V_clip − G)² > (V_new − G)²? A pair of counts.",
          kind="compute",
          hints=("Leaving the window is not the same as being clipped: a prediction that left it away from the target "
                 "keeps the larger unclipped error and keeps training.",
                 "v_clip, err_new, err_clip, _ = value_clip_terms(vpreds, returns, values, eps_v) on "
                 "w.batch({update}); ((v_clip != vpreds) & m).sum() and ((err_clip > err_new) & m).sum() with "
                 "m = response_mask > 0 (chapter §8)."),
          context=("run",), needs=("critic", "critic_updates"), case=window_case, default_run=RUN)
def _e6(run=None) -> tuple[int, int]:
    return window_counts(run)


@exercise("09.7", "The vf_loss of critic optimizer step 0 of the first recorded step (token-mean, as the engine "
          "normalises it), computed from `values` and `returns` only — no vpreds.",
          kind="compute",
          hints=("At update 0 the critic still is the critic that wrote `values`: V_new = V_old, so the clip changes "
                 "nothing and the loss is plain regression of V_old onto G. Mind the ½ and the engine's denominator.",
                 "½ · Σ (values − returns)²·response_mask ÷ Σ loss_mask over the rows of update 0 (those with "
                 "critic_vpreds[0] not NaN) — compute_value_loss(values, returns, values, response_mask, eps_v, "
                 "batch_num_tokens=loss_mask.sum())[0] (chapter §8, §9)."),
          rel=1e-5, abs=1e-9, context=("run",), needs=("critic",), default_run=RUN)
def _e7(run=None) -> float:
    # float32 recorded tensors; a learner may compute in float32 or float64: agreement to ~1e-7 relative
    return first_update_vf_loss(run)


def far_token_case(run=None) -> dict:
    """Exercise 09.1's token: in critic optimizer step ``update`` (:func:`update_case`) of the first recorded step, the
    valid response token whose new value prediction moved furthest from V_old (a row of the recorded batch)."""
    from ppolab.numbers import resolve_run

    c = update_case(run)
    _, rec = _record(run)
    t = rec.tensors
    vp = t["critic_vpreds"][c["update"]]
    valid = (t["response_mask"] > 0) & ~torch.isnan(vp)
    moved = torch.where(valid, (vp - t["values"]).abs(), torch.full_like(vp, -1.0))
    row, pos = divmod(int(moved.flatten().argmax()), moved.shape[1])
    return {**c, "row": row, "pos": pos, "eps_v": resolve_run(run, RUN).ppo_config().critic.cliprange_value}


@exercise("09.1", "One token of the critic's update: critic optimizer step {update} of the first recorded step, row "
          "{row}, position {pos} (a row of the recorded batch) — the valid token whose new prediction V_new "
          "(critic_vpreds[{update}]) moved furthest from V_old (values). The value loss compute_value_loss returns "
          "for that single token (token-mean) at the run's ε_v = {eps_v}, with G its recorded return.",
          kind="compute",
          hints=("Read V_new, V_old and G of that token. First clip V_new into [V_old − ε_v, V_old + ε_v]; then "
                 "compare the two squared errors — the loss keeps the larger.",
                 "L_V = ½·max((V_new − G)², (clip(V_new, V_old − {eps_v}, V_old + {eps_v}) − G)²) (chapter §8); "
                 "compute_value_loss(vpreds, returns, values, mask, {eps_v})[0] on one-token tensors gives it."),
          rel=1e-5, abs=1e-9, context=("run",), needs=("critic", "critic_updates"), case=far_token_case,
          default_run=RUN)
def _e1(run=None) -> float:
    c = far_token_case(run)
    _, rec = _record(run)
    t = rec.tensors
    one = (slice(c["row"], c["row"] + 1), slice(c["pos"], c["pos"] + 1))
    vp = t["critic_vpreds"][c["update"]][one]
    return algos.compute_value_loss(vp, t["returns"][one], t["values"][one], torch.ones_like(vp),
                                    cliprange_value=c["eps_v"])[0].item()


# ------------------------------------------------------------------ the critic's update, replayed (§1, §8)
#: Exercise 09.8 asks at the first critic optimizer step where the value clip binds on at least this many tokens.
MIN_CLIPPED = 10


def clipped_move_case(run=None) -> dict:
    """Exercise 09.8's critic optimizer step: the first of recorded step 1's critic update where the value clip binds
    on at least :data:`MIN_CLIPPED` tokens (else the one where it binds on most), read off the recorded predictions
    (``critic_vpreds[k]``: what the replay predicts before step k, to float rounding) so that only the steps up to it
    are replayed; the count the prompt names is the replay's own. A run whose clip binds on no token there lacks it."""
    from ppolab.numbers import resolve_run
    from ppolab.numbers.critic_effect import critic_step_effect
    from ppolab.numbers.needs import RunLacks

    r = resolve_run(run, RUN)
    rec = r.step(1) if 1 in r.steps else None
    eps = r.ppo_config().critic.cliprange_value
    counts = []
    for k in range(len(rec.plan("critic").steps) if rec is not None and "critic_vpreds" in rec.tensors else 0):
        b = rec.opt_step(k, "critic").batch()
        v_clip, err_new, err_clip, _ = algos.value_clip_terms(b["vpreds"], b["returns"], b["values"], eps)
        counts.append(int(((err_clip > err_new) & (b["response_mask"] > 0)).sum()))
    if not counts or not max(counts):
        raise RunLacks("a critic optimizer step of step 1 where the value clip binds (the clipped error the larger on "
                       "some token)", r)
    k = next((i for i, n in enumerate(counts) if n >= MIN_CLIPPED), counts.index(max(counts)))
    return {"step": 1, "update": k, "n_clipped": int(critic_step_effect(r, 1, k)["clipped"].sum()), "eps_v": eps}


@exercise("09.8", "The critic's update of recorded step 1, replayed: at critic optimizer step {update} the value clip "
          "binds on {n_clipped} tokens — their clipped error (V_clip − G)² is the larger, a constant in V_new, so "
          "their own gradient is 0. By how much did the largest of them move anyway? max |V_after − V_before| over "
          "those tokens.",
          kind="compute",
          hints=("No gradient flows from a clipped token's loss — but its V comes from the same adapter and value head "
                 "every other token of the mini-batch pushed. Compare each clipped token's value after the step with "
                 "its value before it.",
                 "e = critic_step_effect(RUN, 1, {update}); (e['values_after'] − e['values_before'])[e['clipped']]"
                 ".abs().max() (chapter §1, §8)."),
          rel=1e-3, abs=1e-6, context=("run",), needs=("critic",), case=clipped_move_case, default_run=RUN)
def _e8(run=None) -> float:
    from ppolab.numbers.critic_effect import critic_step_effect

    e = critic_step_effect(run if run is not None else RUN, 1, clipped_move_case(run)["update"])
    return float((e["values_after"] - e["values_before"])[e["clipped"]].abs().max())
