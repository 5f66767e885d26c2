"""Solutions to lab 16's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import torch

from ppolab.algos import AdaptiveKLController, agg_loss, apply_kl_penalty, get_policy_loss_fn, kl_penalty, masked_mean
from ppolab.exercises.lab16 import agg_case, beta_case, grad_case, rejected_case
from ppolab.numbers import actor_config, optimizer_step_batch, real_rows, resolve_run

RUN = "ppo_fire_tiny"


def rollout_ref_kl(run=None, estimator="k1", use_current=False):
    r = resolve_run(run, default=RUN)
    rec = r.step(r.steps[-1])
    t = rec.tensors
    mask = t["response_mask"].float() * real_rows(rec).float().unsqueeze(-1)
    if use_current:  # the loss-side pair: π_θ of the last optimizer step against π_ref
        b = optimizer_step_batch(rec, t["actor_log_probs"].shape[0] - 1)
        return masked_mean(kl_penalty(b["log_prob"], b["ref_log_prob"], estimator), b["response_mask"]).item()
    return masked_mean(kl_penalty(t["old_log_probs"], t["ref_log_prob"], estimator), mask).item()


def beta_star(run=None, per_token=False, estimator="kl", mask_key="loss_mask"):
    r = resolve_run(run, default=RUN)
    rec = r.step(r.steps[-1])
    t, real = rec.tensors, real_rows(rec)
    m = t[mask_key].float() * real.float().unsqueeze(-1)
    kld = kl_penalty(t["old_log_probs"], t["ref_log_prob"], estimator) * m
    score = t["token_level_scores"].sum(-1)[real].mean()
    if per_token:  # a token-mean KL against a per-trajectory score
        return float(score / (kld[real].sum() / m[real].sum()))
    return float(score / kld.sum(-1)[real].mean())


def coef_star(run=None, by_value=False, step=None):
    r = resolve_run(run, default=RUN)
    rec = r.step(grad_case(r)["step"] if step is None else step)
    b = optimizer_step_batch(rec, rec.tensors["actor_log_probs"].shape[0] - 1)
    cfg = actor_config(r)
    lp = b["log_prob"].clone().requires_grad_(True)
    pg, _ = get_policy_loss_fn(cfg.policy_loss.loss_mode)(b["old_log_probs"], lp, b["advantages"],
                                                          b["response_mask"], cfg.loss_agg_mode, cfg)
    (g_pg,) = torch.autograd.grad(pg, lp)
    lp2 = b["log_prob"].clone().requires_grad_(True)
    kl = agg_loss(kl_penalty(lp2, b["ref_log_prob"], cfg.kl_loss_type), b["response_mask"], cfg.loss_agg_mode)
    (g_kl,) = torch.autograd.grad(kl, lp2)
    if by_value:  # where c·kl_loss = |pg_loss|
        return round(abs(float(pg.detach())) / float(kl.detach()), 2)
    return round(float(g_pg.norm() / g_kl.norm()), 2)


def format_shares(run=None, pattern="#### "):
    r = resolve_run(run)
    out = []
    for s in (r.steps[0], r.steps[-1]):
        rec = r.step(s)
        texts = [x for x, keep in zip(rec.info["texts"]["responses"], real_rows(rec).tolist()) if keep]
        out.append(round(sum(pattern in x for x in texts) / len(texts), 3))
    return tuple(out)


def next_beta(run=None, step=None, n_rows=None, clip=True, mask_key="loss_mask", real_only=False):
    r = resolve_run(run, default=RUN)
    step = beta_case(r)["step"] if step is None else step
    rec = r.step(step)
    t, alg = rec.tensors, r.config["algorithm"]
    beta = float(r.metrics.loc[step, "actor/reward_kl_penalty_coeff"])
    ctl = alg["kl_ctrl"]
    rows = ~t["is_pad"].bool() if real_only else torch.ones(t["responses"].shape[0], dtype=torch.bool)
    m = t[mask_key].float()[rows]
    kld = kl_penalty(t["old_log_probs"][rows], t["ref_log_prob"][rows], alg["kl_penalty"]) * m
    current = float(masked_mean(kld, m, axis=-1).mean())
    if not clip:  # the proportional error without its ±0.2 clip
        n = int(rows.sum()) if n_rows is None else n_rows
        return beta * (1 + (current / ctl["target_kl"] - 1) * n / ctl["horizon"])
    ctrl = AdaptiveKLController(beta, ctl["target_kl"], ctl["horizon"])
    ctrl.update(current, int(rows.sum()) if n_rows is None else n_rows)
    return ctrl.value


def _logged_beta(run=None, step=None):
    step = beta_case(run)["step"] if step is None else step
    return float(resolve_run(run, default=RUN).metrics.loc[step, "actor/reward_kl_penalty_coeff"])


def next_beta_by_apply(run=None, step=None):  # the trainer's own call, then the controller's value
    r = resolve_run(run, default=RUN)
    step = beta_case(r)["step"] if step is None else step
    rec = r.step(step)
    t, alg = rec.tensors, r.config["algorithm"]
    ctrl = AdaptiveKLController(float(r.metrics.loc[step, "actor/reward_kl_penalty_coeff"]),
                                alg["kl_ctrl"]["target_kl"], alg["kl_ctrl"]["horizon"])
    apply_kl_penalty(t["token_level_scores"], t["old_log_probs"], t["ref_log_prob"], t["loss_mask"], ctrl,
                     alg["kl_penalty"])
    return ctrl.value


def rejected_in_denominator(run=None, step=None, opt_step=None, whole_step=False):
    c = rejected_case(run)
    step, opt_step = (c["step"] if step is None else step), (c["opt_step"] if opt_step is None else opt_step)
    rec = resolve_run(run, default=RUN).step(step)
    t = rec.tensors
    if whole_step:  # every rejected token of the training step, not only this mini-batch's
        return int(t["loss_mask"].sum() - t["response_mask"].sum())
    b = optimizer_step_batch(rec, opt_step)
    return int((t["loss_mask"][b["rows"]] * real_rows(rec)[b["rows"]].float().unsqueeze(-1)).sum()
               - b["response_mask"].sum())


def real_weight(run=None, step=None, opt_step=None, denominator="global", count_empty=False):
    r = resolve_run(run, default=RUN)
    c = agg_case(r)
    step, opt_step = (c["step"] if step is None else step), (c["opt_step"] if opt_step is None else opt_step)
    rec = r.step(step)
    b = optimizer_step_batch(rec, opt_step)
    real = real_rows(rec)[b["rows"]]
    rows = int(real.sum()) if count_empty else int((b["response_mask"].sum(-1) > 0).sum())
    if denominator == "real":  # normalised by the real rows, as if the padding rows did not exist
        return rows / int(real.sum())
    a = r.config["actor_rollout_ref"]
    return rows / (a["actor"]["ppo_mini_batch_size"] * a["rollout"]["n"])


def mistaken_betas(run=None, shortcut=None):
    """(β from response_mask, β without the padding rows) at beta_case's step, or a shortcut pair."""
    r = resolve_run(run, default=RUN)
    step = beta_case(r)["step"]
    if shortcut == "right":  # the trainer's own β, in both places
        return (next_beta(r, step),) * 2
    if shortcut == "geometric":  # 0.02 · 0.95^(step − 1): as if every earlier error had been clipped at −0.2
        return (r.config["algorithm"]["kl_ctrl"]["kl_coef"] * 0.95 ** (step - 1),) * 2
    if shortcut == "times_1.05":  # 1.05 × the logged β: as if the error were clipped at +0.2
        return (1.05 * _logged_beta(r, step),) * 2
    return (next_beta(r, step, mask_key="response_mask"), next_beta(r, step, real_only=True))


def mini_batch_mistake(n=4, tbs=128, wanted=64, mini=64, epochs=1):
    global_mini = mini * n  # the trainer multiplies ppo_mini_batch_size (prompts) by rollout.n
    return tbs * n // global_mini * epochs, global_mini, wanted // n


SOLUTIONS = {
    "16.1": rollout_ref_kl,
    "16.2": mistaken_betas,
    "16.3": rejected_in_denominator,
    "16.4": mini_batch_mistake(),
    "16.5": real_weight,
    "16.6": beta_star,
    "16.7": coef_star,
    "16.8": lambda run=None: format_shares(run or "grpo_tiny"),
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the loss-side pair (π_θ vs π_ref); the k3 estimator; the logged actor/ppo_kl of that step
    "16.1": [lambda run=None: rollout_ref_kl(run, use_current=True),
             lambda run=None: rollout_ref_kl(run, estimator="k3"),
             lambda run=None: float(resolve_run(run, default=RUN).metrics["actor/ppo_kl"].dropna().iloc[-1])],
    # the shortcuts that pass where the error is clipped — 0.02·0.95² and 1.05 × the logged β — and the trainer's own
    # β (the mistakes change nothing); the two mistakes swapped; n = 60 real rows but the KL mean still over 64;
    # β unchanged; the unclipped proportional error with n = 60
    "16.2": [lambda run=None: mistaken_betas(run, "geometric"), lambda run=None: mistaken_betas(run, "times_1.05"),
             lambda run=None: mistaken_betas(run, "right"), lambda run=None: mistaken_betas(run)[::-1],
             lambda run=None: (mistaken_betas(run)[0], next_beta(run, beta_case(run)["step"], n_rows=60)),
             lambda run=None: (_logged_beta(run),) * 2],
    # "rejected tokens are not counted"; the whole training step's rejected tokens; Σ loss_mask itself
    "16.3": [0, lambda run=None: rejected_in_denominator(run, whole_step=True),
             lambda run=None: rejected_in_denominator(run) + int(optimizer_step_batch(
                 resolve_run(run, default=RUN).step(rejected_case(run)["step"]),
                 rejected_case(run)["opt_step"])["response_mask"].sum())],
    # the colleague's own model (8 steps of 64, mini 64); × n applied to the steps, not the mini-batch; "set
    # ppo_mini_batch_size = 64 × 4"; the steps and the trajectories swapped
    "16.4": [(8, 64, 64), (32, 16, 16), (2, 256, 256), (256, 2, 16)],
    # every real row counted (forgot the row rejection sampling emptied); the local fallback (weights sum to 1);
    # the real rows as the denominator
    "16.5": [lambda run=None: real_weight(run, count_empty=True), 1.0,
             lambda run=None: real_weight(run, denominator="real")],
    # token-mean KL against a per-trajectory score; the k3 estimator; the run's own β; over response_mask (after
    # rejection sampling) instead of the tokens the trainer shaped
    "16.6": [lambda run=None: beta_star(run, per_token=True), lambda run=None: beta_star(run, estimator="k3"),
             lambda run=None: _logged_beta(run, step=resolve_run(run, default=RUN).steps[-1]),
             lambda run=None: beta_star(run, mask_key="response_mask")],
    # the value crossing (c·kl_loss = |pg_loss|); the run's own coefficient; "1 is where they match"
    "16.7": [lambda run=None: coef_star(run, by_value=True), 0.01, 1.0],
    # the score means instead of the format shares; "nobody writes the format at first"; from 0.5
    "16.8": [(0.234, 0.781), (0.0, 1.0), (0.5, 1.0)],
}
