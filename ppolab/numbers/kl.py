"""Chapter §7's numbers: the adaptive KL controller replayed on a run, and §7.3's estimators on full distributions
(the base model's logits at every response position of a recorded step)."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from ppolab.algos import AdaptiveKLController, estimator_moments, exact_kl, expected_estimator_gradient, \
    full_log_probs, kl_gradient
from ppolab.numbers.steps import loss_mask_of_real_rows, step_tensors
from ppolab.run.reader import Run, resolve_run


#: The canonical estimators drawn together (aliases kl=k1, mse=k2, low_var_kl=k3 give the same curves).
CANONICAL = ("k1", "abs", "k2", "k3")


def mask_before_rejection(rec) -> torch.Tensor:
    """(N, R) float mask of the policy's sampled tokens of real rows as stage 7 received it: the recorded
    ``loss_mask`` (a copy of response_mask made at generation; rejection sampling rewrites only response_mask,
    verl V1), or ``response_mask`` for a recording without one
    (:func:`~ppolab.numbers.steps.loss_mask_of_real_rows`)."""
    return loss_mask_of_real_rows(rec)


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


#: The most float64 logits a full-distribution reading holds (positions × vocabulary), sized so one explorer move
#: (eight estimator moments over them) stays near 100 ms on a laptop core: every response position of the shipped
#: runs (a 29-token vocabulary), an evenly spaced sample of 6 at a real model's 151,936 tokens.
MAX_LOGIT_ELEMENTS = 1 << 20
#: Rows per forward pass: a step's full float32 logits at a real vocabulary would not fit.
MAX_FORWARD_ELEMENTS = 1 << 26


def sample_positions(mask: torch.Tensor, vocab: int, budget: int = MAX_LOGIT_ELEMENTS) -> torch.Tensor:
    """(M, 2) (row, position) of the valid positions of ``mask`` (N, R) a reading keeps: all of them, in row-major
    order, when M × ``vocab`` fits ``budget``; else ⌊budget / vocab⌋ evenly spaced ones (deterministic, so a
    slider's every move reads the same tokens)."""
    where = torch.nonzero(mask.bool())
    keep = max(1, budget // max(vocab, 1))
    if len(where) <= keep:
        return where
    return where[torch.linspace(0, len(where) - 1, keep).round().long().unique()]


@functools.lru_cache(maxsize=4)
def _response_logits(path: str, step: int | None, _identity: tuple = ()) -> dict[str, Any]:
    from ppolab.models import load_tokenizer_and_model
    from ppolab.models import shifted_logits

    r = resolve_run(path)
    rec = step_tensors(r, step)
    t = rec.tensors
    _, model = load_tokenizer_and_model(run_base_model(r))
    ids = torch.cat([t["prompts"], t["responses"]], dim=1)
    # the ref pass ran before rejection sampling rewrote response_mask: attend to every token it attended to
    seen = t.get("response_attention_mask", mask_before_rejection(rec))
    attn = torch.cat([t["prompt_mask"], seen.long()], dim=1)
    N, R = t["responses"].shape
    vocab = model.get_output_embeddings().weight.shape[0]
    mask = mask_before_rejection(rec).bool()
    where = sample_positions(mask, vocab)
    rows_per_pass = max(1, MAX_FORWARD_ELEMENTS // max((R + 1) * vocab, 1))
    picked = []
    with torch.no_grad():
        for start in range(0, N, rows_per_pass):  # the trainer's forward and shift, a few rows at a time
            rows = where[(where[:, 0] >= start) & (where[:, 0] < start + rows_per_pass)]
            if len(rows):
                logits = shifted_logits(model, ids[start:start + rows_per_pass], attn[start:start + rows_per_pass], R)
                picked.append(logits[rows[:, 0] - start, rows[:, 1]].double())
    logits = torch.cat(picked) if picked else torch.zeros(0, vocab, dtype=torch.float64)
    return {"logits": logits, "mask": torch.ones(len(where), dtype=torch.bool), "positions": where,
            "responses": t["responses"][where[:, 0], where[:, 1]], "n_valid": int(mask.sum()),
            "sampled": len(where) < int(mask.sum()), "temperature": float(rec.info.get("temperature", 1.0)),
            "record": rec}


def run_base_model(run: Run) -> Path:
    """The base model ``run`` was trained with, found by fingerprint (:meth:`ppolab.run.reader.Run.model_path`); one
    that is not on this machine is a :class:`~ppolab.numbers.needs.RunLacks` — never another model."""
    from ppolab.errors import MissingFileError
    from ppolab.numbers.needs import RunLacks

    try:
        return run.model_path()
    except MissingFileError as e:
        raise RunLacks(f"its base model on this machine ({e})", run) from None


def response_logits(run: Run | str | None = None, step: int | None = None) -> dict[str, Any]:
    """The base model's full logits at the response positions of a recorded step (cached per run and step).

    The base model is the run's own (:func:`run_base_model`: found by fingerprint, never another) — for a LoRA
    run that is exactly the reference policy (the actor with its adapters off); the logits come from the trainer's
    own forward and one-token shift (:func:`ppolab.models.shifted_logits`), a few rows a pass. Returns ``logits``
    (M, V) float64 before any temperature at M positions (:func:`sample_positions`: every valid one on a small
    vocabulary, an evenly spaced sample within :data:`MAX_LOGIT_ELEMENTS` on a large one), ``positions`` (M, 2)
    their (row, position), ``responses`` (M,) the sampled token there, ``mask`` (M,) all true (index ``logits``
    with it), ``n_valid`` (the policy's sampled tokens of real rows, those that rejection sampling later dropped
    included), ``sampled`` (whether M < n_valid: say so on a figure), ``temperature`` (the run's rollout
    temperature) and ``record``. Do not modify the tensors in place.
    """
    r = resolve_run(run)
    if step is None:
        if not r.steps:
            raise FileNotFoundError(r.no_steps())
        step = r.steps[0]
    return _response_logits(str(Path(r.path).resolve()), int(step), r.identity(int(step)))  # replaced: another key


#: Float64 elements per block of positions :func:`moments_table` works on at once (1 MiB): at a real vocabulary one
#: position's distribution is 1.2 MB, and the two dozen temporaries of a block that size stay in the core's cache
#: instead of streaming the whole reading through memory two dozen times (measured at 151,936 tokens, 6 positions:
#: about 1.5× faster a move).
BLOCK_ELEMENTS = 1 << 17


def moments_table(logits: torch.Tensor, mask: torch.Tensor, ref_temperature: float, temperature: float,
                   names: tuple[str, ...]) -> dict[str, Any]:
    x = logits if bool(mask.all()) else logits[mask]
    per_position: dict[tuple, list[torch.Tensor]] = {}

    def keep(key: tuple, value: torch.Tensor) -> None:
        per_position.setdefault(key, []).append(value)

    for block in x.split(max(1, BLOCK_ELEMENTS // max(x.shape[-1], 1))):  # each position is independent
        lp_ref = full_log_probs(block, ref_temperature)
        lp_theta = full_log_probs(block, temperature)
        keep(("kl",), exact_kl(lp_theta, lp_ref))
        keep(("reverse_kl",), exact_kl(lp_ref, lp_theta))
        for name in names:
            for sampler, lp_s in (("pi_theta", lp_theta), ("pi_ref", lp_ref)):
                mean, var = estimator_moments(lp_theta, lp_ref, lp_s, name)
                keep((name, sampler, "mean"), mean)
                keep((name, sampler, "var"), var)
    avg = {key: torch.cat(parts).mean().item() for key, parts in per_position.items()}
    kl = avg[("kl",)]
    rows = {name: {sampler: {"mean": avg[(name, sampler, "mean")], "bias": avg[(name, sampler, "mean")] - kl,
                             "var": avg[(name, sampler, "var")], "std": avg[(name, sampler, "var")] ** 0.5}
                   for sampler in ("pi_theta", "pi_ref")} for name in names}
    return {"kl": kl, "reverse_kl": avg[("reverse_kl",)], "rows": rows, "n_positions": int(mask.sum()),
            "temperature": temperature, "ref_temperature": ref_temperature}


def estimator_table(run: Run | str | None = None, step: int | None = None, temperature: float = 0.7,
                    names: tuple[str, ...] = CANONICAL) -> dict[str, Any]:
    """Every estimator against the exact KL at every valid response position of a recorded step.

    π_ref = the base model at the run's temperature; π_θ = the same model at ``temperature`` (a real, full
    distribution that differs from π_ref — runs record no weights of the trained policy). Returns ``kl``
    (mean over positions of KL(π_θ‖π_ref)), ``reverse_kl`` (of KL(π_ref‖π_θ)), ``rows`` (per estimator and
    sampler ``"pi_theta"`` / ``"pi_ref"``: ``mean`` = mean over positions of E_q[k], ``bias`` = mean − kl,
    ``var`` = mean over positions of Var_q[k], ``std`` = its square root), ``n_positions`` (read), ``n_valid`` (in
    the step) and ``sampled`` (whether a real vocabulary made it read a sample of them, :func:`sample_positions`).
    """
    src = response_logits(run, step)
    return {**moments_table(src["logits"], src["mask"], src["temperature"], temperature, names),
            "n_valid": src["n_valid"], "sampled": src["sampled"]}


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
