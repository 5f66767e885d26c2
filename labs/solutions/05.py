"""Solutions to lab 05's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab import algos
from ppolab.exercises.lab05 import asym_case, dual_case
from ppolab.numbers import actor_config, optimizer_step_batch, resolve_run, step_tensors

RUN = "ppo_fire_tiny"


def _eps(run=None):  # the run's clip_ratio (0.07 for ppo_fire_tiny)
    return actor_config(resolve_run(run, default=RUN)).clip_ratio


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


SOLUTIONS = {
    "05.1": 6.0,
    "05.2": 3.0,
    "05.3": clipped_counts,
    "05.4": binding_opt_steps,
    "05.5": clipfrac_lower,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the ordinary clip (−A·r, unbounded); −A·clip(r); the objective's sign
    "05.1": [8.0, 2.4, -6.0],
    # the PPO window's upper edge; its lower edge; c·(1 + ε)
    "05.2": [1.2, 0.8, 3.6],
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
