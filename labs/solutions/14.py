"""Solutions to lab 14's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import math

from ppolab.train import resolve_config
from ppolab.run.reader import resolve_run


def counts(forget_n=False, one_epoch=False):
    out = []
    for preset in ("grpo_tiny", "ppo_gae_tiny"):
        cfg = resolve_config(preset)
        a, n = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.n
        traj = cfg.data.train_batch_size * n
        rows = a.ppo_mini_batch_size * (1 if forget_n else n)
        out.append((traj, traj // rows * (1 if one_epoch else a.ppo_epochs)))
    return tuple(out)


def observation_tokens(run=None, include_pad_rows=False):
    t = resolve_run(run, default="grpo_tool_tiny").step(1).tensors
    obs = t["response_attention_mask"].bool() & ~t["response_mask"].bool()
    return int(obs.sum() if include_pad_rows else obs[~t["is_pad"].bool()].sum())


def micro_count(run=None, count_observations=True):
    from ppolab.replay import mini_batch_rows

    r = resolve_run(run, default="grpo_tool_tiny")
    t = r.step(1).tensors
    rows = mini_batch_rows(r, 1, 0)
    response = t["response_attention_mask"] if count_observations else t["response_mask"]
    total = int((t["prompt_mask"].sum(-1) + response.sum(-1))[rows].sum())
    budget = r.ppo_config().actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    return math.ceil(total / budget)  # the fit loop adds nothing here: both halves fit the budget


SOLUTIONS = {
    "14.1": counts,
    "14.2": ("ref_log_prob", "compute_ref_log_prob"),
    "14.3": observation_tokens,
    "14.4": micro_count,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # forgot × n in the mini-batch; forgot the second epoch of GRPO; the two configs swapped
    "14.1": [lambda: counts(forget_n=True), lambda: counts(one_epoch=True), lambda: counts()[::-1]],
    # the critic's values (the critic stays); the reward-side stage itself; the loss-side tensor name
    "14.2": [("values", "compute_values"), ("token_level_rewards", "compute_advantage"),
             ("ref_log_prob", "compute_old_log_prob")],
    # every response token the model attends to; the loss-mask tokens; zero ("observations are masked away")
    "14.3": [lambda run=None: int(resolve_run(run, default="grpo_tool_tiny").step(1).tensors[
        "response_attention_mask"].sum()),
             lambda run=None: int(resolve_run(run, default="grpo_tool_tiny").step(1).tensors["response_mask"].sum()),
             0],
    # the budget counted on the loss-mask tokens only (observations forgotten); one row per micro-batch
    "14.4": [lambda run=None: micro_count(run, count_observations=False), 64],
}
