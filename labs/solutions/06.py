"""Solutions to lab 06's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import torch

from ppolab.algos import POLICY_LOSS_REGISTRY, agg_loss, ppo_loss
from ppolab.config import ActorConfig
from ppolab.exercises.lab06 import e1_metrics, toy_batch
from ppolab.numbers.gradients import gradient_weights
from ppolab.numbers.steps import loss_mask_of_real_rows
from ppolab.numbers import actor_config, optimizer_step_batch, resolve_run, step_tensors


def total_loss(run=None):
    _, m = e1_metrics(run)
    return m["actor/pg_loss"] - 0.01 * m["actor/entropy_loss"] + 0.1 * m["actor/kl_loss"]


def total_loss_entropy_added(run=None):
    _, m = e1_metrics(run)
    return m["actor/pg_loss"] + 0.01 * m["actor/entropy_loss"] + 0.1 * m["actor/kl_loss"]


def total_loss_without_kl(run=None):
    _, m = e1_metrics(run)
    return m["actor/pg_loss"] - 0.01 * m["actor/entropy_loss"]


def pg_loss_at_ratio_one(run=None):
    r = resolve_run(run)
    rec = step_tensors(r, 1)
    b = optimizer_step_batch(rec, 0)
    actor, arr = actor_config(r), r.ppo_config().actor_rollout_ref
    # token-mean over Σ loss_mask (tokens rejected after sampling still count), a seq-mean mode over the global
    # mini-batch's ppo_mini_batch_size × n rows
    tokens = loss_mask_of_real_rows(rec)[b["rows"]].sum().item()
    return float(agg_loss(-b["advantages"], b["response_mask"], actor.loss_agg_mode, batch_num_tokens=tokens,
                          global_batch_size=arr.actor.ppo_mini_batch_size * arr.rollout.n,
                          loss_scale_factor=actor.loss_scale_factor))


def _config(mode):
    cfg = ActorConfig()
    cfg.policy_loss.loss_mode = mode
    if cfg.policy_loss.dro_beta is None:
        cfg.policy_loss.dro_beta = 0.1
    return cfg


def no_ratio_modes():
    lp, adv, mask = toy_batch()
    out = set()
    for mode in POLICY_LOSS_REGISTRY:
        a = ppo_loss(_config(mode), old_log_prob=lp - 0.5, log_prob=lp, advantages=adv, response_mask=mask)[0].item()
        b = ppo_loss(_config(mode), old_log_prob=lp + 0.3, log_prob=lp, advantages=adv, response_mask=mask)[0].item()
        if a == b:
            out.add(mode)
    return out


def same_gradient_modes():
    lp, adv, mask = toy_batch()
    grads = {}
    for mode in POLICY_LOSS_REGISTRY:
        x = lp.clone().requires_grad_(True)
        ppo_loss(_config(mode), old_log_prob=lp.clone(), log_prob=x, advantages=adv, response_mask=mask)[0].backward()
        grads[mode] = x.grad
    return {m for m, g in grads.items() if torch.allclose(g, grads["vanilla"], rtol=1e-9, atol=1e-12)}


def zero_weight_modes():
    return {mode for mode in POLICY_LOSS_REGISTRY
            if gradient_weights(mode, [1.3], 1.0, ActorConfig(), old_prob=0.5).item() == 0.0}


SOLUTIONS = {
    "06.1": total_loss,
    "06.2": no_ratio_modes,
    "06.3": pg_loss_at_ratio_one,
    "06.4": same_gradient_modes,
    "06.5": zero_weight_modes,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    "06.1": [total_loss_entropy_added, total_loss_without_kl,
             lambda run=None: e1_metrics(run)[1]["actor/pg_loss"]],
    "06.2": [{"reinforce", "gpg"}, {"gpg", "cispo"}, set(), {"vanilla"}],
    "06.3": [0.0, lambda run=None: -pg_loss_at_ratio_one(run),
             # optimizer step 3 (the ratio has moved) instead of step 0
             lambda run=None: e1_metrics(run)[1]["actor/pg_loss"]],
    # vanilla alone; the modes whose *value* equals vanilla's at r = 1; every mode
    "06.4": [{"vanilla"}, {"vanilla", "gspo", "bypass_mode", "kl_cov"}, set(POLICY_LOSS_REGISTRY)],
    # cispo "clips" too (but only bounds the weight); the trust-region modes "drop" a big move (not this one: the
    # probability moved 0.15 ≤ δ); bypass_mode forgotten (it is vanilla against the rollout log-probs)
    "06.5": [{"vanilla", "gspo", "clip_cov", "geo_mean", "bypass_mode", "cispo"},
             {"vanilla", "gspo", "clip_cov", "geo_mean", "bypass_mode", "dppo_tv", "dppo_kl"},
             {"vanilla", "gspo", "clip_cov", "geo_mean"}, {"vanilla"}],
}
