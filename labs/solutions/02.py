"""Solutions to lab 02's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import torch

from ppolab import algos
from ppolab.record import resolve_run


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


SOLUTIONS = {
    "02.1": ("rollout_log_probs", False),
    "02.2": "vanilla",
    "02.3": lambda run=None: round(bypass_max_gap(run), 3),
    "02.4": largest_ratio,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the anchor of decoupled mode; IS weights still applied; the reference policy
    "02.1": [("old_log_probs", False), ("rollout_log_probs", True), ("ref_log_prob", False)],
    # the legacy (≤ 0.8) switch; the legacy loss_type value; the V1 loss_type default name
    "02.2": ["bypass_mode", "reinforce", "ppo_clip"],
    # the decoupled ratio; the old/rollout gap over the whole batch (all 128 rows); at the last recorded step; ε
    "02.3": [0.0, lambda run=None: bypass_max_gap(run, whole_batch=True),
             lambda run=None: bypass_max_gap(run, step=resolve_run(run, default="grpo_tiny_vllm_bf16").steps[-1]),
             0.2],
    # "the clip caps the ratio at 1 + ε"; the first optimizer step (ratio 1); the third optimizer step's maximum
    "02.4": [1.2, 1.0, lambda run=None: largest_ratio(run, opt_step=2)],
}
