"""Solutions to lab 03's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import math

from ppolab import algos
from ppolab.exercises.lab03 import second_epoch_case
from ppolab.numbers import optimizer_step_batch, step_tensors
from ppolab.numbers.clamp import clamp_case


def max_ratio(run=None, opt_step=None):
    opt_step = second_epoch_case(run)["opt_step"] if opt_step is None else opt_step
    b = optimizer_step_batch(step_tensors(run, 1), opt_step)
    ratio = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], 0.2, 0.2)["ratio"]
    return round(ratio[b["response_mask"].bool()].max().item(), 2)


SOLUTIONS = {
    "03.1": max_ratio,
    "03.2": round(math.exp(-0.5), 3),
    "03.3": math.exp(20.0),
    "03.4": 0.0,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # "the clip caps the ratio at 1 + ε"; the first optimizer step (ratio 1); optimizer step 1's maximum
    "03.1": [1.2, 1.0, lambda run=None: max_ratio(run, opt_step=1)],
    # old − new instead of new − old; the log-ratio itself; its absolute value
    "03.2": [math.exp(0.5), -0.5, 0.5],
    # no clamp; the PPO clip bound; the clamped log-ratio, not exponentiated
    "03.3": [math.exp(30.0), 1.2, 20.0],
    # ∂e^d/∂d = e^d as if unclamped, at the clamp's edge, or a unit slope
    "03.4": [math.exp(30.0), math.exp(20.0), 1.0],
}


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
