"""Solutions to lab 00's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import math

from ppolab import algos
from ppolab.batching import padding_multiple, plan_batches
from ppolab.numbers import optimizer_step_batch, resolve_run, step_tensors


def optimizer_steps(run=None):
    r = resolve_run(run)
    c, dp = r.config, int(r.info.get("dp_size", 1) or 1)
    actor, n = c["actor_rollout_ref"]["actor"], c["actor_rollout_ref"]["rollout"]["n"]
    minis = [actor["ppo_mini_batch_size"] * n] + ([c["critic"]["ppo_mini_batch_size"] * n] if "values" in
                                                   r.step(r.steps[0]).tensors else [])
    plan = plan_batches(c["data"]["train_batch_size"], n, actor["ppo_mini_batch_size"], dp,
                        actor["ppo_micro_batch_size_per_gpu"], actor["ppo_epochs"], pad_to=padding_multiple(dp, *minis))
    return plan.optimizer_steps


def val_accuracy_change(run=None):
    acc = resolve_run(run).metrics["val/accuracy"].dropna()
    return acc.iloc[-1] - acc.loc[0]


def first_clipfrac(run=None):
    b = optimizer_step_batch(step_tensors(run, 1), 0)
    clipped = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], 0.2, 0.2)["clipped"]
    return algos.masked_mean(clipped, b["response_mask"]).item()


def _logged_clipfrac_of_step_1(run=None):
    return float(resolve_run(run).metrics.loc[1, "actor/pg_clipfrac"])


def loss_calls(run=None, micro=True, what_if=True):
    """(ppo_loss calls, value_loss calls) on rank 0 in the run's first recorded step, under the exercise's what-if
    (a fixed actor micro-batch size, the critic's token budget) — or, ``what_if=False``, as the run recorded them."""
    from ppolab.exercises import case
    from ppolab.numbers.critic_engine import critic_micro_batches
    from ppolab.update_plan import recorded_plan

    r = resolve_run(run)
    c = case("00.4", run=r)
    step = c["step"]
    plan = recorded_plan(r.step(step), r.ppo_config())
    if not micro:  # one call per optimizer step
        actor_calls = len(plan.steps)
    elif what_if:  # each optimizer step's rows on rank 0, cut into fixed micro-batches
        actor_calls = sum(math.ceil(len(o.rows(0)) / c["micro"]) for o in plan.steps)
    else:
        actor_calls = sum(len(o.micro_batches[0]) for o in plan.steps)
    if "critic_vpreds" not in r.step(step).tensors:
        return actor_calls, 0
    updates = r.step(step).tensors["critic_vpreds"].shape[0]
    budget = c["budget"] if what_if else None
    return actor_calls, sum(len(critic_micro_batches(r, u, 0, step=step, max_token_len=budget)) for u in range(updates))


SOLUTIONS = {
    "00.1": first_clipfrac,
    "00.2": optimizer_steps,
    "00.3": val_accuracy_change,
    "00.4": loss_calls,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the logged step-1 metric (averaged over all four optimizer steps); ε itself; everything clipped
    "00.1": [_logged_clipfrac_of_step_1, 0.2, 1.0],
    # one epoch only; forgot the × n of the mini-batch (128 rows / 8); one per training step
    "00.2": [lambda run=None: optimizer_steps(run) // 2, lambda run=None: optimizer_steps(run) * 8, 1],
    # the sign flipped; the final accuracy instead of the change; percent points
    "00.3": [lambda run=None: -val_accuracy_change(run),
             lambda run=None: float(resolve_run(run).metrics["val/accuracy"].dropna().iloc[-1]),
             lambda run=None: 100 * val_accuracy_change(run)],
    # optimizer steps instead of micro-batches; the actor's count for both; all ranks' calls (× 2 ranks, or 2·n);
    # the counts the run recorded (its own micro-batch size and budget, not the what-if)
    "00.4": [lambda run=None: loss_calls(run, micro=False), lambda run=None: (loss_calls(run)[0],) * 2,
             lambda run=None: tuple(2 * x for x in loss_calls(run)), lambda run=None: loss_calls(run, what_if=False)],
}
