"""Case finders: where in *this* run a mechanism can be seen — a recorded step, an optimizer step, a critic update.

Each finder takes a run (a Run, a shipped run's name or a path) and returns a dict of the numbers a prompt names
(``{"step": 24, "opt_step": 8, …}``). A lab's own case (``prefer``) is kept when the run records it and the mechanism
shows there, so the shipped runs keep their cases; otherwise the finder searches the run by the rule its docstring
states. A run in which the mechanism never shows raises :class:`~ppolab.numbers.needs.RunLacks`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import lru_cache

import torch

from ppolab import algos
from ppolab.numbers.needs import RunLacks, require
from ppolab.numbers.steps import n_opt_steps, actor_config, optimizer_step_batch, real_rows
from ppolab.run.reader import Run, resolve_run

Case = dict[str, int | float]


def _key(run: Run | str | None, default: str) -> tuple[str, tuple]:
    r = resolve_run(run, default)
    return str(r.path.resolve()), (tuple(r.steps), r.identity())  # a run replaced at that path: another key


def cached_case(fn: Callable[..., Case]) -> Callable[..., Case]:
    """Cache a finder per run directory and its recorded steps (a run still training gets a fresh search)."""
    @lru_cache(maxsize=64)
    def by_key(path: str, _steps: tuple[int, ...], *args) -> Case:
        return fn(resolve_run(path), *args)

    def finder(run: Run | str | None = None, *args, default: str = "grpo_tiny") -> Case:
        return dict(by_key(*_key(run, default), *args))
    finder.__doc__, finder.__name__ = fn.__doc__, fn.__name__
    return finder


def _pick(prefer: tuple[int, int] | None, candidates: Iterable[tuple[int, int]],
          score: Callable[[int, int], float]) -> tuple[int, int] | None:
    """``prefer`` when it is a candidate with a positive score, else the first candidate of the highest positive
    score, else None."""
    candidates = list(candidates)
    if prefer in candidates and score(*prefer) > 0:
        return prefer
    scored = [(score(s, k), -i, (s, k)) for i, (s, k) in enumerate(candidates)]
    best = max(scored, default=(0.0, 0, None))
    return best[2] if best[0] > 0 else None


def opt_pairs(r: Run, first_opt: int = 0) -> list[tuple[int, int]]:
    return [(s, k) for s in r.steps for k in range(first_opt, n_opt_steps(r.step(s)))]


def clip_terms(r: Run, step: int, k: int, c: float | None = None) -> tuple[dict, dict]:
    cfg = actor_config(r)
    low, high = algos.policy_loss.clip_bounds(cfg)
    b = optimizer_step_batch(r.step(step), k)
    extra = () if c is None else (c,)  # no c: ppo_clip_terms' own default (the dual clip is not asked about)
    return b, algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], low, high, *extra)


def run_eps(run: Run | str | None) -> float:
    """The run's ε as labs 04 and 05 quote it: the lower bound ε_low of the window its loss clipped at
    (``algos.policy_loss.clip_bounds`` — ``clip_ratio_low``, or ``clip_ratio`` where that is null; the window is
    symmetric on every shipped run and at verl's defaults, an asymmetric one is lab 05's subject)."""
    return float(algos.policy_loss.clip_bounds(actor_config(resolve_run(run)))[0])


@cached_case
def clip_case(r: Run, prefer: tuple[int, int] | None = None) -> Case:
    """The recorded step and optimizer step where the PPO clip (at the run's ε) takes out the most real response
    tokens; optimizer step 0 is never one (π_θ is still π_old there)."""
    require(r, "opt_steps")

    def clipped(s: int, k: int) -> float:
        b, terms = clip_terms(r, s, k)
        return float(algos.masked_sum(terms["clipped"], b["response_mask"]))
    found = _pick(prefer, opt_pairs(r, first_opt=1), clipped)
    if found is None:
        raise RunLacks("a PPO clip that binds (clipped tokens at an optimizer step after the first)", r)
    return {"step": found[0], "opt_step": found[1], "eps": run_eps(r)}


@cached_case
def clip_fire_case(r: Run, prefer: tuple[int, int] | None = None) -> Case:
    """Where lab 04's explorer opens so that the clip fires on this run: :func:`clip_case` with the run's ε where
    the clip binds at some recorded optimizer step (``eps`` None: the run's own); else the optimizer step whose
    tokens moved furthest in their advantage's direction, with the narrower ε (``eps``, the same on both sides)
    at which about half of that drift is clipped — at least one token — and ``narrowed`` True. Raises
    :class:`RunLacks` only where no optimizer step after the first moved the policy at all."""
    try:
        return {**clip_case(r, prefer), "eps": None, "narrowed": False}
    except RunLacks:
        pass
    require(r, "opt_steps")

    def pushed(s: int, k: int) -> float:  # the largest move along the advantage: r − 1 for A > 0, 1 − r for A < 0
        b, terms = clip_terms(r, s, k)
        real = (b["response_mask"] > 0) & (b["advantages"] != 0)
        drift = torch.where(b["advantages"] > 0, terms["ratio"] - 1, 1 - terms["ratio"])
        return float(drift[real].max()) if real.any() else 0.0
    found = _pick(None, opt_pairs(r, first_opt=1), pushed)
    largest = pushed(*found) if found is not None else 0.0
    if largest < 0.02:
        raise RunLacks("an optimizer step after the first that moved the policy (the ratio is 1 at the first: more "
                       "mini-batches or ppo_epochs give one)", r)
    eps = max(0.01, math.floor(100 * largest / 2) / 100)  # the slider's 0.01 grid; half the largest move
    return {"step": found[0], "opt_step": found[1], "eps": eps, "narrowed": True,
            "run_eps": run_eps(r)}


def fire_line(case: Case) -> str | None:
    """The line that says a finder opened an explorer at a what-if setting of its own (``narrowed`` cases of
    :func:`clip_fire_case`), in the notebook's language; None for a case at the run's own settings."""
    from ppolab.i18n import tr

    if not case.get("narrowed"):
        return None
    return tr("at this run's ε = {run_eps} the clip binds at no recorded optimizer step; the explorer opens at "
              "recorded step {step}, optimizer step {opt_step}, with ε = {eps} — half the largest move there — so "
              "that it does (a what-if on the run's real tokens)").format(**case)


@cached_case
def clip_window_case(r: Run, prefer: tuple[int, int] | None, eps_low: float, eps_high: float) -> Case:
    """Like :func:`clip_case`, but where the window [1 − eps_low, 1 + eps_high] also clips another number of real
    tokens than the run's ε (``prefer`` when it does, else where the two counts differ most) — so an answer that
    keeps the run's ε is never the truth of a question about the other window."""
    require(r, "opt_steps")

    def moved(s: int, k: int) -> float:
        b, terms = clip_terms(r, s, k)
        base = float(algos.masked_sum(terms["clipped"], b["response_mask"]))
        if base == 0:
            return 0.0
        other = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], eps_low, eps_high)
        return abs(float(algos.masked_sum(other["clipped"], b["response_mask"])) - base)
    found = _pick(prefer, opt_pairs(r, first_opt=1), moved)
    if found is None:
        raise RunLacks(f"a PPO clip that binds and clips other tokens at ε_low = {eps_low}, ε_high = {eps_high}", r)
    return {"step": found[0], "opt_step": found[1], "eps": run_eps(r)}


def _dual_binding(r: Run, step: int) -> list[int]:
    c = actor_config(r).clip_ratio_c
    out = []
    for k in range(n_opt_steps(r.step(step))):
        b, terms = clip_terms(r, step, k, c)
        if algos.masked_sum(terms["dual_clipped"], b["response_mask"]).item() > 0:
            out.append(k)
    return out


@cached_case
def dual_clip_case(r: Run, prefer: tuple[int, int, int] | None = None) -> Case:
    """The first recorded step where the dual clip (the run's clip_ratio_c) binds on a real token; ``open`` and
    ``code`` are two optimizer steps where it binds (``prefer``'s when they do, else the first and the last)."""
    require(r, "opt_steps")
    for s in r.steps:
        binding = _dual_binding(r, s)
        if binding:
            break
    else:
        raise RunLacks("a dual clip that fires (pg_clipfrac_lower > 0 at a recorded optimizer step)", r)
    if prefer and prefer[0] == s and {prefer[1], prefer[2]} <= set(binding):
        opened, code = prefer[1], prefer[2]
    else:
        opened, code = binding[0], binding[-1]
    cfg = actor_config(r)
    return {"step": s, "open": opened, "code": code, "c": cfg.clip_ratio_c, "eps": cfg.clip_ratio,
            "n_opt": n_opt_steps(r.step(s)), "per_epoch": steps_per_epoch(r, s)}


def steps_per_epoch(r: Run, step: int) -> int:
    """The actor's optimizer steps per epoch at recorded step ``step`` (its update plan)."""
    return max(1, r.step(step).plan("actor").steps_per_epoch)


@cached_case
def second_epoch_case(r: Run) -> Case:
    """Recorded step 1's first optimizer step of the second epoch (``opt_step``), with the batch's ``rows``, the
    global mini-batch ``mini`` and ``epochs``."""
    require(r, "step1", "epochs")
    rec = r.step(1)
    per = steps_per_epoch(r, 1)
    rows = int(rec.tensors["responses"].shape[0])
    return {"step": 1, "opt_step": per, "per_epoch": per, "rows": rows, "mini": rows // per,
            "epochs": r.ppo_config().actor_rollout_ref.actor.ppo_epochs}


@cached_case
def opt_step_case(r: Run, prefer: int, step: int | None = None) -> Case:
    """Optimizer step ``prefer`` of recorded step ``step`` (default the first), or that step's last optimizer step
    when it took fewer."""
    s = r.steps[0] if step is None else step
    return {"step": s, "opt_step": min(prefer, n_opt_steps(r.step(s)) - 1)}


@cached_case
def recorded_step_case(r: Run, prefer: int) -> Case:
    """Recorded step ``prefer`` if the run recorded it, else its first recorded step."""
    return {"step": prefer if prefer in r.steps else r.steps[0]}


@cached_case
def critic_case(r: Run, prefer: int = 3) -> Case:
    """Critic optimizer step ``prefer`` of the first recorded step (its last one when it took fewer), the last
    critic optimizer step, the run's ε_v and DP ranks, and that recorded ``step``."""
    require(r, "critic", "critic_updates")
    rec = r.step(r.steps[0])
    plan = rec.plan("critic")
    n = len(plan.steps)
    return {"update": min(prefer, n - 1), "last": n - 1, "eps_v": r.ppo_config().critic.cliprange_value,
            "dp": plan.dp_size, "step": r.steps[0]}


def _pad_rows_in(r: Run, s: int, k: int) -> int:
    rec = r.step(s)
    return int(rec.tensors["is_pad"].bool()[rec.opt_step(k).rows()].sum())


@cached_case
def padded_mini_batch_case(r: Run, prefer: tuple[int, int] | None = None) -> Case:
    """A recorded step and optimizer step whose global mini-batch holds synthetic padding rows — and, where the run
    has one, a real row that rejection sampling emptied, so counting the trajectories "with a token in the loss"
    differs from counting the real rows (``prefer`` when it qualifies, else the first pair that does) — with
    ``n_pad`` and the trainer's global_batch_size ``gbs``."""
    require(r, "padding_rows")
    padded = [p for p in opt_pairs(r) if _pad_rows_in(r, *p)]
    pool = [p for p in padded if _emptied_in(r, *p)] or padded
    found = prefer if prefer in pool else next(iter(pool), None)
    if found is None:
        raise RunLacks("a global mini-batch that holds synthetic padding rows", r)
    arr = r.ppo_config().actor_rollout_ref
    return {"step": found[0], "opt_step": found[1], "n_pad": _pad_rows_in(r, *found),
            "gbs": arr.actor.ppo_mini_batch_size * arr.rollout.n}


def _emptied_in(r: Run, s: int, k: int) -> int:
    """Real rows of step ``s``'s optimizer step ``k`` with tokens in the loss mask but none left in response_mask
    (rejection sampling, ``seq_max_k2``, dropped the whole row)."""
    rec = r.step(s)
    b = optimizer_step_batch(rec, k)
    real = real_rows(rec)[b["rows"]]
    generated = rec.tensors["loss_mask"][b["rows"]].sum(-1) > 0
    return int((real & generated & (b["response_mask"].sum(-1) == 0)).sum())


def _rejected_in(r: Run, s: int, k: int) -> int:
    rec = r.step(s)
    b = optimizer_step_batch(rec, k)
    real = real_rows(rec)[b["rows"]].float().unsqueeze(-1)
    return int((rec.tensors["loss_mask"][b["rows"]] * real).sum() - b["response_mask"].sum())


@cached_case
def rejection_case(r: Run, prefer: tuple[int, int] | None = None) -> Case:
    """The recorded step and optimizer step whose global mini-batch holds the most tokens that rejection sampling
    zeroed (``prefer`` when it holds any)."""
    require(r, "rejection")
    found = _pick(prefer, opt_pairs(r), lambda s, k: _rejected_in(r, s, k))
    if found is None:
        raise RunLacks("tokens that rejection sampling zeroed", r)
    return {"step": found[0], "opt_step": found[1]}


#: The adaptive controller's proportional band: e = clip(KL/target − 1, −0.2, 0.2) is clipped outside it.
KL_CTRL_CLIP = 0.2


@cached_case
def proportional_kl_case(r: Run, prefer: int) -> Case:
    """A recorded step ``step`` where the adaptive KL controller is proportional — its logged
    ``actor/reward_kl_penalty`` within ±20 % of ``target_kl``, so the error is not clipped — and whose next step
    ``next`` logged β (``prefer`` when it qualifies, else the first such step); with ``target_kl``, ``horizon``
    and the step's ``rows`` (the n_steps apply_kl_penalty passes: padding rows included)."""
    require(r, "adaptive_kl")
    m = r.metrics
    ctrl = r.ppo_config().algorithm.kl_ctrl
    logged = m[["actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"]].dropna()

    def proportional(s: int) -> bool:
        return abs(float(logged.loc[s, "actor/reward_kl_penalty"]) / ctrl.target_kl - 1) < KL_CTRL_CLIP

    ok = [s for s in r.steps if s in logged.index and s + 1 in logged.index and proportional(s)]
    if not ok:
        raise RunLacks("a recorded step where the adaptive KL controller's error is not clipped "
                       "(|KL/target_kl − 1| < 0.2) and the next step logged actor/reward_kl_penalty_coeff", r)
    step = prefer if prefer in ok else ok[0]
    return {"step": step, "next": step + 1, "target_kl": ctrl.target_kl, "horizon": ctrl.horizon,
            "rows": int(r.step(step).tensors["responses"].shape[0])}
