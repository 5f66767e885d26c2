"""Solutions to lab 02's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import torch

from ppolab import algos
from ppolab.run.reader import resolve_run


def largest_ratio(run=None, opt_step=-1, step=None):
    r = resolve_run(run)
    t = r.step(r.steps[-1] if step is None else step).tensors
    lp = t["actor_log_probs"][opt_step]
    rows = ~torch.isnan(lp).all(-1)
    ratio = algos.ppo_clip_terms(t["old_log_probs"][rows], lp[rows], t["advantages"][rows], 0.2, 0.2)["ratio"]
    return ratio[t["response_mask"][rows].bool()].max().item()


def bypass_max_gap(run=None, whole_batch=False, step=None):
    r = resolve_run(run, default="grpo_tiny_vllm_bf16")
    t = r.step(r.steps[0] if step is None else step).tensors
    lp = t["actor_log_probs"][0]
    rows = torch.ones(lp.shape[0], dtype=torch.bool) if whole_batch else ~torch.isnan(lp).all(-1)
    num = t["old_log_probs"] if whole_batch else lp        # off optimizer step 0's rows π_θ is NaN
    ratio = algos.ppo_clip_terms(t["rollout_log_probs"][rows], num[rows], t["advantages"][rows], 0.2, 0.2)["ratio"]
    return (ratio[t["response_mask"][rows].bool()] - 1).abs().max().item()


def bypass_ppo_kl(run=None, anchor="rollout_log_probs", absolute=False, whole_batch=False):
    r = resolve_run(run, default="grpo_tiny_vllm_bf16")
    t = r.step(r.steps[0]).tensors
    lp = t["actor_log_probs"][0]
    rows = ~torch.isnan(lp).all(-1)
    if whole_batch:                      # every row, π_θ taken as π_old (the gap figure's tokens)
        rows, lp = torch.ones_like(rows), t["old_log_probs"]
    d = t[anchor][rows] - lp[rows]
    d = d.abs() if absolute else d
    return algos.masked_mean(d, t["response_mask"][rows]).item()


def bypass_extra_tokens(run=None, count_pad=False):
    r = resolve_run(run, default="ppo_fire_tiny")
    t = r.step(r.steps[0]).tensors
    rows = torch.ones(t["is_pad"].shape, dtype=torch.bool) if count_pad else ~t["is_pad"].bool()
    return int((t["loss_mask"].bool() & ~t["response_mask"].bool())[rows].sum())


def is_what_if(run=None, clamp="max", own="recorded"):
    """pg_loss with the IS weights truncated at the prompt's threshold − with the run's own weights, written from
    ppolab.algos and the step's recorded tensors (``clamp``/``own`` make the wrong variants below)."""
    from ppolab.exercises import case
    from ppolab.numbers.steps import actor_config, global_batch_info, optimizer_step_batch

    r = resolve_run(run, default="grpo_tiny_vllm_bf16")
    c = case("02.5", run=r)
    rec = r.step(c["step"])
    t, cfg = rec.tensors, actor_config(r)
    raw = torch.exp(torch.clamp(t["old_log_probs"] - t["rollout_log_probs"], -20, 20)) * t["response_mask"]
    w_c = raw.clamp(max=c["threshold"]) if clamp == "max" else raw.clamp(min=c["threshold"]) * t["response_mask"]
    w_own = t["rollout_is_weights"] if own == "recorded" else None
    losses = {"what_if": [], "own": []}
    for k in range(t["actor_log_probs"].shape[0]):
        b = optimizer_step_batch(rec, k)
        info = global_batch_info(r, rec, k)
        for key, w in (("what_if", w_c), ("own", w_own)):
            pg, _ = algos.compute_policy_loss_vanilla(b["old_log_probs"], b["log_prob"], b["advantages"],
                                                      b["response_mask"], cfg.loss_agg_mode, cfg,
                                                      None if w is None else w[b["rows"]], global_batch_info=info)
            losses[key].append(float(pg))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return mean(losses["what_if"]) - mean(losses["own"])


def _with_minus_without(run=None):
    """The difference the lab's cell before the exercise prints: the run's own weights against none."""
    from ppolab.numbers import pg_loss_with_and_without_is
    out = pg_loss_with_and_without_is(run)
    return out["with_is"] - out["without_is"]


SOLUTIONS = {
    "02.1": bypass_ppo_kl,
    "02.2": bypass_extra_tokens,
    "02.3": lambda run=None: round(bypass_max_gap(run), 4),
    "02.4": largest_ratio,
    "02.5": is_what_if,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # decoupled mode's 0 (anchor unchanged); the mean |gap| instead of the signed mean; the sign the other way
    # round (log_prob − old); the gap over every row of the step instead of optimizer step 0's
    "02.1": [0.0, lambda run=None: bypass_ppo_kl(run, absolute=True), lambda run=None: -bypass_ppo_kl(run),
             lambda run=None: bypass_ppo_kl(run, whole_batch=True)],
    # "bypass only changes stage 4": nothing more; padding rows counted too (none are rejected: the same, so
    # not listed); all of the step's tokens; the step's tokens after rejection
    "02.2": [0, lambda run=None: int(resolve_run(run, default="ppo_fire_tiny").step(1).tensors["loss_mask"].sum()),
             lambda run=None: int(resolve_run(run, default="ppo_fire_tiny").step(1).tensors["response_mask"].sum())],
    # the decoupled ratio; the old/rollout gap over the whole batch (all 128 rows); at the last recorded step; ε
    "02.3": [0.0, lambda run=None: bypass_max_gap(run, whole_batch=True),
             lambda run=None: bypass_max_gap(run, step=resolve_run(run, default="grpo_tiny_vllm_bf16").steps[-1]),
             0.2],
    # "the clip caps the ratio at 1 + ε"; the first optimizer step (ratio 1); the third optimizer step's maximum
    "02.4": [1.2, 1.0, lambda run=None: largest_ratio(run, opt_step=2)],
    # "the weights are detached, so they change nothing"; the sign the other way round; the run's weights against
    # none (the number the cell above prints); the weights floored at the threshold instead of capped; the what-if
    # against no weights at all
    "02.5": [0.0, lambda run=None: -is_what_if(run), _with_minus_without, lambda run=None: is_what_if(run, clamp="min"),
             lambda run=None: is_what_if(run, own=None)],
}
