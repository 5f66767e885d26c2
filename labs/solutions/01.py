"""Solutions to lab 01's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab.numbers import step_tensors


def response_tokens(run=None):
    t = step_tensors(run, 1).tensors
    real = ~t["is_pad"].bool()
    return int(t["response_mask"][real].sum())


def _all_positions(run=None):
    t = step_tensors(run, 1).tensors
    return int(t["responses"].numel())


def _mean_length(run=None):
    return float(step_tensors(run, 1).info["metrics"]["response_length/mean"])


SOLUTIONS = {
    "01.1": (0, 63),
    "01.2": response_tokens,
    "01.3": "compute_ref_log_prob",
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # fresh rows after the first 128; the second mini-batch; the whole batch
    "01.1": [(128, 191), (64, 127), (0, 127)],
    # every response position (padding included); the mean length; counted once per epoch (2 epochs)
    "01.2": [_all_positions, _mean_length, lambda run=None: 2 * response_tokens(run)],
    # the stage that uses π_ref on the reward side; the actor update that uses it in the loss; π_old's stage
    "01.3": ["compute_advantage", "update_actor", "compute_old_log_prob"],
}
