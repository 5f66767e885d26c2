"""Solutions to lab 15's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import statistics

import torch

from ppolab.exercises.lab15 import POLICY_KNOBS, REGULARISER_KNOBS
from ppolab.run.reader import resolve_run


def zero_advantage_share(run=None, per_token=False):
    r = resolve_run(run)
    t = r.step(r.steps[-1]).tensors
    mask = t["response_mask"].bool()
    real = ~t["is_pad"].bool() & mask.any(-1)  # real trajectories with at least one token in the loss
    if per_token:  # the share of tokens, not of trajectories
        return float((t["advantages"][real][mask[real]] == 0).float().mean())
    zero = ((t["advantages"] != 0) & mask).sum(-1) == 0
    return round(float(zero[real].float().mean()), 3)


def lone_correct(unbiased=True, normalise=True, n=5):
    scores = torch.zeros(n, dtype=torch.float64)
    scores[0] = 1.0
    centred = scores[0] - scores.mean()
    return float(centred / (scores.std(unbiased=unbiased) + 1e-6)) if normalise else float(centred)


def _verdicts(base=None, knobs=(), paired=True):
    """The learner's reading of the curves: on each seed, the mean over steps 2… under the knob minus its own base's;
    "up" when every seed's difference is above 0 and their mean exceeds their spread (``paired=False``: the seeds'
    means compared as two unpaired groups instead — "up" only when the ranges do not overlap —, which loses a small
    effect in the noise between seeds)."""
    from ppolab.experiments import ablations

    r = base if base is not None else "grpo_tiny"
    runs = ablations.ablation_runs(r, knobs)  # leaves out the knobs the run cannot take

    def means(rs, metric):
        return [statistics.fmean(ablations.curve(x, metric)[1:]) for x in rs]

    out = {}
    for k in (k for k in runs if k in ablations.KNOBS):
        metric = ablations.KNOBS[k].metric
        mine, theirs = means(runs[k], metric), means(runs.get(f"{k}.base", runs["base"]), metric)
        if paired:
            d = [a - b for a, b in zip(mine, theirs)]
            spread = max(d) - min(d)
            up, down = min(d) > 0 and statistics.fmean(d) > spread, max(d) < 0 and -statistics.fmean(d) > spread
        else:
            up, down = min(mine) > max(theirs), max(mine) < min(theirs)
        out[k] = "up" if up else "down" if down else "flat"
    return out


def _flipped(verdicts):
    return {k: {"up": "down", "down": "up"}.get(v, "up") for k, v in verdicts.items()}


def kl_over_pg(run=None, coef=True, reducer="median", half=True):
    m = resolve_run(run).metrics
    m = m[m["training/global_step"].notna()]
    part = m.iloc[len(m) // 2:] if half else m
    kl = part["actor/kl_coef"] * part["actor/kl_loss"] if coef else part["actor/kl_loss"]
    pg = part["actor/pg_loss"].abs()
    return float(getattr(kl, reducer)() / getattr(pg, reducer)())


def first_update_kl_over_pg(run=None, coef=True, reducer="median", half=True):
    """15.4 as a learner writes it: ppo_loss at optimizer step 0 of each recorded step of the second half."""
    from ppolab.algos import ppo_loss
    from ppolab.numbers import actor_config, optimizer_step_batch

    r = resolve_run(run)
    cfg = actor_config(r)
    kl, pg = [], []
    for s in (r.steps[len(r.steps) // 2:] if half else r.steps):
        b = optimizer_step_batch(r.step(s), 0)
        _, m = ppo_loss(cfg, old_log_prob=b["old_log_probs"], log_prob=b["log_prob"], advantages=b["advantages"],
                        response_mask=b["response_mask"], ref_log_prob=b["ref_log_prob"])
        kl.append((cfg.kl_loss_coef if coef else 1.0) * m["actor/kl_loss"])
        pg.append(abs(m["actor/pg_loss"]))
    reduce = getattr(statistics, reducer)   # statistics.median: the mean of the two middle values for an even count
    return float(reduce(kl) / reduce(pg))


def old_entropy(run=None, mask="response_mask", denominator="loss_mask", per_step=True):
    from ppolab.algos import agg_loss
    from ppolab.numbers import actor_config, optimizer_step_batch

    r = resolve_run(run, default="ppo_fire_tiny")
    rec = r.step(r.steps[0])
    t = rec.tensors
    h, m, d = t["entropy"], t[mask].float(), t[denominator].float()
    if not per_step:  # one token mean over the whole batch
        return float((h * m).sum() / d.sum())
    actor, arr = actor_config(r), r.ppo_config().actor_rollout_ref
    out = []
    for k in range(t["actor_log_probs"].shape[0]):
        rows = optimizer_step_batch(rec, k)["rows"]
        # token-mean divides by the denominator's tokens, a seq-mean mode by ppo_mini_batch_size × n rows
        out.append(float(agg_loss(h[rows], m[rows], actor.loss_agg_mode, batch_num_tokens=float(d[rows].sum()),
                                  global_batch_size=arr.actor.ppo_mini_batch_size * arr.rollout.n,
                                  loss_scale_factor=actor.loss_scale_factor)))
    return sum(out) / len(out)


def _logged(run=None, key="actor/entropy"):
    r = resolve_run(run, default="ppo_fire_tiny")
    return float(r.metrics.loc[r.steps[0], key])


SOLUTIONS = {
    "15.1": zero_advantage_share,
    "15.2": lone_correct,
    "15.3": "actor/entropy",
    "15.4": first_update_kl_over_pg,
    "15.5": old_entropy,
    "15.6": lambda: _verdicts(None, POLICY_KNOBS),
    "15.7": lambda: _verdicts(None, REGULARISER_KNOBS),
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # "GRPO advantages are never exactly 0"; the token-weighted share; the share of right answers
    "15.1": [0.0, lambda run=None: zero_advantage_share(run, per_token=True), 0.781],
    # the biased std (÷ n); no std normalisation; the raw score
    "15.2": [lambda: lone_correct(unbiased=False), lambda: lone_correct(normalise=False), 1.0,
             lambda: lone_correct(n=8)],  # the group of 8: the top of this run's boxes, logged as advantages/max
    # the metrics that look busy but stay in range
    "15.3": ["actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm"],
    # the raw kl_loss; means instead of medians; every recorded step; the old answer read off the log
    "15.4": [lambda run=None: first_update_kl_over_pg(run, coef=False),
             lambda run=None: first_update_kl_over_pg(run, reducer="mean"),
             lambda run=None: first_update_kl_over_pg(run, half=False), kl_over_pg],
    # no knob moves anything (the null prediction); every direction flipped; "every knob raises its curve"
    "15.6": [lambda: {k: "flat" for k in _verdicts(None, POLICY_KNOBS)},
             lambda: _flipped(_verdicts(None, POLICY_KNOBS)),
             lambda: {k: "up" for k in _verdicts(None, POLICY_KNOBS)}],
    "15.7": [lambda: {k: "flat" for k in _verdicts(None, REGULARISER_KNOBS)},
             lambda: _flipped(_verdicts(None, REGULARISER_KNOBS)),
             lambda: {k: "up" for k in _verdicts(None, REGULARISER_KNOBS)},
             lambda: _verdicts(None, REGULARISER_KNOBS, paired=False)],  # the seeds' spread hides two effects
    # the logged actor/entropy and actor/entropy_loss (read, not computed); the whole batch over response_mask; the
    # update's mask but its own token count as the denominator (as if rejected tokens left batch_num_tokens)
    "15.5": [_logged, lambda run=None: _logged(run, "actor/entropy_loss"),
             lambda run=None: old_entropy(run, denominator="response_mask", per_step=False),
             lambda run=None: old_entropy(run, denominator="response_mask"),
             lambda run=None: old_entropy(run, per_step=False)],  # one ratio over the whole batch
}
