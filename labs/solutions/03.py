"""Solutions to lab 03's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import math

from ppolab import algos
from ppolab.exercises.lab03 import push_case, second_epoch_case
from ppolab.numbers import optimizer_step_batch, resolve_run, step_tensors
from ppolab.numbers.clamp import clamp_case


def max_ratio(run=None, opt_step=None):
    opt_step = second_epoch_case(run)["opt_step"] if opt_step is None else opt_step
    b = optimizer_step_batch(step_tensors(run, 1), opt_step)
    ratio = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], 0.2, 0.2)["ratio"]
    return round(ratio[b["response_mask"].bool()].max().item(), 2)


SOLUTIONS = {
    "03.1": max_ratio,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # "the clip caps the ratio at 1 + ε"; the first optimizer step (ratio 1); optimizer step 1's maximum
    "03.1": [1.2, 1.0, lambda run=None: max_ratio(run, opt_step=1)],
}


def pushed(run=None, part="clamped"):
    """03.2 as a learner writes it: push log_prob, take new − old, count the valid tokens past the clamp."""
    c = push_case(run)
    b = optimizer_step_batch(resolve_run(run).step(c["step"]), c["opt_step"])
    d = (b["log_prob"] + c["what_if"]) - b["old_log_probs"]
    valid = b["response_mask"] > 0
    if part == "pushed_old":             # the push added to old_log_probs instead of log_prob
        d = b["log_prob"] - (b["old_log_probs"] + c["what_if"])
    outside = (d > 20) | (d < -20)
    if part == "inside":                 # the tokens that keep their gradient, not those that lose it
        return int((~outside & valid).sum())
    return int((outside & valid).sum())


SOLUTIONS["03.2"] = pushed
WRONG["03.2"] = [lambda run=None: pushed(run, "inside"), lambda run=None: pushed(run, "pushed_old"),
                 math.exp(20.0), 0.0]  # the old stated-number answers: the clamped ratio e^20, its gradient 0


def largest_abs_log_ratio(run=None, steps=None, signed=False):
    from ppolab.numbers import resolve_run
    from ppolab.numbers.steps import optimizer_step_batch

    r = resolve_run(run)
    best = 0.0
    for s in (r.steps if steps is None else steps):
        rec = r.step(s)
        for k in range(rec.tensors["actor_log_probs"].shape[0]):
            b = optimizer_step_batch(rec, k)
            d = (b["log_prob"] - b["old_log_probs"])[b["response_mask"] > 0]
            best = max(best, float(d.max() if signed else d.abs().max()))
    return round(best, 3)


def step_largest(run=None, signed=False):
    """The learner's loop over the optimizer steps of the recorded step the prompt names."""
    return largest_abs_log_ratio(run, steps=[clamp_case(run)["step"]], signed=signed)


SOLUTIONS["03.5"] = step_largest
# the clamp's bound (as if it acted); the ratio e^|Δ| instead of the log-ratio; the whole run's largest (the lab
# prints it); the largest signed log-ratio (the biggest drift on these runs is downwards)
WRONG["03.5"] = [20.0, lambda run=None: math.exp(step_largest(run)),
                 lambda run=None: largest_abs_log_ratio(run),
                 lambda run=None: step_largest(run, signed=True)]
