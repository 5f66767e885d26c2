"""Lab 17, part II — your loss trains the model (chapter §1, §3–§5, §8, §10, §12–§13).

The learner writes three plain-torch functions and they are graded by what they do, never by a number:

* a **policy loss** with verl's registry signature ``fn(old_log_prob, log_prob, advantages, response_mask,
  loss_agg_mode, config, rollout_is_weights=None, *, global_batch_info=None) -> (pg_loss, metrics)``, plugged into
  the real trainer as ``actor.policy_loss.loss_mode`` through the same registry verl's ``vanilla`` lives in
  (:func:`plug_in`; the trainer does not change for it);
* the **actor loss** a micro-batch backpropagates, ``fn(pg_loss, entropy, log_prob, ref_log_prob, response_mask,
  config, *, global_batch_info=None) -> loss`` (pg − entropy_coeff·H + kl_loss_coef·KL, §5);
* a **value loss** ``fn(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode, *,
  global_batch_info=None) -> (vf_loss, vf_clipfrac)`` (§8).

Three grades, each stopping at the first case that differs and naming the part of the loss it exercises:

(a) :func:`grade_hidden` — randomised batches the learner never sees, in stages that each add one mechanism (the
    surrogate, the clip, the dual clip, the mask with padding rows, every ``loss_agg_mode``, the global counts of a
    micro-batch's share, the dp factor, rollout IS weights, the entropy bonus, the loss-side KL, the value clip):
    loss, gradient and metrics against :mod:`ppolab.algos`, the functions the trainer runs;
(b) :func:`grade_replay` — the policy loss plugged in, one optimizer step of a recorded run replayed through the
    actor worker (:func:`ppolab.replay.replay_actor_update`, the seeded adapter of step 1): the learner's gradient
    against the worker's own, tensor by tensor;
(c) :func:`grade_training` — a short ``grpo_tiny`` run trained with the learner's loss against the same run
    trained with ``vanilla``: step 1 equal, the curves within stated bands;
(d) :func:`grade_critic_training` — a short ``ppo_gae_tiny`` run (value clip binding) whose critic trains with the
    learner's value loss (``ppolab.train(value_loss=…)``: verl keeps no registry for it) against verl's: step 1
    equal, the critic's curves within stated bands.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from ppolab.algos import LOSS_AGG_MODES
from ppolab.algos.aggregation import GlobalBatchInfo
from ppolab.algos.policy_loss import POLICY_LOSS_REGISTRY, register_policy_loss
from ppolab.config import ActorConfig
from ppolab.i18n import tr
from ppolab.experiments.grader_guard import (OWN_LOSSES, PLUGGED, REF, CallsReference, LearnerError, call,
                                             check_returned, contained, plain, signature_line, tampered)

#: The ``policy_loss.loss_mode`` name the learner's policy loss is plugged in under.
LEARNER = "learner"
#: (a) agreement with ppolab.algos: float64 inputs, so only the order of sums differs.
REL, ABS = 1e-6, 1e-9
#: (b) the replayed gradient: the worker's float32 forward, summed in the learner's order.
REPLAY_REL = 1e-4
#: (c) the short run: step 1 (same rollouts, the loss decides) and the bands of the curves after it (sampling
#: diverges once the weights differ in the last bit, so later steps agree in distribution, not exactly).
TRAIN_STEPS, STEP1_REL, SCORE_BAND, ENTROPY_REL = 20, 1e-4, 0.15, 0.15
#: grpo_tiny's window narrowed (ε 0.07, as ppo_fire_tiny's) and the dual clip brought to 1.1: the clip binds on 1–4 %
#: of the tokens at every step of the short run, from step 1 on, and the dual clip on some steps — so (c) trains
#: where the learner's clip and dual clip act, and draws their fractions.
ACTOR_FIRES = ("actor_rollout_ref.actor.clip_ratio_low=0.07", "actor_rollout_ref.actor.clip_ratio_high=0.07",
               "actor_rollout_ref.actor.clip_ratio_c=1.1")
#: (c)'s curves: the outcome, the entropy and the two clip fractions.
ACTOR_CURVES = ("critic/score/mean", "actor/entropy", "actor/pg_clipfrac", "actor/pg_clipfrac_lower")


#: What a plugged-in loss_mode name may look like, and the words YAML would read as something else.
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_YAML_WORDS = {"null", "none", "true", "false", "yes", "no", "on", "off", "y", "n", "nan", "inf"}


def plug_in(fn: Callable, name: str = LEARNER) -> str:
    """Register ``fn`` as ``actor.policy_loss.loss_mode = name`` (re-running the cell replaces an earlier function
    plugged in under ``name``; ppolab's own losses cannot be replaced). Returns ``name``. Refuses, in one line and
    registering nothing, anything verl's registry could not call: None, a number, a class, a function without the
    policy-loss arguments."""
    line = signature_line(fn)
    if line is not None:
        raise TypeError(line)
    if not isinstance(name, str) or not name:
        raise TypeError(f"plug_in(name=...): name must be a non-empty string, got {name!r}")
    if not _NAME.fullmatch(name) or name.lower() in _YAML_WORDS:
        # the trainer reads loss_mode=NAME as a config value: " vanilla" would come back as ppolab's vanilla,
        # "null" as None, "[a]" as a list — a name must read back as itself
        raise ValueError(f"plug_in(name={name!r}): a loss_mode name is letters, digits, '_' and '-', starting with a "
                         f"letter (e.g. 'mine'), and not a YAML word such as null or true")
    if name in OWN_LOSSES or (name in POLICY_LOSS_REGISTRY and name not in PLUGGED):
        raise ValueError(f"{name!r} is one of ppolab's policy losses; plug yours in under another name")
    POLICY_LOSS_REGISTRY.pop(name, None)
    register_policy_loss(name)(fn)
    PLUGGED.add(name)
    return name


# ---------------------------------------------------------------------------------------------- (a) hidden cases
@dataclasses.dataclass
class Case:
    """One hidden batch: what it exercises (``stage``), the tensors (float64, (bs, T)), the config and counts."""
    stage: str
    what: str
    t: dict[str, torch.Tensor]
    config: ActorConfig
    info: GlobalBatchInfo
    is_weights: torch.Tensor | None = None


#: The stages of (a), in order: the part of the loss each adds, as the hint names it.
STAGES = {
    "surrogate": "the surrogate −A·r with r = exp(log_prob − old_log_prob), token-mean, nothing clipped (§3)",
    "clip": "the clip: max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)), ε_low and ε_high apart (§4.1–§4.4)",
    "dual clip": "the dual clip: where A < 0, min(that, −A·clip_ratio_c) (§4.4)",
    "ratio clamp": "the ratio's clamp: r = exp(clamp(log_prob − old_log_prob, −20, 20)), and actor/ppo_kl the masked "
                   "mean of the clamped −(log_prob − old_log_prob) (§3)",
    "mask": "the mask: padding rows and positions outside response_mask hold junk and must not count (§9)",
    "aggregation": "loss_agg_mode: token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean, "
                   "seq-mean-token-sum-norm (§10)",
    "global counts": "a micro-batch's share of the global mini-batch: divide by global_batch_info.batch_num_tokens "
                     "or global_batch_size, not by this micro-batch's own counts — the shares are summed over "
                     "micro-batches (§10, §13)",
    "dp factor": "× global_batch_info.dp_size: the ranks' gradients are averaged (§12–§13)",
    "rollout IS": "rollout_is_weights multiply the clipped per-token loss, before aggregation (§3)",
    "metrics": "actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower: masked means over the micro-batch (§15)",
    "entropy": "the entropy bonus: loss = pg − entropy_coeff·agg(H) — a bonus lowers the loss (§5, §6)",
    "kl loss": "the loss-side KL: + kl_loss_coef·agg(kl_penalty(log_prob, ref_log_prob, kl_loss_type)) — π_θ "
               "against π_ref, not π_old (§5, §7.2)",
    "kl clamp": "k3's clamps (low_var_kl): the log-ratio clamped to ±20, then the estimate to [−10, 10] — a token "
                "beyond the clamp adds a constant and no gradient (§7.3)",
    "value clip": "the value clip: ½·max((V − G)², (clip(V, V_old ± ε_v) − G)²), vf_clipfrac where the clipped "
                  "error is strictly larger (§8)",
    "value aggregation": "the value loss aggregated like the policy loss: loss_agg_mode, global counts, dp factor "
                         "(§8, §10, §13)",
}


#: The stages that grade the actor loss (entropy bonus and loss-side KL) beside the policy loss.
ACTOR_STAGES = ("entropy", "kl loss", "kl clamp")


def _batch(g: torch.Generator, bs: int, T: int, drift: float, pad_rows: int = 0, junk: bool = False) -> dict:
    lengths = torch.randint(1, T + 1, (bs,), generator=g)
    lengths[bs - pad_rows:] = 0
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).double()
    if not pad_rows and not junk:
        mask = torch.ones(bs, T, dtype=torch.float64)
    old = -torch.rand(bs, T, generator=g, dtype=torch.float64) * 3 - 0.05
    lp = old + torch.randn(bs, T, generator=g, dtype=torch.float64) * drift
    if junk:  # outside the mask: what a padded position holds in a real batch — anything finite
        lp = torch.where(mask > 0, lp, old + 4.0)
    return {"old_log_prob": old, "log_prob": lp, "advantages": torch.randn(bs, T, generator=g, dtype=torch.float64),
            "response_mask": mask, "entropy": torch.rand(bs, T, generator=g, dtype=torch.float64) * 2,
            "ref_log_prob": old + torch.randn(bs, T, generator=g, dtype=torch.float64) * 0.4,
            "vpreds": torch.randn(bs, T, generator=g, dtype=torch.float64),
            "returns": torch.randn(bs, T, generator=g, dtype=torch.float64),
            "values": torch.randn(bs, T, generator=g, dtype=torch.float64) * 0.5}


def hidden_cases(seed: int = 20261202) -> list[Case]:
    """The hidden batches of (a), stage by stage (:data:`STAGES`); each stage adds one mechanism to the last."""
    g = torch.Generator().manual_seed(seed)
    cases = []

    def add(stage, what, n, *, drift=0.05, pad=0, junk=False, modes=("token-mean",), counts=False, dp=1, c=3.0,
            low=0.2, high=0.2, is_w=False, scale=None, far=None, **cfg):
        for i in range(n):
            bs, T = int(torch.randint(3, 7, (1,), generator=g)), int(torch.randint(4, 10, (1,), generator=g))
            t = _batch(g, bs, T, drift, pad, junk)
            if far is not None:  # a few valid tokens far past a clamp: (tensor moved, tensor it is measured from)
                moved, base = far
                valid = t["response_mask"].flatten().nonzero().flatten()
                picked = valid[torch.randperm(len(valid), generator=g)[:3]]
                for k, shift in zip(picked.tolist(), (25.0, 23.0, -26.0)):
                    t[moved].view(-1)[k] = t[base].view(-1)[k] + shift
            mode = modes[i % len(modes)]
            tokens, rows = float(t["response_mask"].sum()), bs
            info = GlobalBatchInfo(dp_size=dp, batch_num_tokens=tokens * 3 + 5 if counts else None,
                                   global_batch_size=rows * 3 + 1 if counts else (rows if dp > 1 else None),
                                   loss_scale_factor=scale)
            if not counts and dp > 1:
                info = dataclasses.replace(info, batch_num_tokens=tokens)
            config = ActorConfig(clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c,
                                 loss_agg_mode=mode, **cfg)
            w = torch.rand(bs, T, generator=g, dtype=torch.float64) * 2 if is_w else None
            shape = tr("{bs} rows × {T} tokens").format(bs=bs, T=T)
            cases.append(Case(stage, tr("{what}; {mode}; {shape}").format(what=tr(what), mode=mode, shape=shape), t,
                              config, info, w))

    add("surrogate", "small moves, every token valid", 3)
    add("clip", "large moves, ε_low 0.2, ε_high 0.28", 3, drift=0.6, high=0.28, c=100.0)
    add("dual clip", "large moves, clip_ratio_c 1.5", 3, drift=1.2, high=0.28, c=1.5)
    add("ratio clamp", "log-ratios of +25, +23 and −26 on three tokens", 3, drift=0.6, high=0.28, c=1.5,
        far=("log_prob", "old_log_prob"))
    add("mask", "padding rows, junk outside the mask", 3, drift=0.6, pad=2, junk=True, c=1.5)
    add("aggregation", "every loss_agg_mode, local counts", 10, drift=0.6, pad=1, junk=True, c=1.5,
        modes=LOSS_AGG_MODES, scale=None)
    add("aggregation", "seq-mean-token-sum-norm with loss_scale_factor 8", 2, drift=0.6, pad=1, junk=True, c=1.5,
        modes=("seq-mean-token-sum-norm",), scale=8.0)
    add("global counts", "a micro-batch of a larger global mini-batch", 10, drift=0.6, pad=1, junk=True, c=1.5,
        modes=LOSS_AGG_MODES, counts=True)
    add("dp factor", "2 DP ranks", 5, drift=0.6, pad=1, junk=True, c=1.5, modes=LOSS_AGG_MODES, counts=True, dp=2)
    add("rollout IS", "rollout IS weights", 3, drift=0.6, pad=1, junk=True, c=1.5, modes=LOSS_AGG_MODES[:3],
        counts=True, dp=2, is_w=True)
    add("entropy", "entropy_coeff 0.05", 3, drift=0.6, pad=1, junk=True, c=1.5, modes=LOSS_AGG_MODES[:3],
        counts=True, dp=2, entropy_coeff=0.05)
    add("kl loss", "use_kl_loss, kl_loss_coef 0.1, low_var_kl", 3, drift=0.6, pad=1, junk=True, c=1.5,
        modes=LOSS_AGG_MODES[:3], counts=True, dp=2, entropy_coeff=0.05, use_kl_loss=True, kl_loss_coef=0.1,
        kl_loss_type="low_var_kl")
    add("kl loss", "use_kl_loss, kl_loss_coef 0.1, kl (k1)", 2, drift=0.6, pad=1, junk=True, c=1.5,
        modes=("token-mean",), counts=True, dp=2, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="kl")
    add("kl clamp", "use_kl_loss, low_var_kl, π_ref far from π_θ on three tokens", 3, drift=0.6, pad=1, junk=True,
        c=1.5, modes=LOSS_AGG_MODES[:3], counts=True, dp=2, use_kl_loss=True, kl_loss_coef=0.1,
        kl_loss_type="low_var_kl", far=("ref_log_prob", "log_prob"))
    add("value clip", "ε_v 0.2", 3, drift=0.6, pad=1, junk=True)
    add("value aggregation", "every loss_agg_mode, global counts, 2 DP ranks", 5, pad=1, junk=True,
        modes=LOSS_AGG_MODES, counts=True, dp=2)
    return cases


class Unanswered(Exception):
    """A learner's function that still returns None (its body is ``...``)."""


def _answer(fn: Callable, name: str, like: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """The learner's ``fn(*args, **kwargs)`` called with torch's settings guarded, its result checked for kind."""
    out = call(fn, name, *args, **kwargs)
    if out is None:
        raise Unanswered(name)
    check_returned(out, name, like)
    return out


def _grad(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


def _run_case(case: Case, policy_loss: Callable, actor_loss: Callable | None, value_loss: Callable | None,
              reference: bool) -> dict[str, Any]:
    """Loss, gradient and metrics of one hidden case through the learner's functions (or ppolab.algos)."""
    t, cfg, info = case.t, case.config, case.info
    if case.stage.startswith("value"):
        vp = t["vpreds"].clone().requires_grad_(True)
        args = (vp, t["returns"], t["values"], t["response_mask"], 0.2, cfg.loss_agg_mode)
        if reference:
            loss, frac = REF.compute_value_loss(*args, **info.as_kwargs())
        else:
            loss, frac = _answer(value_loss, "value_loss", vp, *args, global_batch_info=info)
        return {"loss": float(loss.detach()), "grad": _grad(loss, vp),
                "metrics": {"critic/vf_clipfrac": float(frac)}}
    lp = t["log_prob"].clone().requires_grad_(True)
    args = (t["old_log_prob"], lp, t["advantages"], t["response_mask"], cfg.loss_agg_mode, cfg, case.is_weights)
    if reference:  # the function captured at import, never the registry entry a learner can rebind
        pg, metrics = REF.vanilla(*args, global_batch_info=info)
    else:
        pg, metrics = _answer(policy_loss, "policy_loss", lp, *args, global_batch_info=info)
    loss = pg
    if case.stage in ACTOR_STAGES:
        ent, ref = t["entropy"], t["ref_log_prob"]
        if reference:
            terms, _ = REF.ppo_loss_terms(cfg, old_log_prob=t["old_log_prob"], log_prob=lp,
                                            advantages=t["advantages"], response_mask=t["response_mask"],
                                            entropy=ent, ref_log_prob=ref, global_batch_info=info)
            loss = sum(terms.values())
        else:
            loss = _answer(actor_loss, "actor_loss", lp, pg, ent, lp, ref, t["response_mask"], cfg,
                           global_batch_info=info)
    keys = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
    return {"loss": float(loss.detach()), "grad": _grad(loss, lp),
            "metrics": {k: float(metrics[k]) for k in keys if k in (metrics or {})}}


def _copy(case: Case) -> Case:
    """``case`` with fresh copies of its tensors, config and counts: the learner's code may write into them."""
    return dataclasses.replace(case, t={k: v.clone() for k, v in case.t.items()},
                               config=copy.deepcopy(case.config), info=copy.deepcopy(case.info),
                               is_weights=None if case.is_weights is None else case.is_weights.clone())


def _shown(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _close(a: float, b: float, rel: float = REL, abs_: float = ABS) -> bool:
    return math.isfinite(a) and abs(a - b) <= abs_ + rel * abs(b)


def grade_hidden(policy_loss: Callable, actor_loss: Callable | None = None,
                 value_loss: Callable | None = None) -> dict[str, Any]:
    """(a): every hidden case through the learner's functions and ppolab.algos. Returns ``ok``, the ``stage`` and
    ``case`` of the first difference, ``line`` (one line: the case, what differs, the part to look at) and
    ``cases`` (how many agreed). A function left out (None) skips its stages."""
    refused = tampered()
    if refused:
        return {"ok": False, "stage": None, "case": None, "cases": 0, "line": "(a) " + refused}
    done, skipped = 0, 0
    for i, case in enumerate(hidden_cases()):
        if (case.stage in ACTOR_STAGES and actor_loss is None) or \
                (case.stage.startswith("value") and value_loss is None):
            skipped += 1
            continue
        try:
            # the learner's functions first, on copies (what they do to their inputs stays theirs), and everything
            # read back from what they returned under the same guard; the truth is computed only after they have
            # returned, so no frame of this process holds it while their code runs
            with contained("functions", passes=(Unanswered,)):
                got = _run_case(_copy(case), policy_loss, actor_loss, value_loss, reference=False)
        except Unanswered as e:
            return {"ok": False, "stage": None, "case": None, "cases": done, "answered": False,
                    "line": tr("not answered yet: {name} returns None — write its body").format(name=e)}
        except LearnerError as e:  # raised, exited, changed torch's settings, returned the wrong kind: one line
            return _fail(case, i, done, str(e), part=not isinstance(e, CallsReference))
        except Exception as e:  # noqa: BLE001 — the learner's code (a metrics dict it built …): one line
            return _fail(case, i, done, tr("your function raised {error}").format(
                error=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"))
        want = _run_case(case, policy_loss, actor_loss, value_loss, reference=True)
        g, w = got["grad"], want["grad"]
        where, look = gradient_differs(case, g, w)
        if not _close(got["loss"], want["loss"]):
            ratio = f" (×{got['loss'] / want['loss']:.4g})" if want["loss"] else ""
            return _fail(case, i, done, tr("loss {got}, ppolab.algos {want}").format(
                got=f"{got['loss']:.6g}", want=f"{want['loss']:.6g}") + ratio + ("; " + where if where else ""),
                         look=look)
        if g.shape != w.shape or not torch.allclose(g, w, rtol=1e-5, atol=1e-9):
            return _fail(case, i, done, tr("the loss agrees but its gradient does not (a .detach() or a masked "
                                           "position that still carries gradient?)") + ("; " + where if where else ""),
                         look=look)
        for k, v in want["metrics"].items():
            if k not in got["metrics"] or not _close(got["metrics"][k], v):
                # a metric is the stage's own mechanism where the stage says so (ppo_kl of the clamped log-ratio)
                return _fail(case if case.stage == "ratio clamp" else dataclasses.replace(case, stage="metrics"), i,
                             done,
                             tr("{key}: yours {got}, ppolab.algos {want}").format(
                                 key=k, got=_shown(got["metrics"].get(k, "—")), want=f"{v:.6g}"))
        done += 1
        del want  # no truth stays in this frame while the next case runs the learner's code
    line = tr("(a) right: {n} hidden cases agree with ppolab.algos (loss, gradient, metrics)").format(n=done)
    if skipped:
        line += tr("; {k} not graded: no {names} was given").format(
            k=skipped, names=tr(" and ").join(n for fn, n in ((actor_loss, "actor_loss"), (value_loss, "value_loss"))
                                              if fn is None))
    return {"ok": True, "stage": None, "case": None, "cases": done, "skipped": skipped, "line": line}


def _fail(case: Case, i: int, done: int, what: str, part: bool = True, look: str | None = None) -> dict[str, Any]:
    """The failing verdict of hidden case ``i``; ``look``: the stage whose part the tokens point at, when the
    gradient names another mechanism than the case's stage."""
    line = tr("(a) not yet — hidden case {i} ({stage}: {what}): {detail}").format(i=i, stage=case.stage,
                                                                                  what=case.what, detail=what)
    if part:  # a function that called the reference has nothing of its own to look at
        line += tr(". Look at {part}").format(part=tr(STAGES[look or case.stage]))
    return {"ok": False, "stage": case.stage, "case": i, "cases": done, "line": line}


def token_regions(case: Case) -> tuple[list[str], torch.Tensor]:
    """The region of the loss each token of ``case`` lies in — ``(names, region index per token)`` — by what the
    reference does there: outside the mask; past the ratio's ±20 clamp; A < 0 in the dual clip's region; clipped
    (no gradient); inside the clip window — with the advantage's sign. The value stages: clipped or not."""
    t, cfg = case.t, case.config
    mask = t["response_mask"] > 0
    if case.stage.startswith("value"):
        _, err, err_clipped, _ = REF.value_clip_terms(t["vpreds"], t["returns"], t["values"], 0.2)
        clipped = err_clipped > err
        names = [tr("outside response_mask"), tr("where the value clip binds (the clipped error is larger)"),
                 tr("where the value clip does not bind")]
        return names, torch.where(~mask, 0, torch.where(clipped, 1, 2))
    d, a = t["log_prob"] - t["old_log_prob"], t["advantages"]
    terms = REF.ppo_clip_terms(t["old_log_prob"], t["log_prob"], a, cfg.clip_ratio_low, cfg.clip_ratio_high,
                               cfg.clip_ratio_c)
    dual, clipped = terms["dual_clipped"] > 0, terms["clipped"] > 0
    names = [tr("outside response_mask"), tr("whose log-ratio is past ±20"),
             tr("with A < 0 in the dual clip's region (ratio above clip_ratio_c)"),
             tr("with A > 0 outside the clip window"), tr("with A < 0 outside the clip window"),
             tr("with A > 0 inside the clip window"), tr("with A < 0 inside the clip window")]
    region = torch.where(~mask, 0, torch.where(d.abs() > 20, 1, torch.where(dual, 2, torch.where(
        clipped, torch.where(a > 0, 3, 4), torch.where(a > 0, 5, 6)))))
    return names, region


def gradient_differs(case: Case, got: torch.Tensor, want: torch.Tensor) -> tuple[str, str | None]:
    """Where the learner's per-token gradient differs from the reference's, by :func:`token_regions` — the tokens
    name the mechanism even when the loss alone cannot (a wrong aggregation scales every token; a dual clip applied
    where A > 0 flattens exactly those tokens), and the stage whose mechanism they point at when it is another
    than the case's (None otherwise). Empty when the gradients agree."""
    if got.shape != want.shape:
        return "", None
    off = (got - want).abs() > 1e-9 + 1e-5 * want.abs()
    if not off.any():
        return "", None
    names, region = token_regions(case)
    found = sorted(set(region[off].tolist()))
    where = (tr(" and ").join(names[k] for k in found) if len([k for k in found if k]) < 3 or
             case.stage.startswith("value") else tr("of every kind — a term each token carries, not one region of "
                                                    "the clip"))
    if bool((got[off] == 0).all()):
        how = tr("yours is 0 there")
    elif bool((want[off] == 0).all()):
        how = tr("yours is not 0 there, the reference's is")
    else:
        ratio = (got[off] / want[off]).tolist()
        how = (tr("yours is ×{k} the reference's there").format(k=f"{ratio[0]:.4g}")
               if max(ratio) - min(ratio) < 1e-6 * max(1.0, abs(ratio[0])) else tr("yours differs there"))
    line = tr("the gradient differs on {n} of {total} tokens, those {where} ({how})").format(
        n=int(off.sum()), total=off.numel(), where=where, how=how)
    look = None
    if found == [5] and how == tr("yours is 0 there") and not case.stage.startswith("value"):
        cfg = case.config
        r = REF.ppo_clip_terms(case.t["old_log_prob"], case.t["log_prob"], case.t["advantages"], cfg.clip_ratio_low,
                               cfg.clip_ratio_high, cfg.clip_ratio_c)["ratio"][off]
        if bool((r > 1 + cfg.clip_ratio_low).all()) and cfg.clip_ratio_high > cfg.clip_ratio_low:
            line += tr(" — as if the window ended at 1 + clip_ratio_low; clip_ratio_high sets its upper end")
            look = "clip"
        elif bool(off[region == 5].all()) and int(off.sum()) > 1:  # every A > 0 token flat: −A·c reached them
            line += tr(" — as if the dual clip's min(·, −A·clip_ratio_c) applied where A > 0; it belongs only "
                       "where A < 0")
            look = "dual clip"
    return line, look


# ---------------------------------------------------------------------------------------------- (b) one replayed step
@contextlib.contextmanager
def _guarded_in_trainer(policy_loss: Callable, name: str):
    """``policy_loss`` plugged in as ``name``, and for the body (a replay or a run) registered behind a guard: each
    call through the trainer runs with torch's settings guarded and its result checked for kind, so that
    ``sys.exit()``, a changed setting or a wrong return is a :class:`LearnerError` the worker lets through. The
    registry holds the learner's own function again afterwards."""
    plug_in(policy_loss, name)

    def guarded(*args: Any, **kwargs: Any) -> Any:
        out = call(policy_loss, "policy_loss", *args, **kwargs)
        like = kwargs.get("log_prob", args[1] if len(args) > 1 else None)
        check_returned(out, "policy_loss", like if isinstance(like, torch.Tensor) else None)
        return plain(out, "policy_loss")

    POLICY_LOSS_REGISTRY[name] = guarded
    try:
        yield
    finally:
        POLICY_LOSS_REGISTRY[name] = policy_loss


def _raised(e: BaseException) -> str:
    return str(e) if isinstance(e, LearnerError) else tr("the worker raised {error} inside your loss").format(
        error=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}")


def grade_replay(policy_loss: Callable, run: Any = None, name: str = LEARNER) -> dict[str, Any]:
    """(b): the learner's policy loss plugged in as ``loss_mode = name``, optimizer step 0 of recorded step 1
    replayed through the actor worker (the seeded adapter, the run's own micro-batches and global counts), its
    gradient against the same replay with the run's own loss_mode: ``ok``, ``rel`` (largest |Δ| of a gradient
    entry over the largest entry of the worker's), ``tensors``, ``metrics`` (both replays' actor/* metrics) and
    ``line``."""
    from ppolab.replay import replay_actor_update

    refused = tampered()  # the reference replay runs the run's loss_mode by name, through the registry
    if refused:
        return {"ok": False, "rel": math.inf, "tensors": 0, "metrics": {}, "line": "(b) " + refused}
    plug_in(policy_loss, name)
    want = replay_actor_update(run)
    try:
        with _guarded_in_trainer(policy_loss, name):
            got = replay_actor_update(run, loss_mode=name)
    except Exception as e:  # noqa: BLE001 — the learner's code inside the worker: one line
        return {"ok": False, "rel": math.inf, "tensors": 0, "metrics": {},
                "line": tr("(b) not yet — ") + _raised(e)}
    scale = max(float(w.abs().max()) for w in want["grads"]) or 1.0
    rel = max(float((g - w).abs().max()) for g, w in zip(got["grads"], want["grads"])) / scale
    keys = [k for k in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl") if k in want["metrics"]]
    metrics = {k: (got["metrics"].get(k, math.nan), want["metrics"][k]) for k in keys}
    ok = rel <= REPLAY_REL and all(_close(a, b, REPLAY_REL, 1e-7) for a, b in metrics.values())
    n = len(want["grads"])
    line = (tr("(b) right: the worker's gradient of optimizer step 0 with your loss equals its own on all {n} "
               "adapter tensors (largest difference {rel} of the largest entry)").format(n=n, rel=f"{rel:.1e}") if ok
            else tr("(b) not yet — optimizer step 0 of step 1 replayed with your loss: the gradient differs by {rel} "
                    "of its largest entry").format(rel=f"{rel:.2g}")
            + "".join("; " + tr("{key}: yours {got}, the worker's {want}").format(key=k, got=f"{a:.6g}",
                                                                                  want=f"{b:.6g}")
                      for k, (a, b) in metrics.items() if not _close(a, b, REPLAY_REL, 1e-7)))
    return {"ok": ok, "rel": rel, "tensors": n, "metrics": metrics, "line": line}


# ---------------------------------------------------------------------------------------------- (c) a short run
_REFERENCE: dict[tuple, Path] = {}


def short_run(loss_mode: str, out: Path, steps: int = TRAIN_STEPS):
    """``grpo_tiny`` for ``steps`` steps with ``actor.policy_loss.loss_mode = loss_mode`` and the clips of
    :data:`ACTOR_FIRES`, no validation, no recording, into ``out``; the same seed, data order and first rollouts
    whatever the loss."""
    return _short("grpo_tiny", [*ACTOR_FIRES, f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}"], out,
                  steps)


def _short(preset: str, overrides: list[str], out: Path, steps: int, **kwargs: Any):
    """``preset`` with ``overrides`` for ``steps`` steps into ``out``: no validation, no recording, no progress."""
    from ppolab.train import train

    return train(preset, [*overrides, f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
                          "trainer.val_before_train=false", "trainer.record_freq=-1", f"trainer.run_dir={out}"],
                 progress=False, **kwargs)


def _side_by_side(mine: Any, ref: Any, at_step1: tuple[str, ...], curves: tuple[str, ...]) -> tuple[dict, dict]:
    """Two short runs' metrics (``metrics`` frames, the learner's and the reference's): step 1's values of
    ``at_step1`` as (yours, reference) pairs, and the curves of ``curves`` as (yours, reference) lists."""
    return ({k: (float(mine.loc[1, k]), float(ref.loc[1, k])) for k in at_step1},
            {k: (mine[k].dropna().tolist(), ref[k].dropna().tolist()) for k in curves})


def grade_training(policy_loss: Callable, name: str = LEARNER, steps: int = TRAIN_STEPS,
                   root: Path | None = None) -> dict[str, Any]:
    """(c): ``grpo_tiny`` trained ``steps`` steps with the learner's policy loss and with ``vanilla`` (trained once
    per process). Step 1 — the same rollouts, so the loss alone decides — must agree within ``STEP1_REL`` on
    actor/pg_loss, actor/pg_clipfrac and actor/ppo_kl; afterwards sampling differs once the weights differ in their
    last bit, so the curves must stay within bands: mean |Δ critic/score/mean| ≤ ``SCORE_BAND`` and mean
    actor/entropy within ``ENTROPY_REL``. Returns ``ok``, ``curves`` ({metric: (yours, vanilla)}) and ``line``."""
    refused = tampered()  # the reference run trains with loss_mode=vanilla, through the registry
    if refused:
        return {"ok": False, "first": {}, "curves": {}, "line": "(c) " + refused}
    plug_in(policy_loss, name)
    root = Path(root or tempfile.mkdtemp(prefix="ppolab-capstone-"))
    key = (steps,)
    if key not in _REFERENCE or not _REFERENCE[key].exists():
        _REFERENCE[key] = Path(short_run("vanilla", root / "vanilla", steps).path)
    from ppolab.run.reader import load_run

    ref = load_run(_REFERENCE[key]).metrics
    try:
        with _guarded_in_trainer(policy_loss, name):
            mine_path = short_run(name, root / f"{name}-{len(list(root.glob(f'{name}-*')))}", steps).path
    except Exception as e:  # noqa: BLE001 — the learner's code inside the trainer: one line
        return {"ok": False, "first": {}, "curves": {}, "line": tr("(c) not yet — ") + _raised(e)}
    first, curves = _side_by_side(load_run(mine_path).metrics, ref, ("actor/pg_loss", "actor/pg_clipfrac",
                                                                      "actor/ppo_kl"), ACTOR_CURVES)
    score_gap = sum(abs(a - b) for a, b in zip(*curves["critic/score/mean"])) / steps
    ent_mine, ent_ref = (sum(c) / len(c) for c in curves["actor/entropy"])
    bad = [tr("step 1 {key}: yours {got}, vanilla {want}").format(key=k, got=f"{a:.6g}", want=f"{b:.6g}")
           for k, (a, b) in first.items() if not _close(a, b, STEP1_REL, 1e-7)]
    if score_gap > SCORE_BAND:
        bad.append(tr("critic/score/mean is {gap} apart on average (band {band})").format(
            gap=f"{score_gap:.3f}", band=SCORE_BAND))
    if abs(ent_mine - ent_ref) > ENTROPY_REL * abs(ent_ref):
        bad.append(tr("mean actor/entropy {got} vs {want} (band ±{band})").format(
            got=f"{ent_mine:.4g}", want=f"{ent_ref:.4g}", band=f"{ENTROPY_REL:.0%}"))
    line = (tr("(c) right: {steps} steps of grpo_tiny trained with your loss — step 1 equal, score curves {gap} "
               "apart on average, entropy {got} vs {want}").format(steps=steps, gap=f"{score_gap:.3f}",
                                                                   got=f"{ent_mine:.4g}", want=f"{ent_ref:.4g}")
            if not bad else tr("(c) not yet — ") + "; ".join(bad))
    return {"ok": not bad, "first": first, "curves": curves, "line": line}


# ---------------------------------------------------------------------------------------------- (d) the critic trains
#: (d) the critic's short run: step 1 equal (same rollouts and values: the loss decides), then the critic/vf_loss
#: curve within ``VF_BAND`` of the reference's on average (relative to its mean) and critic/vf_explained_var within
#: ``EXPLAINED_BAND`` on average (sampling diverges once the weights differ in the last bit).
CRITIC_STEPS, VF_BAND, EXPLAINED_BAND = 20, 0.25, 0.15
CRITIC_CURVES = ("critic/vf_loss", "critic/vf_explained_var")
#: ppo_gae_tiny's critic with a window that binds (verl's ε_v 0.5 never does on values in [0, 1]; ppo_fire_tiny's
#: 0.1) and two critic epochs: the value clip fires from step 1 on, so a loss without it, or with it misplaced, trains
#: another critic.
CRITIC_FIRES = ("critic.cliprange_value=0.1", "critic.ppo_epochs=2")
_CRITIC_REFERENCE: dict[tuple, Path] = {}


def _reference_value_loss(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode, *,
                          global_batch_info=None):
    """verl's clipped value loss in the learner's form — the function captured at import (:data:`REF`), never a
    module attribute a learner's cell can rebind."""
    info = global_batch_info.as_kwargs() if global_batch_info is not None else {}
    return REF.compute_value_loss(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode, **info)


def short_critic_run(value_loss: Callable, out: Path, steps: int = CRITIC_STEPS):
    """``ppo_gae_tiny`` for ``steps`` steps with its critic trained by ``value_loss``, no validation, no recording,
    into ``out``: the same seed, data order and first rollouts whatever the loss."""
    return _short("ppo_gae_tiny", list(CRITIC_FIRES), out, steps, value_loss=value_loss)


def grade_critic_training(value_loss: Callable, steps: int = CRITIC_STEPS, root: Path | None = None) -> dict[str, Any]:
    """(d): ``ppo_gae_tiny``'s critic trained ``steps`` steps with the learner's value loss and with verl's (trained
    once per process). Step 1 — the same rollouts and values, so the loss alone decides — must agree within
    ``STEP1_REL`` on critic/vf_loss, critic/vf_clipfrac and critic/vpred_mean; afterwards the curves of
    :data:`CRITIC_CURVES` must stay within their bands. Returns ``ok``, ``first``, ``curves`` ({metric: (yours,
    verl's)}) and ``line``."""
    refused = tampered()
    if refused:
        return {"ok": False, "first": {}, "curves": {}, "line": "(d) " + refused}
    root = Path(root or tempfile.mkdtemp(prefix="ppolab-capstone-"))
    key = (steps,)
    if key not in _CRITIC_REFERENCE or not _CRITIC_REFERENCE[key].exists():
        _CRITIC_REFERENCE[key] = Path(short_critic_run(_reference_value_loss, root / "verl-critic", steps).path)
    from ppolab.run.reader import load_run

    def guarded(vpreds, *args: Any, **kwargs: Any) -> Any:
        out = call(value_loss, "value_loss", vpreds, *args, **kwargs)
        check_returned(out, "value_loss", vpreds)
        return plain(out, "value_loss")

    ref = load_run(_CRITIC_REFERENCE[key]).metrics
    try:
        mine_path = short_critic_run(guarded, root / f"critic-{len(list(root.glob('critic-*')))}", steps).path
    except Exception as e:  # noqa: BLE001 — the learner's code inside the trainer: one line
        return {"ok": False, "first": {}, "curves": {}, "line": tr("(d) not yet — ") + _raised(e)}
    first, curves = _side_by_side(load_run(mine_path).metrics, ref, ("critic/vf_loss", "critic/vf_clipfrac",
                                                                      "critic/vpred_mean"), CRITIC_CURVES)
    vf_mine, vf_ref = curves["critic/vf_loss"]
    vf_gap = sum(abs(a - b) for a, b in zip(vf_mine, vf_ref)) / steps / max(sum(vf_ref) / len(vf_ref), 1e-12)
    ev_gap = sum(abs(a - b) for a, b in zip(*curves["critic/vf_explained_var"])) / steps
    bad = [tr("step 1 {key}: yours {got}, verl's {want}").format(key=k, got=f"{a:.6g}", want=f"{b:.6g}")
           for k, (a, b) in first.items() if not _close(a, b, STEP1_REL, 1e-7)]
    if vf_gap > VF_BAND:
        bad.append(tr("critic/vf_loss is {gap} of its mean apart on average (band {band})").format(
            gap=f"{vf_gap:.0%}", band=f"{VF_BAND:.0%}"))
    if ev_gap > EXPLAINED_BAND:
        bad.append(tr("critic/vf_explained_var is {gap} apart on average (band {band})").format(
            gap=f"{ev_gap:.3f}", band=EXPLAINED_BAND))
    line = (tr("(d) right: {steps} steps of ppo_gae_tiny with your value loss training the critic — step 1 equal, "
               "critic/vf_loss {vf} of its mean apart on average, critic/vf_explained_var {ev}").format(
                steps=steps, vf=f"{vf_gap:.0%}", ev=f"{ev_gap:.3f}")
            if not bad else tr("(d) not yet — ") + "; ".join(bad))
    return {"ok": not bad, "first": first, "curves": curves, "line": line}


# ---------------------------------------------------------------------------------------------- all of them, in order
@dataclasses.dataclass
class Grade:
    """What :func:`grade` found: truthy when every grade it ran is right; shows as its lines in a notebook."""
    ok: bool
    lines: list[str]
    results: dict[str, dict[str, Any]]

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return "\n".join(self.lines)


def _unanswered(fn: Callable | None, what: str) -> str | None:
    """One line when ``fn`` is given but is not a function (a number, the result of calling it)."""
    if fn is None or callable(fn):
        return None
    return tr("{what} is not a function: pass the function itself").format(what=what)


def grade(policy_loss: Callable, actor_loss: Callable | None = None, value_loss: Callable | None = None, *,
          run: Any = None, train: bool = True) -> Grade:
    """Grade the learner's losses: (a) on the hidden cases; if right, (b) one replayed optimizer step of ``run``
    (its recorded step 1; skipped, with a line, on a run without one); if right and ``train``, (c) a short run, and
    if that is right, (d) a short run whose critic trains with the learner's value loss. A
    later grade runs only when the earlier ones are right, so the first line that says "not yet" names the part to
    fix. Each of the three functions is required: one left out (None) is named, and the verdict is not right. Never
    raises for the learner's code."""
    for fn, what in ((policy_loss, "policy_loss"), (actor_loss, "actor_loss"), (value_loss, "value_loss")):
        line = _unanswered(fn, what)
        if line:
            return Grade(False, [line], {})
    a = grade_hidden(policy_loss, actor_loss, value_loss)
    lines, results = [a["line"]], {"a": a}
    if a["ok"]:
        from ppolab.run.reader import resolve_run

        r = resolve_run(run)
        if 1 not in r.steps:
            lines.append(tr("(b) skipped: {run} recorded no step 1 to replay").format(run=r.path.name))
        else:
            results["b"] = b = grade_replay(policy_loss, r)
            lines.append(b["line"])
            if b["ok"] and train:
                results["c"] = c = grade_training(policy_loss)
                lines.append(c["line"])
                if c["ok"] and value_loss is not None:
                    results["d"] = d = grade_critic_training(value_loss)
                    lines.append(d["line"])
    missing = [name for fn, name in ((actor_loss, "actor_loss"), (value_loss, "value_loss")) if fn is None]
    if missing:  # lab 17 asks for all three: a verdict of right needs every one graded
        lines.append(tr("not right yet: {names} not given — lab 17 asks for all three functions; pass {them} to "
                        "grade(...)").format(names=tr(" and ").join(missing), them=tr(" and ").join(missing)))
    return Grade(not missing and all(x["ok"] for x in results.values()), lines, results)

