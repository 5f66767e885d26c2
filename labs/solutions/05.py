"""Solutions to lab 05's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab import algos
import math

from ppolab.exercises.lab05 import asym_case, dual_case, top_negative_case
from ppolab.numbers import actor_config, optimizer_step_batch, resolve_run, step_tensors
from ppolab.numbers.cases import run_eps

RUN = "ppo_fire_tiny"


def _eps(run=None):  # the run's ε, its clip window (0.07 for ppo_fire_tiny)
    return run_eps(resolve_run(run, default=RUN))


def _batch(run=None, step=None, opt_step=None):  # default: exercise 05.5's optimizer step
    if step is None or opt_step is None:
        c = dual_case(run)
        step, opt_step = c["step"], c["code"]
    return optimizer_step_batch(step_tensors(run, step, default=RUN), opt_step)


def clipped_counts(run=None, low=None, highs=(None, 0.2)):
    c = asym_case(run)
    b = _batch(run, c["step"], c["opt_step"])
    low = _eps(run) if low is None else low
    m = b["response_mask"].bool()
    return tuple(int(algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], low,
                                          low if high is None else high)["clipped"][m].sum()) for high in highs)


def binding_opt_steps(run=None, c=None):
    rec = step_tensors(run, dual_case(run)["step"], default=RUN)
    c = actor_config(resolve_run(run, default=RUN)).clip_ratio_c if c is None else c
    eps, out = _eps(run), []
    for k in range(rec.tensors["actor_log_probs"].shape[0]):
        b = optimizer_step_batch(rec, k)
        dual = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], eps, eps, c)["dual_clipped"]
        if dual[b["response_mask"].bool()].sum() > 0:
            out.append(k)
    return out


def clipfrac_lower(run=None, c=None, over="all"):
    b = _batch(run)
    c = actor_config(resolve_run(run, default=RUN)).clip_ratio_c if c is None else c
    terms = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], _eps(run), _eps(run), c)
    m = b["response_mask"]
    if over == "negative":  # only the tokens with A < 0 in the denominator
        m = m * (b["advantages"] < 0).float()
    if over == "count":
        return int(algos.masked_sum(terms["dual_clipped"], m).item())
    if over == "ordinary":  # the ordinary clip's fraction, pg_clipfrac
        return algos.masked_mean(terms["clipped"], m).item()
    return algos.masked_mean(terms["dual_clipped"], m).item()


def _c(run=None):
    return actor_config(resolve_run(run, default=RUN)).clip_ratio_c


def dual_token(run=None, mistake=None):
    """05.1 as a learner writes it: the token's ratio and advantage from the recorded tensors, then the bounds."""
    c = top_negative_case(run)
    t = resolve_run(run, default=RUN).step(c["step"]).tensors
    adv = float(t["advantages"][c["row"], c["pos"]])
    r = math.exp(float(t["actor_log_probs"][c["code"]][c["row"], c["pos"]]) - float(t["old_log_probs"][c["row"],
                                                                                                     c["pos"]]))
    eps = _eps(run)
    without = max(-adv * r, -adv * min(max(r, 1 - eps), 1 + eps))
    c_bound = _c(run) if mistake == "run_c" else c["what_if"]
    with_dual = max(without, -adv * c_bound) if mistake == "max" else min(without, -adv * c_bound)
    return with_dual, without


def threshold_at(rec, k):
    b = optimizer_step_batch(rec, k)
    ratio = (b["log_prob"] - b["old_log_probs"]).exp()
    neg = (b["response_mask"] > 0) & (b["advantages"] < 0)
    return float(ratio[neg].max()) if neg.any() else 0.0


def threshold(run=None, mistake=None):
    """05.2: the largest ratio over the optimizer step's real tokens with A < 0 (the dual clip binds above c)."""
    c = dual_case(run)
    b = _batch(run, c["step"], c["code"])
    ratio = (b["log_prob"] - b["old_log_probs"]).exp()
    valid = b["response_mask"] > 0
    if mistake == "explorer_step":             # the optimizer step the explorer opens on, not the one named
        return threshold_at(step_tensors(run, c["step"], default=RUN), c["open"])
    if mistake == "upper_edge":                # 1 + ε: where the ordinary clip starts, not where c stops binding
        return 1 + _eps(run)
    return float(ratio[valid & (b["advantages"] < 0)].max())


SOLUTIONS = {
    "05.1": lambda run=None: dual_token(run),
    "05.2": lambda run=None: threshold(run),
    "05.3": clipped_counts,
    "05.4": binding_opt_steps,
    "05.5": clipfrac_lower,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the ordinary clip (−A·r, unbounded); −A·clip(r); the objective's sign
    # the pair swapped; the dual bound applied with max instead of min; the run's own c (what the lab prints for
    # this token); the old stated-number answer (ℓ at A = −2, r = 4, c = 3)
    "05.1": [lambda run=None: dual_token(run)[::-1], lambda run=None: dual_token(run, "max"),
             lambda run=None: dual_token(run, "run_c"), (6.0, 8.0)],
    # the run's own c (where it starts binding, not where it stops); the explorer's optimizer step (the lab prints
    # its ratio); the upper edge of the PPO window; the old stated-number answer c = 3
    "05.2": [lambda run=None: _c(run), lambda run=None: threshold(run, "explorer_step"),
             lambda run=None: threshold(run, "upper_edge"), 3.0],
    # "clip higher changes nothing"; the two swapped; the released tokens instead of the clip-higher count;
    # ε = 0.1 (the value the run used before it was re-recorded at 0.07)
    "05.3": [lambda run=None: (clipped_counts(run)[0],) * 2, lambda run=None: clipped_counts(run)[::-1],
             lambda run=None: (clipped_counts(run)[0], clipped_counts(run)[0] - clipped_counts(run)[1]),
             lambda run=None: clipped_counts(run, low=0.1, highs=(0.1, 0.2))],
    # "the first epoch starts at ratio 1, so it cannot bind" (the later visits only); only the explorer's optimizer
    # step; only the last epoch; "never on real data" (verl's c = 3)
    "05.4": [lambda run=None: binding_opt_steps(run)[1:], [7], lambda run=None: binding_opt_steps(run)[-1:],
             lambda run=None: binding_opt_steps(run, c=3.0)],
    # a count instead of a fraction; over the A < 0 tokens only; the ordinary clip's pg_clipfrac; verl's c = 3
    "05.5": [lambda run=None: clipfrac_lower(run, over="count"), lambda run=None: clipfrac_lower(run, over="negative"),
             lambda run=None: clipfrac_lower(run, over="ordinary"), lambda run=None: clipfrac_lower(run, c=3.0)],
}
