"""Solutions to lab 10's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab.exercises.lab10 import first_step_log_ratio
from ppolab.numbers import step_tensors

RUN = "ppo_fire_tiny"


def tensors(run=None):
    return step_tensors(run or RUN, None).tensors


def row2(run=None):
    return int(tensors(run)["response_mask"][2].sum())


def logit_position(run=None):
    return tensors(run)["prompts"].shape[1] - 1 + 4


def n_rejected(run=None):
    t = tensors(run)
    return int((t["loss_mask"].bool() & ~t["response_mask"].bool()).sum())


SOLUTIONS = {
    "10.1": row2,
    "10.2": logit_position,
    "10.3": {"seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"},
    "10.4": 4,
    "10.5": n_rejected,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the padded width; loss_mask's count (the rejected token too); one too many
    "10.1": [lambda run=None: tensors(run)["responses"].shape[1],
             lambda run=None: int(tensors(run)["loss_mask"][2].sum()), lambda run=None: row2(run) + 2],
    # no shift; the shift the wrong way
    "10.2": [lambda run=None: logit_position(run) + 1, lambda run=None: logit_position(run) + 2],
    # "masked positions never leak"; all five; seq-mean-token-mean alone (because of its 1e-8)
    "10.3": [set(), {"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                     "seq-mean-token-sum-norm"}, {"seq-mean-token-mean"}, {"token-mean", "token-sum"}],
    # padding only to a multiple of dp_size; per rank; 60 mod 16; the padded batch size
    "10.4": [0, 2, 12, 64],
    # the rows touched instead of the tokens; the rejected share instead of a count; every zero of response_mask
    "10.5": [lambda run=None: int((tensors(run)["loss_mask"].bool() & ~tensors(run)["response_mask"].bool())
                                  .any(-1).sum()),
             lambda run=None: n_rejected(run) / float(tensors(run)["loss_mask"].sum()),
             lambda run=None: int((tensors(run)["response_mask"] == 0).sum())],
}


def max_first_ratio_gap(run=None):
    """What a learner writes: optimizer step 0's rows, its valid tokens, max |log π_θ − log π_old|."""
    t = tensors(run)
    lp = t["actor_log_probs"][0]
    rows = ~lp.isnan().all(-1)
    return round((lp[rows] - t["old_log_probs"][rows])[t["response_mask"][rows] > 0].abs().max().item(), 4)


SOLUTIONS["10.6"] = max_first_ratio_gap
# the bf16 rollout gap |log π_old − log π_rollout| (what rejection sampling looks at); the last optimizer step's gap
WRONG["10.6"] = [lambda run=None: first_step_log_ratio(run, 0, against="rollout_log_probs"),
                 lambda run=None: first_step_log_ratio(run, 15)]
