"""Solutions to lab 08's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import torch

from ppolab.algos import AdaptiveKLController, kl_penalty, masked_mean
from ppolab.exercises.lab08 import e1_case, e2_case, e3_case, next_beta, reward_kl_statistic
from ppolab.run.reader import resolve_run
from ppolab.numbers.kl import full_log_probs, response_logits

RUN = "ppo_fire_tiny"


def _lps(run=None, temperature=0.7):
    src = response_logits(run or RUN, 1)
    m = src["mask"]
    return full_log_probs(src["logits"][m], temperature), full_log_probs(src["logits"][m], src["temperature"])


def exact_kl(run=None):
    lp_theta, lp_ref = _lps(run)
    return (lp_theta.exp() * (lp_theta - lp_ref)).sum(-1).mean().item()


def reverse_kl(run=None):
    lp_theta, lp_ref = _lps(run)
    return (lp_ref.exp() * (lp_ref - lp_theta)).sum(-1).mean().item()


def recorded_token_k1(run=None):
    """The sample mean of k1 over the recorded tokens (π_ref samples): an estimate, not the expectation."""
    src = response_logits(run or RUN, 1)
    lt = full_log_probs(src["logits"], 0.7).gather(-1, src["responses"].unsqueeze(-1)).squeeze(-1)
    lr = full_log_probs(src["logits"], src["temperature"]).gather(-1, src["responses"].unsqueeze(-1)).squeeze(-1)
    return (lt - lr)[src["mask"]].mean().item()


def my_next_beta(run=None, horizon=None):
    """What a learner writes: β of the case step (logged), the KL recomputed from its tensors, one update with the
    horizon the prompt names (``horizon``: another one, e.g. the run's own)."""
    r = resolve_run(run or RUN)
    c = e2_case(r)
    ctrl_cfg = r.config["algorithm"]["kl_ctrl"]
    ctrl = AdaptiveKLController(r.metrics.loc[c["step"], "actor/reward_kl_penalty_coeff"], ctrl_cfg["target_kl"],
                                c["what_if"] if horizon is None else horizon)
    ctrl.update(my_current_kl(r, c["step"]), len(r.step(c["step"]).tensors["responses"]))  # the run's estimator
    return ctrl.value


def my_clipped_beta(run=None, clip=True, horizon=None):
    """08.3 as a learner writes it: the error at the what-if target, clipped to ±0.2, one step of the controller."""
    r = resolve_run(run or RUN)
    c = e3_case(r)
    beta = r.metrics.loc[c["step"], "actor/reward_kl_penalty_coeff"]
    error = my_current_kl(r, c["step"]) / c["what_if"] - 1
    error = max(-0.2, min(0.2, error)) if clip else error
    rows = len(r.step(c["step"]).tensors["responses"])
    return beta * (1 + error * rows / (c["horizon"] if horizon is None else horizon))


def beta_shortcut(run=None, factor=None, sign=1.0):
    """β of the case step times a factor: 1 ± 0.2·n/horizon at the what-if horizon (the clipped error's step, ×1.1
    or ×0.9 here), or ``factor``."""
    r = resolve_run(run or RUN)
    c = e2_case(r)
    beta = r.metrics.loc[c["step"], "actor/reward_kl_penalty_coeff"]
    return beta * (factor if factor is not None else 1 + sign * 0.2 * c["rows"] / c["what_if"])


def my_current_kl(run=None, step=None, estimator=None):
    """The statistic apply_kl_penalty feeds the controller, with the run's estimator (or ``estimator``)."""
    t = resolve_run(run or RUN).step(e1_case(run)["step"] if step is None else step).tensors
    name = estimator or resolve_run(run or RUN).config["algorithm"]["kl_penalty"]
    kld = kl_penalty(t["old_log_probs"], t["ref_log_prob"], name) * t["loss_mask"]
    return torch.mean(masked_mean(kld, t["loss_mask"], axis=-1)).item()


def pooled_kl(run=None, step=None):
    t = resolve_run(run or RUN).step(e1_case(run)["step"] if step is None else step).tensors
    kld = kl_penalty(t["old_log_probs"], t["ref_log_prob"], "kl") * t["loss_mask"]
    return (kld.sum() / t["loss_mask"].sum()).item()


SOLUTIONS = {
    "08.1": lambda run=None: my_current_kl(run, estimator=e1_case(run)["other"]),
    "08.2": my_next_beta,
    "08.3": lambda run=None: my_clipped_beta(run),
    "08.4": {"reward-side": "old_log_probs", "loss-side": "log_prob"},
    "08.5": exact_kl,
    "08.6": lambda run=None: round(-reverse_kl(run), 3),
    "08.7": ("k3", "k1"),
    "08.8": {"k2", "k1+", "abs+", "k2+", "k3+"},
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the rollout's log-probs on the reward side; π_old on both sides; the two swapped
    "08.4": [{"reward-side": "rollout_log_probs", "loss-side": "log_prob"},
             {"reward-side": "old_log_probs", "loss-side": "old_log_probs"},
             {"reward-side": "log_prob", "loss-side": "old_log_probs"}],
    # the reverse direction; the sum over positions instead of the mean
    "08.5": [reverse_kl, lambda run=None: exact_kl(run) * int(response_logits(run or RUN, 1)["mask"].sum())],
    # KL(π_θ‖π_ref) (as if sampled from π_θ); +KL(π_ref‖π_θ); the noisy mean over the recorded tokens
    "08.6": [exact_kl, reverse_kl, recorded_token_k1],
    "08.7": [("k3", "k3"), ("k1", "k1"), ("k1", "k3")],
    # the estimators unbiased in value; k2 alone; all of them
    "08.8": [{"k1", "k3"}, {"k2"}, {"k1+", "k3+"}, {"k1", "abs", "k2", "k3", "k1+", "abs+", "k2+", "k3+"}],
    # the rejection-rewritten response_mask; the padding rows left out of the mean; the run's own estimator (the
    # logged value); all tokens pooled instead of a mean of per-sequence means
    "08.1": [lambda run=None: reward_kl_statistic(run, e1_case(run)["step"], mask="response_mask",
                                                  kl_penalty=e1_case(run)["other"]),
             lambda run=None: reward_kl_statistic(run, e1_case(run)["step"], real_rows_only=True,
                                                  kl_penalty=e1_case(run)["other"]),
             lambda run=None: resolve_run(run or RUN).metrics.loc[e1_case(run)["step"], "actor/reward_kl_penalty"],
             lambda run=None: my_current_kl(run),
             lambda run=None: pooled_kl(run)],
    # the clipped-error shortcut (β·1.1: as if KL/target − 1 were clipped to +0.2); 0.9·β; no update at all;
    # the rejection-rewritten response_mask; n_steps = the 60 real rows; the padding rows left out of the mean;
    # the run's own horizon (the β the log holds for the next step, copied or recomputed)
    # the error left unclipped; 08.2's what-if horizon carried over; the run's own target (08.2 at its own horizon,
    # the β the log holds); the old stated-number answer
    "08.3": [lambda run=None: my_clipped_beta(run, clip=False),
             lambda run=None: my_clipped_beta(run, horizon=e2_case(run)["what_if"]),
             lambda run=None: resolve_run(run or RUN).metrics.loc[e3_case(run)["next"],
                                                                  "actor/reward_kl_penalty_coeff"],
             0.001 * (1 - 0.2 * 64 / 1000)],
    "08.2": [beta_shortcut, lambda run=None: beta_shortcut(run, sign=-1.0), lambda run=None: beta_shortcut(run, 1.0),
             lambda run=None: next_beta(run, mask="response_mask", horizon=e2_case(run)["what_if"]),
             lambda run=None: next_beta(run, n_steps=60, horizon=e2_case(run)["what_if"]),
             lambda run=None: next_beta(run, real_rows_only=True, horizon=e2_case(run)["what_if"]),
             lambda run=None: resolve_run(run or RUN).metrics.loc[e2_case(run)["next"],
                                                                  "actor/reward_kl_penalty_coeff"],
             lambda run=None: my_next_beta(run, horizon=e2_case(run)["horizon"])],
}
