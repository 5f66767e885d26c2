"""Solutions to lab 10's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab.exercises.lab10 import doctored_seq_mean
from ppolab.widgets.common import step_tensors


def row3(run=None):
    return int(step_tensors(run, None).tensors["response_mask"][3].sum())


def logit_position(run=None):
    return step_tensors(run, None).tensors["prompts"].shape[1] - 1 + 4


SOLUTIONS = {
    "10.1": row3,
    "10.2": logit_position,
    "10.3": {"seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"},
    "10.4": lambda run=None: round(doctored_seq_mean(run), 4),
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the padded width; one too many (counting the EOS slot twice)
    "10.1": [lambda run=None: step_tensors(run, None).tensors["responses"].shape[1], lambda run=None: row3(run) + 1],
    # no shift; the shift the wrong way
    "10.2": [lambda run=None: logit_position(run) + 1, lambda run=None: logit_position(run) + 2],
    # "masked positions never leak"; all five; seq-mean-token-mean alone (because of its 1e-8)
    "10.3": [set(), {"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                     "seq-mean-token-sum-norm"}, {"seq-mean-token-mean"}, {"token-mean", "token-sum"}],
    # the fallback divisor (non-empty rows only) gives 1; the inverse ratio
    "10.4": [1.0, lambda run=None: doctored_seq_mean(run, False), lambda run=None: 1 / doctored_seq_mean(run)],
}
