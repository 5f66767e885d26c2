"""Solutions to lab 13's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab.replay import replay_rows
from ppolab.run.reader import resolve_run


def _batch(run=None):
    r = resolve_run(run)
    rec, rows = r.step(1), replay_rows(r)
    adv = rec["advantages"][rows]
    if "rollout_is_weights" in rec.tensors:  # rollout_is: every token's loss is −A·w (the vLLM run)
        adv = adv * rec["rollout_is_weights"][rows]
    return adv, rec["response_mask"][rows], len(rows)


def _attended(run=None):  # what a micro-batch is trimmed to: the attended response positions (tool observations too)
    r = resolve_run(run)
    rec, rows = r.step(1), replay_rows(r)
    return rec.tensors.get("response_attention_mask", rec["response_mask"])[rows]


def pg_loss_micro16(run=None, micro=16, width="own"):
    adv, mask, B = _batch(run)
    seen = _attended(run)
    total = 0.0
    for i in range(0, B, micro):
        a, m = adv[i:i + micro], mask[i:i + micro]
        T = int(seen[i:i + micro].sum(-1).max()) if width == "own" else int(seen.sum(-1).max())
        total += float(-(a * m).sum() / (B * T))
    return total


def pg_loss_token_mean(run=None):
    adv, mask, _ = _batch(run)
    return float(-(adv * mask).sum() / mask.sum())


def full_width_sizes(run=None):
    _, _, M = _batch(run)
    r_len = _attended(run).sum(-1).long()  # the width a micro-batch is trimmed to
    sizes = [s for s in range(1, M + 1) if M % s == 0]
    return [s for s in sizes if all(int(r_len[i:i + s].max()) == int(r_len.max()) for i in range(0, M, s))]


def bnpo_weight(run=None, per_row=False, without_accumulation=False, inverted=False):
    """13.4 as a learner writes it: TRL's bnpo divides micro-batch k's token sum by its own tokens T_k and by the
    accumulation steps; a token's weight times N is N / (T_k · acc)."""
    from ppolab.exercises.lab13 import bnpo_case
    from ppolab.numbers.three_trainers import step_mask

    c = bnpo_case(run)
    m = step_mask(run, 1)["mask"]
    micro = 1 if per_row else c["micro"]
    k = c["row"] // micro
    tokens = float(m[k * micro:(k + 1) * micro].sum())
    acc = 1 if without_accumulation else len(m) // micro
    value = float(m.sum()) / (tokens * acc)
    return 1 / value if inverted else value


SOLUTIONS = {
    "13.1": (True, False),
    "13.2": pg_loss_micro16,
    "13.3": full_width_sizes,
    "13.4": bnpo_weight,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # "micro-batching never matters"; "it always matters"; the two modes swapped
    "13.1": [(True, True), (False, False), (False, True)],
    # the mini-batch's width for every micro-batch (= one micro-batch); token-mean; the sign flipped
    "13.2": [lambda run=None: pg_loss_micro16(run, width="mini"), pg_loss_token_mean,
             lambda run=None: -pg_loss_micro16(run)],
    # only the whole mini-batch; every divisor; one size too many
    "13.3": [[64], [1, 2, 4, 8, 16, 32, 64], [16, 32, 64]],
    # verl's token mean; the accumulation steps forgotten; one row a micro-batch; upside down
    "13.4": [1.0, lambda run=None: bnpo_weight(run, without_accumulation=True),
             lambda run=None: bnpo_weight(run, per_row=True), lambda run=None: bnpo_weight(run, inverted=True)],
}
