"""Solutions to lab 00's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
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


SOLUTIONS = {
    "00.1": first_clipfrac,
    "00.2": optimizer_steps,
    "00.3": val_accuracy_change,
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
}
