"""Solutions to lab 07's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import math

from ppolab.exercises.lab07 import step1_entropy
from ppolab.record import resolve_run


def entropy_ratio(run=None):
    ent = resolve_run(run).metrics["actor/entropy"].dropna()
    return ent.iloc[-10:].mean() / ent.iloc[:10].mean()


SOLUTIONS = {
    "07.1": lambda run=None: step1_entropy(run, 0.5),
    "07.2": entropy_ratio,
    "07.3": math.log(29),
    "07.4": lambda run=None: round(step1_entropy(run, 2.0), 3),
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the run's own temperature (1.0) instead of 0.5; T applied as a multiplier (z·0.5 = z / 2.0)
    "07.1": [lambda run=None: step1_entropy(run, 1.0), lambda run=None: step1_entropy(run, 2.0)],
    # first over last; the logged values' last/first single step
    "07.2": [lambda run=None: 1 / entropy_ratio(run),
             lambda run=None: resolve_run(run).metrics["actor/entropy"].dropna().iloc[-1]
             / resolve_run(run).metrics["actor/entropy"].dropna().iloc[0]],
    # bits instead of nats; one token fewer; "1 nat"
    "07.3": [math.log2(29), math.log(28), 1.0],
    "07.4": [lambda run=None: step1_entropy(run, 1.0), lambda run=None: step1_entropy(run, 0.5), math.log(29)],
}
