"""Lab 12 — batch, mini-batch, micro-batch (chapter §11–§12, §9 for the synthetic padding rows)."""
from __future__ import annotations


from ppolab.exercises import exercise


@exercise("12.1", "Predict, then verify: recorded step 1 of the run — how many actor optimizer steps did it take, "
                  "and how many rows (trajectories) did each one train on? Answer (optimizer steps, rows).",
          kind="predict",
          hints=("Read the run's config: data.train_batch_size, rollout.n, actor.ppo_mini_batch_size, ppo_epochs. "
                 "ppo_mini_batch_size counts prompts; the trainer multiplies it by rollout.n (§11.2).",
                 "rows = ppo_mini_batch_size × n; steps = (train_batch_size × n) / rows × ppo_epochs. On the "
                 "recorded tensors: actor_log_probs.shape[0], and the rows of actor_log_probs[k] that are not NaN."),
          context=("run",), needs=("step1",))
def _e1(run=None) -> tuple[int, int]:
    from ppolab.numbers import step_tensors

    rec = step_tensors(run, 1)
    steps = rec.plan("actor").steps
    rows = {len(o.rows()) for o in steps}
    assert len(rows) == 1
    return len(steps), rows.pop()


@exercise("12.2", "Predict, then verify with plan_batches: train_batch_size = 64, rollout.n = 4, "
                  "ppo_mini_batch_size = 16, 4 DP ranks, "
                  "ppo_micro_batch_size_per_gpu = 4, 2 epochs: how many optimizer steps per training step, and how "
                  "many gradient-accumulation waves per mini-batch? Answer (optimizer steps, waves).",
          kind="predict",
          hints=("First turn every size into trajectories (× n), then split the global mini-batch over the DP "
                 "ranks before you cut it into micro-batches.",
                 "steps = (64·4)/(16·4) × 2; waves = local mini / micro = (16·4/4)/4 — plan_batches(64, 4, 16, 4, "
                 "4, 2).optimizer_steps and .micro_batches_per_mini."))
def _e2() -> tuple[int, int]:
    from ppolab.batching import plan_batches

    p = plan_batches(64, 4, 16, 4, 4, 2)
    return p.optimizer_steps, p.micro_batches_per_mini


@exercise("12.3", "Predict, then verify with the balance stage: train_batch_size = 32, rollout.n = 5, "
                  "ppo_mini_batch_size = 6, 1 DP rank, "
                  "ppo_micro_batch_size_per_gpu = 2, 1 epoch, no critic: the V1 trainer pads the batch with "
                  "synthetic rows instead of rejecting it. How many synthetic rows does the balance stage append, "
                  "and how many optimizer steps per epoch does the padded batch take? "
                  "Answer (synthetic rows, optimizer steps per epoch).",
          kind="predict",
          hints=("The batch must become a multiple of the global mini-batch (and of the DP size) — counted in "
                 "trajectories, not prompts. The synthetic rows count like any other row for the step count.",
                 "multiple = lcm(dp_size, ppo_mini_batch_size × n) = lcm(1, 6 × 5); synthetic = (−32·5) mod "
                 "multiple; steps = (160 + synthetic) / 30 — plan_batches(32, 5, 6, 1, 2, 1, "
                 "pad_to=padding_multiple(1, 30)).padding_rows and .optimizer_steps_per_epoch."))
def _e3() -> tuple[int, int]:
    from ppolab.batching import padding_multiple, plan_batches

    plan = plan_batches(32, 5, 6, 1, 2, 1, pad_to=padding_multiple(1, 6 * 5))
    return plan.padding_rows, plan.optimizer_steps_per_epoch


@exercise("12.4", "Predict, then verify: the first mini-batch of recorded step 1, use_dynamic_bsz with "
                  "ppo_max_token_len_per_gpu = 128. How many micro-batches does the engine cut (verl 0.9.1 "
                  "behaviour, which ppolab follows)?",
          kind="predict",
          hints=("Start from ceil(total tokens / budget), tokens = prompt + response per row. Then remember what "
                 "0.9.1 does when a Karmarkar–Karp partition overshoots the budget.",
                 "len(plan_dynamic_micro_batches(rec.opt_step(0).seq_lens(), 128)): ceil(ΣL / 128), "
                 "plus one micro-batch per retry of the fit loop until every micro-batch holds ≤ 128 tokens."),
          context=("run",), needs=("step1",))
def _e4(run=None) -> int:
    from ppolab.batching import plan_dynamic_micro_batches
    from ppolab.numbers import step_tensors

    # rank 0's share of optimizer step 0, in the order its loader gave the rows: what the worker cut
    return len(plan_dynamic_micro_batches(step_tensors(run, 1).opt_step(0).seq_lens(), 128))


#: Exercise 12.5's overrides: a fixed critic micro-batch of 2 rows (3, 4, … where 2 rows would cut as many
#: micro-batches as the engine: the two counts must differ to tell them apart), and the token budget the V1 critic
#: engine reads.
CRITIC_MICRO, CRITIC_BUDGET = 2, 48


def critic_mini_batch(run=None):
    """(rank 0's rows of the first critic mini-batch of recorded step 1, as a Batch; the critic config): the rows
    ``TrainingWorker`` gives rank 0 first, read from the critic's update plan (``ppolab.update_plan``)."""
    from ppolab.batch import Batch
    from ppolab.numbers.critic_engine import critic_plan
    from ppolab.run.reader import resolve_run

    r = resolve_run(run, default="ppo_fire_tiny")
    rows = critic_plan(r, 1).steps[0].shares[0]
    return Batch(r.step(1).batch_tensors()).select(rows), r.ppo_config().critic


def critic_budget_case(run=None) -> dict:
    """Exercise 12.5's numbers: the fixed micro-batch, the budget (:data:`CRITIC_BUDGET`, or the longest row of the
    mini-batch when that is longer — a budget must hold every row), the mini-batch's rows and tokens."""
    from ppolab.numbers.critic_engine import critic_micro_batches

    mb, _ = critic_mini_batch(run)
    lens = mb.seq_lens()
    budget = max(CRITIC_BUDGET, max(lens))
    engine = len(critic_micro_batches(run, update=0, rank=0, step=1, max_token_len=budget))
    micro = next((m for m in range(CRITIC_MICRO, len(lens) + 1) if -(-len(lens) // m) != engine), CRITIC_MICRO)
    return {"micro": micro, "budget": budget, "rows": len(lens), "tokens": sum(lens)}


@exercise("12.5", "Predict, then verify — the critic as verl V1 wires it (§11.6): recorded step 1, rank 0's first "
                  "critic mini-batch ({rows} rows, {tokens} tokens). The run is given critic.use_dynamic_bsz=false, "
                  "critic.ppo_micro_batch_size_per_gpu={micro} and +critic.ppo_infer_max_token_len_per_gpu={budget}. "
                  "How many micro-batches does the critic engine cut that mini-batch into, and how many would the "
                  "top-level micro-batch field have cut? Answer (critic engine, top-level field).",
          kind="predict",
          hints=("V1's trainer_base.py hands the critic engine one field only, ppo_infer_max_token_len_per_gpu, for "
                 "the value forward and the update alike; the engine keeps EngineConfig's use_dynamic_bsz=True. "
                 "So the {micro}-row micro-batch is never used: count token-budget partitions, with 0.9.1's fit "
                 "loop.",
                 "engine: len(micro_batches(mini_batch, None, {budget})) — ceil(ΣL / {budget}) plus one per retry "
                 "of the fit loop; top-level field: len(micro_batches(mini_batch, {micro}, None)) = ceil({rows} / "
                 "{micro}). mini_batch = ppolab.exercises.lab12.critic_mini_batch(run)[0]."),
          context=("run",), needs=("step1", "critic"), case=critic_budget_case, default_run="ppo_fire_tiny")
def _e5(run=None) -> tuple[int, int]:
    from ppolab.numbers.critic_engine import critic_micro_batches
    from ppolab.update_plan import micro_batches

    case = critic_budget_case(run)
    # CriticWorker.engine_batching: no fixed size, the one budget ppo_infer_max_token_len_per_gpu, with the count
    # agreed over the data-parallel ranks (all-reduce MAX, then the fit loop on every rank) as the engine does
    engine = critic_micro_batches(run, update=0, rank=0, step=1, max_token_len=case["budget"])
    # what the top-level field asks for (the actor's rule, Worker.train_batching): a fixed size
    top = micro_batches(critic_mini_batch(run)[0], case["micro"], None)
    return len(engine), len(top)


#: Exercise 12.6's worker: actor.shuffle = true, data_loader_seed 42, this rank of two, its rows, local mini, epochs.
SHUFFLE = {"seed": 42, "rank": 1, "rows": 8, "local_mini": 4, "epochs": 2, "step": 7}


@exercise("12.6", "Predict, then verify — actor.shuffle=true (§12.1–§12.2): data_loader_seed = 42, DP rank 1 of 2, "
                  "8 rows on the rank, a local mini-batch of 4, ppo_epochs = 2. At training step 7, which of the "
                  "rank's rows (positions 0–7) does the first mini-batch of the second epoch hold? Answer a set.",
          kind="predict",
          hints=("The worker builds its iterator afresh at every update, seeded with data_loader_seed + dp_rank; "
                 "epoch e draws the e-th permutation from that one generator. Does the training step enter the "
                 "seed?",
                 "mini_batch_indices(8, 4, 2, shuffle=True, seed=42 + 1)[1][0] — the same at every training step "
                 "(verl make_iterator; ppolab.update_plan.plan_update calls it once per update, for every rank)."))
def _e6() -> set[int]:
    from types import SimpleNamespace

    from ppolab.update_plan import InferBatching, RankRows, plan_update

    s = SHUFFLE
    # the worker's own planner, on two ranks of s["rows"] rows each (one response per prompt): rank r holds the
    # row ids r·rows … (r + 1)·rows − 1 of the balanced batch
    ranks = [RankRows(list(range(r * s["rows"], (r + 1) * s["rows"])), [1] * s["rows"], [1] * s["rows"],
                      [1.0] * s["rows"]) for r in range(2)]
    worker = SimpleNamespace(ppo_mini_batch_size=2 * s["local_mini"], ppo_epochs=s["epochs"], shuffle=True,
                             data_loader_seed=s["seed"], loss_scale_factor=None)
    plan = plan_update(ranks, worker, InferBatching(s["local_mini"]), role="actor", rollout_n=1)
    first_of_second_epoch = next(o for o in plan.steps if o.epoch == 1 and o.mini_batch == 0)
    return {row - s["rank"] * s["rows"] for row in first_of_second_epoch.shares[s["rank"]]}
