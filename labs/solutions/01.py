"""Solutions to lab 01's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import torch

from ppolab.exercises.lab01 import last_opt_step_case, score_row_case
from ppolab.numbers import resolve_run, step_tensors


def response_tokens(run=None):
    t = step_tensors(run, 1).tensors
    real = ~t["is_pad"].bool()
    return int(t["response_mask"][real].sum())


def _all_positions(run=None):
    t = step_tensors(run, 1).tensors
    return int(t["responses"].numel())


def _mean_length(run=None):
    return float(step_tensors(run, 1).info["metrics"]["response_length/mean"])


def opt_step_tokens(run=None, opt_step=None):
    c = last_opt_step_case(run)
    t = resolve_run(run).step(c["step"]).tensors
    k = c["opt_step"] if opt_step is None else opt_step
    rows = ~torch.isnan(t["actor_log_probs"][k]).all(-1) & ~t["is_pad"].bool()
    return int(t["response_mask"][rows].sum())


def score_position(run=None):
    c = score_row_case(run)
    t = resolve_run(run).step(c["step"]).tensors
    return int(torch.nonzero(t["loss_mask"][c["row"]]).max())


def _response_length(run=None):  # the row's length, one more than its last position
    c = score_row_case(run)
    return int(resolve_run(run).step(c["step"]).tensors["loss_mask"][c["row"]].sum())


SOLUTIONS = {
    "01.1": opt_step_tokens,
    "01.2": response_tokens,
    "01.3": score_position,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the rows, not their tokens (what the stage-9 section prints); the whole step's tokens (every optimizer step
    # together); the first optimizer step's tokens (another mini-batch)
    "01.1": [lambda run=None: last_opt_step_case(run)["mini"], response_tokens,
             lambda run=None: opt_step_tokens(run, opt_step=0)],
    # every response position (padding included); the mean length; counted once per epoch (2 epochs)
    "01.2": [_all_positions, _mean_length, lambda run=None: 2 * response_tokens(run)],
    # "the last response token" read as the last column; the row's length; the first response position
    "01.3": [lambda run=None: score_row_case(run)["width"] - 1, _response_length, 0],
}
