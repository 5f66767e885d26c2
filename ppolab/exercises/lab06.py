"""Lab 06 — assembling the actor loss; adv_estimator ⟂ loss_mode (chapter §5)."""
from __future__ import annotations

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers.cases import opt_step_case

#: The configuration of exercise 06.1 (on top of the run's own actor config).
E1_OVERRIDES = dict(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl",
                    loss_agg_mode="token-mean")


def e1_case(run=None) -> dict:
    """Exercise 06.1's optimizer step: 3 of recorded step 1, or its last one when it took fewer."""
    return opt_step_case(run, 3, 1)


def e1_metrics(run=None) -> tuple[float, dict[str, float]]:
    """(loss, metrics) of ``ppo_loss`` on recorded step 1, optimizer step :func:`e1_case`, with
    :data:`E1_OVERRIDES`."""
    from ppolab.numbers import actor_config, optimizer_step_batch, resolve_run, step_tensors

    r = resolve_run(run)
    b = optimizer_step_batch(step_tensors(r, 1), e1_case(r)["opt_step"])
    cfg = actor_config(r, **E1_OVERRIDES)
    loss, metrics = algos.ppo_loss(cfg, old_log_prob=b["old_log_probs"], log_prob=b["log_prob"],
                                   advantages=b["advantages"], response_mask=b["response_mask"],
                                   entropy=b["entropy"], ref_log_prob=b["ref_log_prob"])
    return float(loss), metrics


def toy_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four rows of different lengths, one advantage per row (as GRPO gives), float64."""
    g = torch.Generator().manual_seed(6)
    lp = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 2
    adv = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 6).clone()
    mask = torch.ones(4, 6, dtype=torch.float64)
    mask[0, 2:], mask[1, 4:] = 0, 0
    return lp, adv, mask


def _runnable_modes():
    """(name, ActorConfig) of every registered loss mode that runs on a default ActorConfig, with DRO's
    ``dro_beta`` (no default) set to 0.1; a mode that needs any other setting it lacks is left out."""
    from ppolab.config import ActorConfig

    lp, adv, mask = toy_batch()
    for mode in algos.POLICY_LOSS_REGISTRY:
        cfg = ActorConfig()
        cfg.policy_loss.loss_mode = mode
        if getattr(cfg.policy_loss, "dro_beta", 0.1) is None:
            cfg.policy_loss.dro_beta = 0.1
        try:
            algos.ppo_loss(cfg, old_log_prob=lp - 0.1, log_prob=lp, advantages=adv, response_mask=mask)
        except Exception:  # noqa: BLE001 — a mode that cannot run on defaults is not part of the question
            continue
        yield mode, cfg


@exercise("06.1", "Recorded step 1, optimizer step {opt_step}, with entropy_coeff = 0.01, use_kl_loss on, "
          "kl_loss_coef = 0.1, "
          "kl_loss_type = low_var_kl, token-mean: write the total actor loss from the metrics "
          "actor/pg_loss, actor/entropy_loss, actor/kl_loss and the two coefficients.",
          kind="compute",
          hints=("Three terms: the PG loss, the entropy bonus, the reference penalty. Which one is subtracted?",
                 "loss = pg_loss − entropy_coeff · entropy_loss + kl_loss_coef · kl_loss (chapter §5)."),
          context=("run",), needs=("step1", "reference"), case=e1_case)
def _e1(run=None) -> float:
    return e1_metrics(run)[0]


@exercise("06.2", "Which registered loss modes never look at old_log_prob (no ratio at all)? A set of names.",
          kind="lookup",
          hints=("Change old_log_prob and keep everything else: which losses do not move?",
                 "A mode ignores old_log_prob when ppo_loss(cfg, old_log_prob=old_a, log_prob=lp, …) == "
                 "ppo_loss(cfg, old_log_prob=old_b, log_prob=lp, …) for two different old_log_prob tensors; loop "
                 "over POLICY_LOSS_REGISTRY."))
def _e2() -> set[str]:
    lp, adv, mask = toy_batch()
    out = set()
    for mode, cfg in _runnable_modes():
        a = algos.ppo_loss(cfg, old_log_prob=lp - 0.5, log_prob=lp, advantages=adv, response_mask=mask)[0]
        b = algos.ppo_loss(cfg, old_log_prob=lp + 0.3, log_prob=lp, advantages=adv, response_mask=mask)[0]
        if torch.equal(a, b):
            out.add(mode)
    return out


def agg_case(run=None) -> dict:
    """The run's own loss_agg_mode (exercise 06.3's prompt names it)."""
    from ppolab.numbers import actor_config, resolve_run

    return {"agg": actor_config(resolve_run(run)).loss_agg_mode}


@exercise("06.3", "Predict, then verify: actor/pg_loss of recorded step 1, optimizer step 0 (every ratio is exactly "
          "1 there), with the run's own config (loss_agg_mode = {agg}). 4 decimals.",
          kind="predict",
          hints=("At ratio 1 the vanilla loss is −A per token. GRPO advantages sum to zero inside each group — so "
                 "what is left depends on how {agg} weighs a long trajectory against a short one.",
                 "pg_loss = agg_loss(−advantages, response_mask, '{agg}') on optimizer_step_batch(run.step(1), 0), "
                 "normalised by the global mini-batch: token-mean by Σ loss_mask "
                 "(−Σ_{i,t} A_{i,t} m_{i,t} / Σ loss_mask; rejected tokens still count), the seq-mean modes by "
                 "ppo_mini_batch_size × n rows (padding rows counted)."),
          rel=0.0, abs=1e-4, context=("run",), needs=("step1",), case=agg_case)
def _e3(run=None) -> float:
    from ppolab.numbers import actor_config, optimizer_step_batch, resolve_run, step_tensors
    from ppolab.numbers.steps import global_batch_info

    r = resolve_run(run)
    rec = step_tensors(r, 1)
    b = optimizer_step_batch(rec, 0)
    return algos.ppo_loss(actor_config(r), old_log_prob=b["old_log_probs"], log_prob=b["log_prob"],
                          advantages=b["advantages"], response_mask=b["response_mask"], entropy=b.get("entropy"),
                          ref_log_prob=b.get("ref_log_prob"),
                          global_batch_info=global_batch_info(r, rec, 0))[1]["actor/pg_loss"]


@exercise("06.4", "On the batch lp, adv, mask = toy_batch() at ratio exactly 1 (old_log_prob = lp) with "
          "loss_agg_mode = token-mean: which registered loss modes give the same gradient with respect to log_prob as "
          "vanilla (vanilla included)? A set of names.",
          kind="compute",
          hints=("Differentiate each loss at r = 1: most become −A·∇log π, whatever their value. Then look for the "
                 "ones that aggregate differently, or change individual tokens.",
                 "Loop over POLICY_LOSS_REGISTRY: x = lp.clone().requires_grad_(True); ppo_loss(cfg, "
                 "old_log_prob=lp, log_prob=x, advantages=adv, response_mask=mask)[0].backward(); compare x.grad "
                 "with vanilla's (torch.allclose). Give dro a dro_beta. SAPO "
                 "always uses seq-mean-token-mean, geo_mean a plain mean over sequences, and clip_cov drops the loss "
                 "of a random token whose covariance lies in (clip_cov_lb, clip_cov_ub)."))
def _e4() -> set[str]:
    lp, adv, mask = toy_batch()

    def grad(cfg):
        x = lp.clone().requires_grad_(True)
        algos.ppo_loss(cfg, old_log_prob=lp.clone(), log_prob=x, advantages=adv, response_mask=mask)[0].backward()
        return x.grad

    modes = dict(_runnable_modes())
    reference = grad(modes["vanilla"])
    return {mode for mode, cfg in modes.items() if torch.allclose(grad(cfg), reference, rtol=1e-9, atol=1e-12)}


#: The token of exercise 06.5: ratio, advantage and old probability π_old, under a bare ActorConfig (ε = 0.2, c = 3).
E5_TOKEN = dict(ratio=1.3, advantage=1.0, old_prob=0.5)


@exercise("06.5", "A token with ratio r = 1.3, advantage A = +1 and old probability π_old = 0.5, alone in its "
          "sequence, under a default ActorConfig (ε = 0.2, clip_ratio_c = 3; dro_beta = 0.1): which registered loss "
          "modes give it a gradient weight of exactly 0? A set of names.",
          kind="compute",
          hints=("r = 1.3 is past 1 + ε with A > 0. Which modes switch the token off there, which only bound its "
                 "weight (a stop-gradient clipped ratio), and which measure the move in probability, not in ratio?",
                 "For each mode, gradient_weights(mode, [1.3], 1.0, ActorConfig(), old_prob=0.5) from "
                 "ppolab.numbers.gradients (autograd through POLICY_LOSS_REGISTRY[mode]); keep the modes where it is "
                 "0. dppo_tv drops a token only when π_θ − π_old > δ: here 0.5·0.3 = 0.15 ≤ 0.2."))
def _e5() -> set[str]:
    from ppolab.config import ActorConfig
    from ppolab.numbers.gradients import gradient_weights

    t = E5_TOKEN
    return {mode for mode in algos.POLICY_LOSS_REGISTRY
            if gradient_weights(mode, [t["ratio"]], t["advantage"], ActorConfig(), old_prob=t["old_prob"]).item() == 0}
