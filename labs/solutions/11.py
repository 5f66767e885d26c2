"""Solutions to lab 11's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab.exercises.lab11 import (first_mini_batch, longest_case, longest_share, mini_batch, ones_seq_mean,
                                    padding_case, rejection_case)
from ppolab.numbers import step_tensors


def length_ratio(run=None):
    lengths = first_mini_batch(run)[1].sum(-1)
    lengths = lengths[lengths > 0]
    return (lengths.max() / lengths.min()).item()


def kept_over_counted(run=None, opt_step=None):
    b = mini_batch(run, rejection_case(run)["opt_step"] if opt_step is None else opt_step)
    return round((b["response_mask"].sum() / b["loss_mask"].sum()).item(), 4)


def nonempty_over_gbs(run=None):
    c = padding_case(run)                       # in ppo_fire_tiny: optimizer step 3 (rows 24–31 and 56–63), B_agg 16
    b = mini_batch(run, c["opt_step"])
    return round(float((b["response_mask"].sum(-1) > 0).sum()) / c["gbs"], 4)


def top_k_shares(run=None):
    """What a learner writes: the real rows' lengths, the k longest; tokens for token-mean, rows for seq-mean."""
    t = step_tensors(run or "ppo_fire_tiny", None).tensors
    lengths = t["response_mask"][~t["is_pad"].bool()].sum(-1)
    k = longest_case(run)["k"]
    top = lengths.sort(descending=True).values[:k]
    return (top.sum() / lengths.sum()).item(), k / int((lengths > 0).sum())


SOLUTIONS = {
    "11.1": lambda run=None: (length_ratio(run), 1.0),
    "11.2": nonempty_over_gbs,
    "11.3": kept_over_counted,
    "11.4": top_k_shares,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # both modes equal; swapped; the inverse ratio
    "11.1": [(1.0, 1.0), lambda run=None: (1.0, length_ratio(run)), lambda run=None: (1 / length_ratio(run), 1.0)],
    # the fallback B_agg (non-empty rows only) gives 1; the inverse; B_agg = all 64 rows of the step
    "11.2": [1.0, lambda run=None: ones_seq_mean(run, fixed=False), lambda run=None: 1 / ones_seq_mean(run),
             lambda run=None: ones_seq_mean(run) * 16 / 64],
    # the survivors' own count (1); the rejected share; the inverse; optimizer step 0 (the lab prints it)
    "11.3": [1.0, lambda run=None: 1 - kept_over_counted(run),
             lambda run=None: 1 / kept_over_counted(run), lambda run=None: kept_over_counted(run, 0)],
    # the pair swapped; both modes weighing rows alike; both weighing tokens alike; the longest rows ranked and
    # counted by loss_mask (rejected tokens included)
    "11.4": [lambda run=None: top_k_shares(run)[::-1], lambda run=None: (top_k_shares(run)[1],) * 2,
             lambda run=None: (top_k_shares(run)[0],) * 2,
             lambda run=None: (longest_share(run, "token-mean", "loss_mask"), top_k_shares(run)[1])],
}
