"""Chapter §7's numbers: the adaptive KL controller replayed on a run, and §7.3's estimators on full distributions
(the base model's logits at every response position of a recorded step)."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from ppolab.algos import AdaptiveKLController, kl_penalty
from ppolab.numbers.steps import real_rows, step_tensors
from ppolab.record import Run, resolve_run


#: The canonical estimators drawn together (aliases kl=k1, mse=k2, low_var_kl=k3 give the same curves).
CANONICAL = ("k1", "abs", "k2", "k3")


def _mask_before_rejection(rec) -> torch.Tensor:
    """(N, R) float mask of the policy's sampled tokens of real rows as stage 7 received it: the recorded
    ``loss_mask`` (a copy of response_mask made at generation; rejection sampling rewrites only response_mask,
    verl V1), or ``response_mask`` for a recording without one."""
    t = rec.tensors
    return t.get("loss_mask", t["response_mask"]).float() * real_rows(rec).float().unsqueeze(-1)


def adaptive_kl_trace(run: Run | str | None = None) -> dict[str, Any]:
    """The reward-side KL controller of a run, step by step, and its replay (chapter §7.1).

    Returns ``steps`` (the training steps that logged the reward KL), ``kl`` (``actor/reward_kl_penalty``: the
    statistic apply_kl_penalty fed the controller), ``beta`` (``actor/reward_kl_penalty_coeff``: the β that step
    used, read before the update), ``replay`` (β replayed by :func:`replay_adaptive_kl` from ``kl`` with the run's
    ``algorithm.kl_ctrl`` and ``n_steps``), ``n_steps`` (rows of the balanced batch, padding rows included: what
    apply_kl_penalty passes) and the controller settings ``kl_coef``, ``target_kl``, ``horizon``, ``type``.
    """
    r = resolve_run(run)
    m = r.metrics
    if "actor/reward_kl_penalty" not in m.columns or m["actor/reward_kl_penalty"].isna().all():
        raise ValueError(f"{r.path} has no reward-side KL (algorithm.use_kl_in_reward=false)")
    logged = m[["actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"]].dropna()  # step 0: validation only
    ctrl = r.ppo_config().algorithm.kl_ctrl
    n_steps = int(step_tensors(r, None).tensors["responses"].shape[0])
    kl = logged["actor/reward_kl_penalty"].astype(float).tolist()
    if ctrl.type == "adaptive":
        replay = replay_adaptive_kl(kl, float(ctrl.kl_coef), float(ctrl.target_kl), float(ctrl.horizon), n_steps)
    else:
        replay = [float(ctrl.kl_coef)] * len(kl)
    return {"steps": [int(s) for s in logged.index], "kl": kl,
            "beta": logged["actor/reward_kl_penalty_coeff"].astype(float).tolist(), "replay": replay,
            "n_steps": n_steps, "type": ctrl.type, "kl_coef": ctrl.kl_coef, "target_kl": ctrl.target_kl,
            "horizon": ctrl.horizon}


def replay_adaptive_kl(
    kl_series: list[float], init_kl_coef: float, target_kl: float, horizon: float, n_steps: int
) -> list[float]:
    """β used at each step when an :class:`AdaptiveKLController` sees ``kl_series`` (β read before update)."""
    ctrl = AdaptiveKLController(init_kl_coef=init_kl_coef, target_kl=target_kl, horizon=horizon)
    betas = []
    for kl in kl_series:
        betas.append(ctrl.value)
        ctrl.update(current_kl=kl, n_steps=n_steps)
    return betas


#: The four base estimators and their straight-through forms, in the order the tables show them.
ESTIMATORS_AND_ST = ("k1", "abs", "k2", "k3", "k1+", "abs+", "k2+", "k3+")


@functools.lru_cache(maxsize=4)
def _response_logits(path: str, step: int | None) -> dict[str, Any]:
    from ppolab.models import load_tokenizer_and_model
    from ppolab.roles import position_ids_from_mask

    r = resolve_run(path)
    rec = step_tensors(r, step)
    t = rec.tensors
    _, model = load_tokenizer_and_model(run_base_model(r))
    ids = torch.cat([t["prompts"], t["responses"]], dim=1)
    # the ref pass ran before rejection sampling rewrote response_mask: attend to every token it attended to
    seen = t.get("response_attention_mask", _mask_before_rejection(rec))
    attn = torch.cat([t["prompt_mask"], seen.long()], dim=1)
    P, R = t["prompts"].shape[1], t["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                       use_cache=False).logits
    mask = _mask_before_rejection(rec).bool()
    return {"logits": logits[:, P - 1 : P + R - 1].double(), "mask": mask, "responses": t["responses"],
            "temperature": float(rec.info.get("temperature", 1.0)), "record": rec}


def run_base_model(run: Run) -> Path:
    """The base model ``run`` was trained with, found by fingerprint (:meth:`ppolab.record.Run.model_path`); one
    that is not on this machine is a :class:`~ppolab.numbers.needs.RunLacks` — never another model."""
    from ppolab.errors import MissingFileError
    from ppolab.numbers.needs import RunLacks

    try:
        return run.model_path()
    except MissingFileError as e:
        raise RunLacks(f"its base model on this machine ({e})", run) from None


def response_logits(run: Run | str | None = None, step: int | None = None) -> dict[str, Any]:
    """The base model's full logits at every response position of a recorded step (cached per run and step).

    The base model is the run's own (:func:`run_base_model`: found by fingerprint, never another) — for a LoRA
    run that is exactly the reference policy (the actor with its adapters off). Returns
    ``logits`` (N, R, V) float64 before any temperature (the one-token shift applied: position j holds the logits
    that score response token j), ``mask`` (N, R) bool (the policy's sampled tokens of real rows, those that
    rejection sampling later dropped included), ``responses`` (N, R), ``temperature`` (the run's rollout
    temperature) and ``record``. Do not modify the tensors in place.
    """
    r = resolve_run(run)
    if step is None:
        if not r.steps:
            raise FileNotFoundError(f"{r.path} has no recorded steps; train with trainer.record_freq > 0")
        step = r.steps[0]
    return _response_logits(str(Path(r.path).resolve()), int(step))


def full_log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(z / T) over the vocabulary (the last dimension), float64."""
    return torch.log_softmax(logits.double() / temperature, dim=-1)


def exact_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p‖q) = Σ_a p(a)·(log p(a) − log q(a)) over the last dimension, from full log-probabilities."""
    return (logp.exp() * (logp - logq)).sum(-1)


def estimator_moments(lp_theta: torch.Tensor, lp_ref: torch.Tensor, lp_sample: torch.Tensor,
                      name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact mean and variance of ``kl_penalty(log π_θ(a), log π_ref(a), name)`` for a ∼ q, at every position.

    All three arguments are full log-distributions (…, V); q = exp(``lp_sample``). Nothing is sampled: the mean
    is Σ_a q(a)·k(a) and the variance Σ_a q(a)·(k(a) − mean)², so the numbers are the estimator's expectation
    and per-token variance, clamps included. Returns two tensors of shape (…).
    """
    k = kl_penalty(lp_theta, lp_ref, name)
    q = lp_sample.exp()
    mean = (q * k).sum(-1)
    return mean, (q * (k - mean.unsqueeze(-1)).square()).sum(-1)


def expected_estimator_gradient(theta_logits: torch.Tensor, lp_ref: torch.Tensor, name: str) -> torch.Tensor:
    """∇ of E_{a∼π_θ}[kl_penalty(log π_θ(a), log π_ref(a), name)] w.r.t. π_θ's (temperature-scaled) logits,
    with the sampled tokens held fixed — what the trainer's loss gradient is on average: samples are data, so
    no score-function term. ``theta_logits`` (…, V) are the logits π_θ = softmax(theta_logits); returns (…, V)."""
    u = theta_logits.detach().double().clone().requires_grad_(True)
    lp = torch.log_softmax(u, dim=-1)
    q = lp.detach().exp()
    (q * kl_penalty(lp, lp_ref, name)).sum().backward()
    return u.grad


def kl_gradient(theta_logits: torch.Tensor, lp_ref: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """∇ of the exact KL(π_θ‖π_ref) (or, with ``reverse``, KL(π_ref‖π_θ)) w.r.t. π_θ's logits, summed over
    positions; (…, V)."""
    u = theta_logits.detach().double().clone().requires_grad_(True)
    lp = torch.log_softmax(u, dim=-1)
    (exact_kl(lp_ref, lp) if reverse else exact_kl(lp, lp_ref)).sum().backward()
    return u.grad


def _moments_table(logits: torch.Tensor, mask: torch.Tensor, ref_temperature: float, temperature: float,
                   names: tuple[str, ...]) -> dict[str, Any]:
    lp_ref = full_log_probs(logits[mask], ref_temperature)
    lp_theta = full_log_probs(logits[mask], temperature)
    kl = exact_kl(lp_theta, lp_ref).mean().item()
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for name in names:
        rows[name] = {}
        for sampler, lp_s in (("pi_theta", lp_theta), ("pi_ref", lp_ref)):
            mean, var = estimator_moments(lp_theta, lp_ref, lp_s, name)
            rows[name][sampler] = {"mean": mean.mean().item(), "bias": mean.mean().item() - kl,
                                   "var": var.mean().item(), "std": var.mean().sqrt().item()}
    return {"kl": kl, "reverse_kl": exact_kl(lp_ref, lp_theta).mean().item(), "rows": rows,
            "n_positions": int(mask.sum()), "temperature": temperature, "ref_temperature": ref_temperature}


def estimator_table(run: Run | str | None = None, step: int | None = None, temperature: float = 0.7,
                    names: tuple[str, ...] = CANONICAL) -> dict[str, Any]:
    """Every estimator against the exact KL at every valid response position of a recorded step.

    π_ref = the base model at the run's temperature; π_θ = the same model at ``temperature`` (a real, full
    distribution that differs from π_ref — runs record no weights of the trained policy). Returns ``kl``
    (mean over positions of KL(π_θ‖π_ref)), ``reverse_kl`` (of KL(π_ref‖π_θ)), ``rows`` (per estimator and
    sampler ``"pi_theta"`` / ``"pi_ref"``: ``mean`` = mean over positions of E_q[k], ``bias`` = mean − kl,
    ``var`` = mean over positions of Var_q[k], ``std`` = its square root) and ``n_positions``.
    """
    src = response_logits(run, step)
    return _moments_table(src["logits"], src["mask"], src["temperature"], temperature, names)


def gradient_table(run: Run | str | None = None, step: int | None = None, temperature: float = 0.7,
                   names: tuple[str, ...] = ESTIMATORS_AND_ST) -> dict[str, dict[str, float]]:
    """For each name: the relative distance ‖g − g*‖/‖g*‖ of its expected gradient (tokens a ∼ π_θ held fixed,
    summed over the step's valid positions) to the gradient g* of the exact KL(π_θ‖π_ref) (``"to KL(θ‖ref)"``)
    and to that of the reverse KL(π_ref‖π_θ) (``"to KL(ref‖θ)"``); π_θ, π_ref as in :func:`estimator_table`."""
    src = response_logits(run, step)
    m = src["mask"]
    u = src["logits"][m] / temperature
    lp_ref = full_log_probs(src["logits"], src["temperature"])[m]
    forward, reverse = kl_gradient(u, lp_ref), kl_gradient(u, lp_ref, reverse=True)
    out = {}
    for name in names:
        g = expected_estimator_gradient(u, lp_ref, name)
        out[name] = {"to KL(θ‖ref)": ((g - forward).norm() / forward.norm()).item(),
                     "to KL(ref‖θ)": ((g - reverse).norm() / reverse.norm()).item()}
    return out
