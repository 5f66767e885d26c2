"""Solutions to lab 10's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import torch

from ppolab.exercises.lab10 import after_rejected, masks_row_case, short_row_case
from ppolab.numbers import step_tensors

RUN = "ppo_fire_tiny"


def tensors(run=None):
    return step_tensors(run or RUN, None).tensors


def logit_position(run=None):
    """The old lookup's answer: the logits that score the last padded column, P + R − 2."""
    t = tensors(run)
    return t["prompts"].shape[1] - 1 + t["responses"].shape[1] - 1


def sampled_logit_positions(run=None, shift=-1, mask="loss_mask"):
    """10.6 as a learner writes it: the row's first and last sampled j, moved to the logits that predict them."""
    t = tensors(run)
    row = short_row_case(run)["row"]
    j = torch.nonzero(t[mask][row]).flatten()
    P = t["prompts"].shape[1]
    return P + shift + int(j.min()), P + shift + int(j.max())


def rejected_what_if(run=None, mask="loss_mask", both_sides=True, strict=False):
    """10.3 as a learner writes it: token_k1's rule at the prompt's bound T, on the sampled tokens."""
    import math

    from ppolab.exercises import case

    t = tensors(run)
    bound = math.log(float(case("10.3", run=run or RUN)["threshold"]))
    k1 = -(t["old_log_probs"] - t["rollout_log_probs"])
    kept = (k1 >= -bound) & (k1 <= bound) if both_sides else (k1 <= bound)
    if strict:  # "at T" counted as rejected
        kept = (k1 > -bound) & (k1 < bound)
    counted = torch.ones_like(kept) if mask is None else t[mask].bool()
    return int((counted & ~kept).sum())


def n_rejected(run=None):
    t = tensors(run)
    return int((t["loss_mask"].bool() & ~t["response_mask"].bool()).sum())


def n_after_rejected(run=None):
    """What a learner writes: the rejected tokens, a running count along each row, the sampled tokens past one."""
    t = tensors(run)
    rejected = (t["loss_mask"].bool() & ~t["response_mask"].bool()).long()
    after = (rejected.cumsum(-1) - rejected) > 0
    return int((after & t["loss_mask"].bool()).sum())


def row_masks(run=None):
    t = tensors(run)
    row = masks_row_case(run)["row"]
    attention = t["response_attention_mask"] if "response_attention_mask" in t else t["response_mask"]
    return (int(t["prompt_mask"][row].sum() + attention[row].sum()), int(t["response_mask"][row].sum()),
            int(t["loss_mask"][row].sum()))


SOLUTIONS = {
    "10.1": {"seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"},
    "10.2": 4,
    "10.3": rejected_what_if,
    "10.4": n_after_rejected,
    "10.5": row_masks,
    "10.6": sampled_logit_positions,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # "masked positions never leak"; all five; seq-mean-token-mean alone (because of its 1e-8)
    "10.1": [set(), {"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                     "seq-mean-token-sum-norm"}, {"seq-mean-token-mean"}, {"token-mean", "token-sum"}],
    # padding only to a multiple of dp_size; per rank; 60 mod 16; the padded batch size
    "10.2": [0, 2, 12, 64],
    # the rows touched instead of the tokens; the rejected share instead of a count; every zero of response_mask
    # what the run itself rejected (the count the lab prints); one side of the bound only; counted on the rewritten
    # response_mask (the run's survivors) instead of the tokens as sampled; every position, padding included
    "10.3": [n_rejected, lambda run=None: rejected_what_if(run, both_sides=False),
             lambda run=None: rejected_what_if(run, mask="response_mask"),
             lambda run=None: rejected_what_if(run, mask=None)],
    # the rejected tokens themselves (the count printed above); the rejected tokens counted too; only the surviving
    # tokens after one (response_mask); every position after one, padding included; the rows with a rejected token
    "10.4": [n_rejected, lambda run=None: int((after_rejected(run, include_self=True)
                                               & tensors(run)["loss_mask"].bool()).sum()),
             lambda run=None: int((after_rejected(run) & tensors(run)["response_mask"].bool()).sum()),
             lambda run=None: int(after_rejected(run).sum()),
             lambda run=None: int((tensors(run)["loss_mask"].bool() & ~tensors(run)["response_mask"].bool())
                                  .any(-1).sum())],
    # the padded width as "attended"; the denominator re-normalised over the numerator; one mask for all three;
    # loss_mask for all three; the response part only as "attended"; (a) and (c) swapped
    "10.5": [lambda run=None: (tensors(run)["prompts"].shape[1] + tensors(run)["responses"].shape[1],
                               *row_masks(run)[1:]),
             lambda run=None: (row_masks(run)[0] - int(tensors(run)["prompt_mask"][masks_row_case(run)["row"]].sum()),
                               *row_masks(run)[1:]),
             lambda run=None: row_masks(run)[::-1],
             lambda run=None: (row_masks(run)[0], row_masks(run)[1], row_masks(run)[1]),
             lambda run=None: (row_masks(run)[1],) * 3, lambda run=None: (row_masks(run)[2],) * 3],
    # no shift (the positions of the tokens themselves); shifted the wrong way; the response positions j alone;
    # the old answer's last padded column for the last
    "10.6": [lambda run=None: sampled_logit_positions(run, shift=0), lambda run=None: sampled_logit_positions(run, 1),
             lambda run=None: sampled_logit_positions(run, -tensors(run)["prompts"].shape[1]),
             lambda run=None: (sampled_logit_positions(run)[0], logit_position(run))],
}
