"""Solutions to lab 12's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import math

from ppolab.batching import plan_dynamic_micro_batches
from ppolab.numbers.aggregation import recorded_seq_lens
from ppolab.record import resolve_run


def recorded_steps_and_rows(run=None, forget_n=False):
    r = resolve_run(run)
    c = r.config
    a, n = c["actor_rollout_ref"]["actor"], c["actor_rollout_ref"]["rollout"]["n"]
    rows = a["ppo_mini_batch_size"] * (1 if forget_n else n)
    pad = int(r.step(1).tensors["is_pad"].sum())
    return (c["data"]["train_batch_size"] * n + pad) // rows * a["ppo_epochs"], rows  # + the synthetic padding rows


def dynamic_count(run=None, budget=128, fit_loop=True):
    rec = resolve_run(run).step(1)
    lens = recorded_seq_lens(rec, rec.info["batch_plan"]["local_mini_batch"])
    if not fit_loop:  # the HEAD count: ceil(total / budget), no retries
        return min(len(lens), math.ceil(sum(lens) / budget))
    return len(plan_dynamic_micro_batches(lens, budget))


SOLUTIONS = {
    "12.1": recorded_steps_and_rows,
    "12.2": ((64 * 4) // (16 * 4) * 1, (16 * 4 // 4) // 4),
    "12.3": ((-32 * 5) % (6 * 5), (32 * 5 + (-32 * 5) % (6 * 5)) // (6 * 5)),
    "12.4": dynamic_count,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # forgot × rollout.n (8× too many steps, 8× too few rows); forgot the second epoch; steps per epoch only
    "12.1": [lambda run=None: recorded_steps_and_rows(run, forget_n=True), (2, 64), (4, 8)],
    # forgot × n for the steps; forgot to divide by the DP size before the micro split; (waves, steps) swapped
    "12.2": [(16, 4), (4, 16), (1, 4)],
    # "invalid, no padding" and the rounded-down step count; pads prompts instead of trajectories
    # (multiple 6 → 2 rows); the padding right but the step count of the unpadded batch
    "12.3": [(0, 5), (2, 27), (20, 5), (10, 6)],
    # ceil(total / budget) without the fit loop (the HEAD count); one row per micro-batch; the 256-token plan
    "12.4": [lambda run=None: dynamic_count(run, fit_loop=False), 64, lambda run=None: dynamic_count(run, 256)],
}
