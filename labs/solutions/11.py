"""Solutions to lab 11's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab.algos import agg_loss
from ppolab.exercises.lab11 import first_mini_batch


def length_ratio(run=None):
    lengths = first_mini_batch(run)[1].sum(-1)
    return (lengths.max() / lengths.min()).item()


SOLUTIONS = {
    "11.1": 3 / 12,
    "11.2": 15 / 20,
    "11.3": lambda run=None: (length_ratio(run), 1.0),
    "11.4": 0.0,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # per-trajectory equal weight; 3/9
    "11.1": [0.5, 3 / 9],
    # re-normalised over the survivors (1.0); the rejected share
    "11.2": [1.0, 5 / 20, 15 / 15],
    # both modes equal; swapped; the inverse ratio
    "11.3": [(1.0, 1.0), lambda run=None: (1.0, length_ratio(run)), lambda run=None: (1 / length_ratio(run), 1.0)],
    # token-mean's value; seq-mean-token-sum's value
    "11.4": [lambda run=None: agg_loss(*first_mini_batch(run), "token-mean").item(),
             lambda run=None: agg_loss(*first_mini_batch(run), "seq-mean-token-sum").item()],
}
