"""Solutions to lab 12's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import math

from ppolab.batching import mini_batch_indices, plan_dynamic_micro_batches
from ppolab.update_plan import micro_batches
from ppolab.exercises.lab12 import critic_budget_case, critic_mini_batch
from ppolab.run.reader import resolve_run


def recorded_steps_and_rows(run=None, forget_n=False):
    r = resolve_run(run)
    c = r.config
    a, n = c["actor_rollout_ref"]["actor"], c["actor_rollout_ref"]["rollout"]["n"]
    rows = a["ppo_mini_batch_size"] * (1 if forget_n else n)
    pad = int(r.step(1).tensors["is_pad"].sum())
    return (c["data"]["train_batch_size"] * n + pad) // rows * a["ppo_epochs"], rows  # + the synthetic padding rows


def dynamic_count(run=None, budget=128, fit_loop=True):
    rec = resolve_run(run).step(1)
    lens = rec.opt_step(0).seq_lens()
    if not fit_loop:  # the HEAD count: ceil(total / budget), no retries
        return min(len(lens), math.ceil(sum(lens) / budget))
    return len(plan_dynamic_micro_batches(lens, budget))


def critic_counts(run=None, budget=48, micro=None, follow_top_level=False):
    micro = critic_budget_case(run)["micro"] if micro is None else micro  # the prompt names it
    mb, _ = critic_mini_batch(run)
    budget = max(budget, max(mb.seq_lens()))  # a budget holds every row
    engine = micro_batches(mb, micro if follow_top_level else None, budget)  # V1: the one token budget
    return len(engine), len(micro_batches(mb, micro, None))


def shuffled_rows(rank=1, seed=42, epoch=1, step=None):
    # the worker rebuilds its iterator at every update, seeded data_loader_seed + dp_rank: the step never enters
    extra = 0 if step is None else step  # the mistake: a seed that moves with the training step
    return set(mini_batch_indices(8, 4, 2, shuffle=True, seed=seed + rank + extra)[epoch][0])


SOLUTIONS = {
    "12.1": recorded_steps_and_rows,
    "12.2": ((64 * 4) // (16 * 4) * 2, (16 * 4 // 4) // 4),
    "12.3": ((-32 * 5) % (6 * 5), (32 * 5 + (-32 * 5) % (6 * 5)) // (6 * 5)),
    "12.4": dynamic_count,
    "12.5": critic_counts,
    "12.6": shuffled_rows(),
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # forgot × rollout.n (8× too many steps, 8× too few rows); forgot the second epoch; steps per epoch only
    "12.1": [lambda run=None: recorded_steps_and_rows(run, forget_n=True), (2, 64), (4, 8)],
    # (steps, waves) swapped; forgot the second epoch; forgot to divide by the DP size before the micro split;
    # forgot × n everywhere; forgot × n in the mini-batch only
    "12.2": [(4, 8), (4, 4), (8, 16), (8, 1), (32, 4)],
    # "invalid, no padding" and the rounded-down step count; pads prompts instead of trajectories
    # (multiple 6 → 2 rows); the padding right but the step count of the unpadded batch
    "12.3": [(0, 5), (2, 27), (20, 5), (10, 6)],
    # ceil(total / budget) without the fit loop (the HEAD count); one row per micro-batch; the 256-token plan
    "12.4": [lambda run=None: dynamic_count(run, fit_loop=False), 64, lambda run=None: dynamic_count(run, 256)],
    # the two swapped; the top-level field obeyed; the run's own budget (32768: one micro-batch); both by the budget
    "12.5": [lambda run=None: critic_counts(run)[::-1], lambda run=None: critic_counts(run, follow_top_level=True),
             lambda run=None: critic_counts(run, budget=32768),
             lambda run=None: (critic_counts(run)[0],) * 2],
    # the first epoch's mini-batch; rank 0's; unshuffled; a seed that moves with the training step
    "12.6": [shuffled_rows(epoch=0), shuffled_rows(rank=0), {0, 1, 2, 3}, shuffled_rows(step=7)],
}
