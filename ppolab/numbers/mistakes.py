"""Chapter §16's numbers for mistake 9 (the KL halves) and the drift away from π_ref."""
from __future__ import annotations

import torch

from ppolab.algos import FixedKLController, GlobalBatchInfo, agg_loss, apply_kl_penalty, get_policy_loss_fn
from ppolab.algos import kl_penalty, masked_mean
from ppolab.i18n import tr
from ppolab.numbers.steps import check_index, n_opt_steps, actor_config, loss_mask_of_real_rows, \
    optimizer_step_batch, real_rows
from ppolab.run.reader import Run, resolve_run
from ppolab.run.step import StepRecord


def mistake_setup(run, step, opt_step) -> tuple[Run, StepRecord, int, dict[str, torch.Tensor]]:
    r = resolve_run(run)
    rec = r.step(step)  # default: the last recorded step (the policy has moved away from π_ref by then)
    n = n_opt_steps(rec)
    k = n - 1 if opt_step is None else check_index("opt_step", opt_step, n)
    return r, rec, k, optimizer_step_batch(rec, k)


def pg_of(cfg, b, log_prob=None, mask=None, info: GlobalBatchInfo | None = None):
    """(pg_loss, metrics) of the run's policy loss on batch ``b`` (the registry entry the config names); ``info``:
    the global mini-batch counts (None: normalise by ``b`` itself)."""
    fn = get_policy_loss_fn(cfg.policy_loss.loss_mode)
    return fn(b["old_log_probs"], b["log_prob"] if log_prob is None else log_prob, b["advantages"],
              b["response_mask"] if mask is None else mask, cfg.loss_agg_mode, cfg, global_batch_info=info)


#: β values (reward side) and kl_loss_coef values (loss side) of the mistake-9 tables; all but the run's own
#: coefficient are what-ifs on the recorded tensors.
KL_SWEEP = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0)


def kl_drowning(run=None, step: int | None = None, betas=KL_SWEEP):
    """Mistake 9's "reward drowned by the KL" on the reward side (chapter §16, §7.1): the recorded scores and the
    π_old / π_ref log-probs of one step (default: the last recorded one of ``run``, default ``ppo_fire_tiny``, a run
    trained with the reward-side KL), shaped by ``apply_kl_penalty`` with ``FixedKLController(β)`` and the run's
    ``algorithm.kl_penalty`` for each β, over the tokens the trainer shaped: ``loss_mask`` (the mask as generated;
    rejection sampling rewrites ``response_mask`` only after the penalty). Real trajectories only.

    The run's own β at that step (``kl_ctrl.kl_coef`` for a fixed controller, the logged
    ``actor/reward_kl_penalty_coeff`` for an adaptive one) is added to ``betas``; its row reproduces the recorded
    ``token_level_rewards``. A DataFrame indexed by β: ``what_if`` (β is not the run's own), ``score_mean`` (Σ_t score
    per trajectory), ``penalty_mean`` (β·Σ_t KL_t per trajectory), ``penalty_over_score`` (ratio of the two means),
    ``reward_mean`` (Σ_t r_t) and ``corr_reward_score`` (Pearson correlation over trajectories of Σ_t r_t with the
    score: 1 = the reward still ranks trajectories by the task, near 0 = the KL decides).
    """
    import pandas as pd

    r = resolve_run(run, default="ppo_fire_tiny")
    rec = r.step(r.steps[-1] if step is None else step)
    t, real = rec.tensors, real_rows(rec)
    mask = loss_mask_of_real_rows(rec)
    alg = r.ppo_config().algorithm
    own = None
    if alg.use_kl_in_reward:
        own = alg.kl_ctrl.kl_coef
        col = "actor/reward_kl_penalty_coeff"
        if alg.kl_ctrl.type == "adaptive" and col in r.metrics.columns:
            own = float(r.metrics.loc[rec.step, col])
    scores = t["token_level_scores"].float()
    rows = {}
    for beta in sorted(set(betas) | ({own} if own is not None else set())):
        rewards, _ = apply_kl_penalty(scores, t["old_log_probs"].float(), t["ref_log_prob"].float(), mask,
                                      FixedKLController(beta), alg.kl_penalty)
        score, reward = scores.sum(-1)[real], rewards.sum(-1)[real]
        penalty = score - reward
        corr = torch.corrcoef(torch.stack([reward, score]))[0, 1]
        rows[beta] = {"what_if": own is None or beta != own, "score_mean": float(score.mean()),
                      "penalty_mean": float(penalty.mean()),
                      "penalty_over_score": float(penalty.mean() / score.mean()),
                      "reward_mean": float(reward.mean()), "corr_reward_score": float(corr)}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = tr("beta")
    return out


def _ratio(a: float, b: float) -> float:
    """a / b, inf (or NaN for 0 / 0) when b is 0: a step whose advantages are all 0 has no policy gradient."""
    return a / b if b else (float("inf") if a else float("nan"))


def kl_term_vs_policy_gradient(run=None, step: int | None = None, opt_step: int | None = None, coefs=KL_SWEEP):
    """Mistake 9's "reward drowned by the KL" on the loss side (chapter §16, §7.2, §15): on one recorded optimizer
    step (default: the last one of the last recorded step of ``run``, default ``ppo_fire_tiny``) the policy loss and
    the loss-side KL term ``kl_loss_coef · agg_loss(kl_penalty(log π_θ, log π_ref, kl_loss_type))``, each with its
    gradient with respect to the token log-probs log π_θ — what the backward pass carries into the model.

    A DataFrame indexed by the coefficient c: ``what_if`` (c is not the run's own), ``kl_term`` (c·kl_loss),
    ``abs_pg_loss``, ``loss_ratio`` (c·kl_loss / |pg_loss|, the reading rule of chapter §15), ``grad_kl``
    (‖∂ c·kl_loss / ∂ log π‖), ``grad_pg`` (‖∂ pg_loss / ∂ log π‖) and ``grad_ratio``.
    """
    import pandas as pd

    r, _rec, _k, b = mistake_setup(resolve_run(run, default="ppo_fire_tiny"), step, opt_step)
    cfg = actor_config(r)
    own = cfg.kl_loss_coef if cfg.use_kl_loss else None
    lp = b["log_prob"].clone().requires_grad_(True)
    pg, _ = pg_of(cfg, b, log_prob=lp)
    (g_pg,) = torch.autograd.grad(pg, lp)
    lp = b["log_prob"].clone().requires_grad_(True)
    kl = agg_loss(kl_penalty(lp, b["ref_log_prob"], cfg.kl_loss_type), b["response_mask"], cfg.loss_agg_mode)
    (g_kl,) = torch.autograd.grad(kl, lp)
    pg, kl = abs(float(pg.detach())), float(kl.detach())
    n_pg, n_kl = float(g_pg.norm()), float(g_kl.norm())
    rows = {c: {"what_if": own is None or c != own, "kl_term": c * kl, "abs_pg_loss": pg,
                "loss_ratio": _ratio(c * kl, pg), "grad_kl": c * n_kl, "grad_pg": n_pg,
                "grad_ratio": _ratio(c * n_kl, n_pg)} for c in coefs}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "kl_loss_coef"
    return out


def reference_drift(run=None, pattern: str = "#### "):
    """How far the policy moved from π_ref over training, per recorded step of ``run`` (default ``grpo_tiny``),
    from the recorded tensors: the reference KL of the rollout batch (token means of ``kl_penalty(old_log_probs,
    ref_log_prob, ·)`` over the real valid tokens, k1 and k3), the share of real responses whose text contains
    ``pattern`` (the answer format the reward asks for), the mean score and the mean response length.
    """
    import pandas as pd

    r = resolve_run(run)
    rows = {}
    for s in r.steps:
        rec = r.step(s)
        t, real = rec.tensors, real_rows(rec)
        mask = t["response_mask"].float() * real.float().unsqueeze(-1)
        texts = rec.info.get("texts", {}).get("responses", [])
        real_texts = [x for x, keep in zip(texts, real.tolist()) if keep]
        rows[s] = {"ref_kl_k1": float(masked_mean(kl_penalty(t["old_log_probs"], t["ref_log_prob"], "k1"), mask)),
                   "ref_kl_k3": float(masked_mean(kl_penalty(t["old_log_probs"], t["ref_log_prob"], "k3"), mask)),
                   "format_share": (sum(pattern in x for x in real_texts) / len(real_texts)) if real_texts
                   else float("nan"),
                   "score_mean": float(t["token_level_scores"].sum(-1)[real].mean()),
                   "response_length_mean": float(t["response_mask"].sum(-1)[real].mean())}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = tr("step")
    return out
