"""Solutions to lab 09's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import torch

from ppolab.algos import compute_value_loss, masked_mean, value_clip_terms
from ppolab.exercises.lab09 import (critic_batch, critic_engine_case, far_token_case, first_update_vf_loss,
                                    logged_clipfrac, update_case, window_case, window_counts)
from ppolab.numbers.critic_engine import critic_micro_batches
from ppolab.widgets import value_clip_explorer
from ppolab.run.reader import resolve_run

RUN = "ppo_fire_tiny"


def eps_v(run=None):
    return resolve_run(run or RUN).config["critic"]["cliprange_value"]


def _last(run=None):  # the last critic optimizer step of the first recorded step
    return update_case(run)["last"]


def my_clipfrac(run=None, update=None, eps=None, strict=True):
    update = update_case(run)["update"] if update is None else update
    vp, g, v, mask = critic_batch(run, update)
    _, e_new, e_clip, _ = value_clip_terms(vp, g, v, eps_v(run) if eps is None else eps)
    hit = e_clip > e_new if strict else e_clip >= e_new
    return masked_mean(hit.float(), mask).item()


def rank_share(run=None, update=3, rank=0):
    w = value_clip_explorer(run or RUN)
    vp, g, v, mask, row_ids = w.batch(update)
    sel = (row_ids // (w.record.tensors["responses"].shape[0] // 2)) == rank
    _, e_new, e_clip, _ = value_clip_terms(vp[sel], g[sel], v[sel], eps_v(run))
    return masked_mean((e_clip > e_new).float(), mask[sel]).item()


def per_rank_mean(run=None, update=None):
    """What a learner writes with the explorer's batch: split the mini-batch by rank, average the ranks' shares
    (one micro-batch per rank, as in ppo_fire_tiny)."""
    c = update_case(run)
    update = c["update"] if update is None else update
    w = value_clip_explorer(run or RUN)
    vp, g, v, mask, row_ids = w.batch(update)
    chunk = w.record.tensors["responses"].shape[0] // c["dp"]
    shares = []
    for k in range(c["dp"]):
        sel = (row_ids // chunk) == k
        _, e_new, e_clip, _ = value_clip_terms(vp[sel], g[sel], v[sel], eps_v(run))
        shares.append(masked_mean((e_clip > e_new).float(), mask[sel]).item())
    return sum(shares) / len(shares)


def token_value_loss(run=None, mistake=None):
    """09.1 as a learner writes it: the token's V_new, V_old and G, the clip, the larger squared error, halved."""
    c = far_token_case(run)
    t = resolve_run(run or RUN).step(resolve_run(run or RUN).steps[0]).tensors
    v_new = float(t["critic_vpreds"][c["update"]][c["row"], c["pos"]])
    v_old, g = float(t["values"][c["row"], c["pos"]]), float(t["returns"][c["row"], c["pos"]])
    v_clip = min(max(v_new, v_old - c["eps_v"]), v_old + c["eps_v"])
    if mistake == "unclipped":                    # the clip forgotten
        return 0.5 * (v_new - g) ** 2
    if mistake == "min":                          # the smaller error kept, as if the clip protected the critic
        return 0.5 * min((v_new - g) ** 2, (v_clip - g) ** 2)
    if mistake == "no_half":
        return max((v_new - g) ** 2, (v_clip - g) ** 2)
    return 0.5 * max((v_new - g) ** 2, (v_clip - g) ** 2)


SOLUTIONS = {
    "09.1": token_value_loss,
    "09.2": my_clipfrac,
    "09.3": lambda run=None: round(my_clipfrac(run, update_case(run)["last"], 0.05), 2),
    "09.4": per_rank_mean,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the unclipped error; the smaller error instead of the larger; no ½; the old stated-number answer
    "09.1": [lambda run=None: token_value_loss(run, "unclipped"), lambda run=None: token_value_loss(run, "min"),
             lambda run=None: token_value_loss(run, "no_half"), 0.5 * 0.3 ** 2],
    # ≥ instead of > (counts untouched tokens, where both errors are equal); verl's default ε_v 0.5; another update
    "09.2": [lambda run=None: my_clipfrac(run, strict=False), lambda run=None: my_clipfrac(run, eps=0.5),
             lambda run=None: my_clipfrac(run, 2)],
    # the share at the run's ε_v (as if the window did not matter); a wider window; the vf_loss instead of the share
    "09.3": [lambda run=None: my_clipfrac(run, _last(run)), lambda run=None: my_clipfrac(run, _last(run), 0.2),
             lambda run=None: float(compute_value_loss(*critic_batch(run, _last(run)), 0.05)[0])],
    # the share pooled over the whole global mini-batch (token-weighted); one rank only; another update
    "09.4": [lambda run=None: my_clipfrac(run), rank_share, lambda run=None: rank_share(run, 3, 1),
             lambda run=None: logged_clipfrac(run, 2)],
}


def first_vf_loss(run=None):
    """What a learner writes: update 0's rows, V_new = V_old, ½·Σ(V_old − G)²·m ÷ Σ loss_mask."""
    t = resolve_run(run or RUN).step(resolve_run(run or RUN).steps[0]).tensors
    rows = ~t["critic_vpreds"][0].isnan().all(-1)
    v, g, m = t["values"][rows], t["returns"][rows], t["response_mask"][rows]
    return compute_value_loss(v, g, v, m, eps_v(run), batch_num_tokens=t["loss_mask"][rows].sum())[0].item()


SOLUTIONS["09.7"] = first_vf_loss
# no ½; the rejection-rewritten response_mask as denominator (re-normalised over the survivors); the step's logged
# vf_loss (the mean over its 16 updates)
WRONG["09.7"] = [lambda run=None: first_update_vf_loss(run, half=False),
                 lambda run=None: first_update_vf_loss(run, denominator="response_mask"),
                 lambda run=None: float(resolve_run(run or RUN).metrics.loc[1, "critic/vf_loss"])]


def v1_pair(run=None):
    """What a learner writes: (a) the critic engine's cut with the micro-batch field added; (b) per rank, per
    micro-batch at the small budget, masked_mean(L2 > L1), averaged over micro-batches, then over ranks."""
    c = critic_engine_case(run)
    n = len(critic_micro_batches(run, c["update"], 0, [f"critic.ppo_micro_batch_size_per_gpu={c['micro']}"]))
    t = resolve_run(run or RUN).step(resolve_run(run or RUN).steps[0]).tensors
    vp = t["critic_vpreds"][c["update"]]
    per_rank = []
    for k in range(c["dp"]):
        shares = []
        for sel in critic_micro_batches(run, c["update"], k, max_token_len=c["small"]):
            m = t["response_mask"][sel]
            vps = torch.where(m > 0, vp[sel], t["values"][sel])
            _, e_new, e_clip, _ = value_clip_terms(vps, t["returns"][sel], t["values"][sel], eps_v(run))
            shares.append(masked_mean((e_clip > e_new).float(), m).item())
        if shares:
            per_rank.append(sum(shares) / len(shares))
    return n, sum(per_rank) / len(per_rank)


def legacy_count(run=None):
    """The legacy reading: rank 0's rows cut into fixed micro-batches of the field's size."""
    c = critic_engine_case(run)
    return -(-c["rows"] // c["micro"])


SOLUTIONS["09.5"] = v1_pair
# the legacy reading of the micro field, with the share at the run's budget (exercise 09.4's); the field honoured and
# (b) right; (a) right and the share of 09.4 (the budget ignored); the share pooled over the mini-batch's tokens
WRONG["09.5"] = [lambda run=None: (legacy_count(run), logged_clipfrac(run, critic_engine_case(run)["update"])),
                 lambda run=None: (legacy_count(run), v1_pair(run)[1]),
                 lambda run=None: (v1_pair(run)[0], logged_clipfrac(run, critic_engine_case(run)["update"])),
                 lambda run=None: (v1_pair(run)[0], my_clipfrac(run, critic_engine_case(run)["update"]))]


def window_pair(run=None):
    """What a learner writes with the mini-batch of window_case's update."""
    u = window_case(run)["update"]
    vp, g, v, mask = critic_batch(run, u)
    v_clip, e_new, e_clip, _ = value_clip_terms(vp, g, v, eps_v(run))
    m = mask > 0
    return int(((v_clip != vp) & m).sum()), int(((e_clip > e_new) & m).sum())


SOLUTIONS["09.6"] = window_pair
# every token that left the window is clipped; update 0's answer (the text above: nothing moves); >= counts every
# untouched token as clipped; the pair swapped
WRONG["09.6"] = [lambda run=None: (window_pair(run)[0], window_pair(run)[0]), (0, 0),
                 lambda run=None: window_counts(run, strict=False), lambda run=None: window_pair(run)[::-1]]


def clipped_move(run=None, over="clipped"):
    """The largest move of a value-clipped token at 09.8's critic optimizer step (``over``: which tokens)."""
    from ppolab.exercises.lab09 import RUN, clipped_move_case
    from ppolab.numbers.critic_effect import critic_step_effect

    e = critic_step_effect(run if run is not None else RUN, 1, clipped_move_case(run)["update"])
    moved = (e["values_after"] - e["values_before"]).abs()
    keep = {"clipped": e["clipped"], "all": e["mask"] > 0, "free": (e["mask"] > 0) & ~e["clipped"]}[over]
    return float(torch.nan_to_num(moved)[keep].max())


SOLUTIONS["09.8"] = clipped_move
# a clipped token "does not move"; the largest move of any token; of the tokens the clip left free
WRONG["09.8"] = [0.0, lambda run=None: clipped_move(run, "all"), lambda run=None: clipped_move(run, "free")]
