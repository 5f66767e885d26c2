"""Lab 00 — start here: a run, its batch plan, its metrics (chapter §1, §3.1, §4.2, §11.4)."""
from __future__ import annotations

from ppolab import algos
from ppolab.exercises import exercise


@exercise("00.1", "Predict, then verify: at ε = 0.2, what share of the response tokens of recorded step 1, "
                  "optimizer step 0 (the very first update of the run) does the clip take out (pg_clipfrac)?",
          kind="predict",
          hints=("Before its first optimizer step, which policy is the actor, compared with π_old? What is the "
                 "ratio then, and can a ratio of that size be clipped at ε = 0.2? (The logged actor/pg_clipfrac of "
                 "step 1 is an average over all the step's optimizer steps, not this one.)",
                 "masked_mean(ppo_clip_terms(old_log_probs, actor_log_probs[0], advantages, 0.2, 0.2)['clipped'], "
                 "response_mask) over the rows of optimizer step 0: optimizer_step_batch(run.step(1), 0)."),
          context=("run",), needs=("step1",))
def _e1(run=None) -> float:
    from ppolab.numbers import optimizer_step_batch, step_tensors

    b = optimizer_step_batch(step_tensors(run, 1), 0)
    terms = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], 0.2, 0.2)
    return algos.masked_mean(terms["clipped"], b["response_mask"]).item()


@exercise("00.2", "How many times does the actor's optimizer step in ONE training step of the run (RUN)?",
          kind="lookup",
          hints=("One optimizer step per mini-batch, and the mini-batches are gone through ppo_epochs times. "
                 "Remember that ppo_mini_batch_size counts prompts: the trainer multiplies it by rollout.n.",
                 "(train_batch_size × n) / (ppo_mini_batch_size × n) × ppo_epochs, i.e. "
                 "plan_batches(...).optimizer_steps with the run's config."),
          context=("run",))
def _e2(run=None) -> int:
    from ppolab.numbers import step_tensors

    # the trainer recorded π_θ once per optimizer step: one slice of actor_log_probs each
    return int(step_tensors(run).tensors["actor_log_probs"].shape[0])


@exercise("00.3", "By how much did val/accuracy change between the validation before training (step 0) and the "
                  "run's last validation? (a signed number: after − before)",
          kind="lookup",
          hints=("Read the val/accuracy column of the run's metrics; most steps have NaN there (no validation).",
                 "acc = run.metrics['val/accuracy'].dropna(); answer = acc.iloc[-1] - acc.loc[0]."),
          context=("run",), needs=("validation",))
def _e3(run=None) -> float:
    from ppolab.run.reader import resolve_run

    s = resolve_run(run).summary  # written by the trainer at the end of the run
    return s["val_after"]["val/accuracy"] - s["val_before"]["val/accuracy"]


def reading_order_case(run=None) -> dict:
    """Exercise 00.4's step and its what-if: the run's first recorded step, an actor micro-batch size ``micro`` the
    run did not use (the largest proper divisor of rank 0's local mini-batch whose count differs from the recorded
    one, so that each mini-batch holds ≥ 2 micro-batches) and the smallest critic token budget ppolab accepts (one
    full-length sequence: ``budget``; a run without a critic answers 0 for it) — settings under which the nesting's
    counts differ from one optimizer step each, from each other and from the counts the run recorded."""
    from ppolab.numbers.critic_engine import smallest_budget
    from ppolab.run.reader import resolve_run

    r = resolve_run(run)
    step = r.steps[0]
    plan = r.step(step).plan("actor")
    local = len(plan.steps[0].rows(0))
    ran = sum(len(o.micro_batches[0]) for o in plan.steps)  # the calls as recorded: copying them must not pass

    def calls(d: int) -> int:
        return sum(-(-len(o.rows(0)) // d) for o in plan.steps)
    micro = next((d for d in range(local - 1, 0, -1) if local % d == 0 and calls(d) != ran), 1)
    return {"step": step, "micro": micro, "budget": smallest_budget(r)}


@exercise("00.4", "Predict, then verify — places 3, 6 and 7–10 of the reading order, nested (§17): `_update_actor` "
                  "hands the batch to `train_mini_batch`, which calls `train_batch` once per mini-batch and epoch "
                  "(one optimizer step each); `train_batch` cuts its mini-batch with `prepare_micro_batches` and "
                  "runs the loss once per micro-batch — `ppo_loss` for the actor, `value_loss` for the critic. Take "
                  "recorded step {step} of RUN, on data-parallel rank 0, with its rows, mini-batches and epochs as "
                  "they ran, but suppose the actor had cut fixed micro-batches of {micro} rows "
                  "(actor.use_dynamic_bsz=false, actor.ppo_micro_batch_size_per_gpu={micro}) and the critic's token "
                  "budget had been critic.ppo_infer_max_token_len_per_gpu={budget}. How many times would `ppo_loss` "
                  "run, and how many times `value_loss` (0 without a critic)? Answer (ppo_loss calls, value_loss "
                  "calls).",
          kind="predict",
          hints=("Count optimizer steps first (ppo_epochs × mini-batches), then micro-batches per mini-batch on one "
                 "rank: its local mini-batch / {micro}. The critic has its own epochs and mini-batch size, and V1 "
                 "cuts its micro-batches by the token budget (sequences packed until the next would pass {budget} "
                 "tokens), not by its top-level micro-batch fields (§11.6).",
                 "Actor: Σ over the recorded plan's optimizer steps of ⌈rank 0's rows / {micro}⌉ "
                 "(recorded_plan(run.step({step}), run.ppo_config()).steps). Critic: Σ over its updates u of "
                 "len(ppolab.numbers.critic_engine.critic_micro_batches(run, u, 0, step={step}, "
                 "max_token_len={budget}))."),
          context=("run",), case=reading_order_case)
def _e4(run=None) -> tuple[int, int]:
    from ppolab.numbers.critic_engine import critic_micro_batches
    from ppolab.run.reader import resolve_run

    r = resolve_run(run)
    c = reading_order_case(r)
    rec = r.step(c["step"])
    # the recorded plan fixes each optimizer step's rows on rank 0; a fixed micro size cuts them in ⌈rows/micro⌉
    actor = sum(-(-len(o.rows(0)) // c["micro"]) for o in rec.plan("actor").steps)
    if "critic_vpreds" not in rec.tensors:
        return actor, 0
    updates = int(rec.tensors["critic_vpreds"].shape[0])
    return actor, sum(len(critic_micro_batches(r, u, 0, step=c["step"], max_token_len=c["budget"]))
                      for u in range(updates))
