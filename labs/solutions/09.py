"""Solutions to lab 09's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab.algos import compute_value_loss, masked_mean, value_clip_terms
from ppolab.exercises.lab09 import critic_batch, logged_clipfrac
from ppolab.widgets import value_clip_explorer
from ppolab.widgets.common import resolve_run

RUN = "ppo_fire_tiny"


def eps_v(run=None):
    return resolve_run(run or RUN).config["critic"]["cliprange_value"]


def my_clipfrac(run=None, update=3, eps=None, strict=True):
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


def per_rank_mean(run=None, update=3):
    """What a learner writes with the explorer's batch: split the mini-batch by rank, average the two shares."""
    w = value_clip_explorer(run or RUN)
    vp, g, v, mask, row_ids = w.batch(update)
    half = w.record.tensors["responses"].shape[0] // 2
    shares = []
    for k in (0, 1):
        sel = (row_ids // half) == k
        _, e_new, e_clip, _ = value_clip_terms(vp[sel], g[sel], v[sel], eps_v(run))
        shares.append(masked_mean((e_clip > e_new).float(), mask[sel]).item())
    return sum(shares) / 2


SOLUTIONS = {
    "09.1": 0.5 * max((0.1 - 0.0) ** 2, (0.3 - 0.0) ** 2),
    "09.2": my_clipfrac,
    "09.3": lambda run=None: round(my_clipfrac(run, 15, 0.05), 2),
    "09.4": per_rank_mean,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the unclipped error; no ½; the clip towards the wrong bound (0.7)
    "09.1": [0.5 * 0.1 ** 2, 0.3 ** 2, 0.5 * 0.7 ** 2],
    # ≥ instead of > (counts untouched tokens, where both errors are equal); verl's default ε_v 0.5; another update
    "09.2": [lambda run=None: my_clipfrac(run, 3, strict=False), lambda run=None: my_clipfrac(run, 3, 0.5),
             lambda run=None: my_clipfrac(run, 2)],
    # the share at the run's ε_v (as if the window did not matter); a wider window; the vf_loss instead of the share
    "09.3": [lambda run=None: my_clipfrac(run, 15), lambda run=None: my_clipfrac(run, 15, 0.2),
             lambda run=None: float(compute_value_loss(*critic_batch(run, 15), 0.05)[0])],
    # the share pooled over the whole global mini-batch (token-weighted); one rank only; another update
    "09.4": [lambda run=None: my_clipfrac(run, 3), rank_share, lambda run=None: rank_share(run, 3, 1),
             lambda run=None: logged_clipfrac(run, 2)],
}
