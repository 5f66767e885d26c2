"""Solutions to lab 03's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import math

from ppolab import algos
from ppolab.exercises.lab03 import second_epoch_case
from ppolab.numbers import optimizer_step_batch, step_tensors


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
