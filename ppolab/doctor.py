"""``ppolab doctor verl PATH``: a verl job's config read in the chapter's arithmetic, with the §16 mistakes it trips.

    ppolab doctor verl outputs/2026-12-03/10-00-00            # a Hydra output folder (its .hydra/config.yaml)
    ppolab doctor verl ppo_trainer.yaml actor_rollout_ref.rollout.n=8 --metrics run.jsonl
    ppolab doctor verl ppo_fire_tiny --metrics ppo_fire_tiny             # the shipped example job and its log

PATH is a verl output folder (Hydra writes the resolved-to-be config of ``trainer/main_ppo.py`` to
``.hydra/config.yaml``; a folder with several runs is searched three levels deep) or a verl YAML, with dotted
overrides as on verl's command line. The report (:func:`diagnose`, the same from a notebook cell):

1. **Arithmetic** (chapter §11–§12, lab 12's table): the step's trajectories, mini-batches and optimizer steps, the
   actor's micro-batches per rank (fixed or the token budget), the critic's (its engine's budget, §11.6), the
   reference's and the old-log-prob pass's, which KL path or paths, the loss mode and its aggregation;
2. **verl's own config checks** that would stop the job, before they cost a GPU hour: where verl is installed (as
   in a verl user's environment), verl's own ``utils/config.py::validate_config`` is run on the config as
   ``trainer/main_ppo.py`` calls it and its stop is quoted in its words (:func:`verl_verdict`); every stop is also
   listed from ppolab's ``check_config``, which holds verl 0.9.1's checks (the divisibility of ``validate_config``
   and of the workers' config dataclasses) and needs no verl;
3. **§16's nine mistakes** that this config (or its metrics) trips, one line each with what the chapter says — and
   nothing for a point that does not apply;
4. with ``--metrics`` (a FileLogger JSONL or a TensorBoard folder): lab 15's warning signs and the metric names
   ppolab has no description for (:mod:`ppolab.verl_logs`).

Keys of the verl config that ppolab's trainer has no field for are listed by count (verl has many: engines,
profilers, checkpoints); every number above is read from the fields ppolab shares with verl, under verl's names.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from ppolab.course import DATA
from ppolab.errors import FileFormatError, MissingFileError
from ppolab.i18n import Sign, sign_text, tr
# Reading the job, and verl's verdict on it, live in ppolab.verl_config; named here as the doctor's API too.
from ppolab.verl_config import (EXPECTED, VERL_GROUPS, DataParallel, apply_overrides, data_parallel,  # noqa: F401
                                disarm, find_config, read_verl_config, verl_verdict)
from ppolab import verl_versions
from ppolab.verl_versions import VerlVersion
from ppolab.vocab import clip_bounds, clip_ratio_unread

#: The shipped example of a verl job: the output folder of a verl 0.9.1 job with ppo_fire_tiny's settings, its
#: ``.hydra/config.yaml`` composed by verl's own Hydra config (tools/verl_config_example.py) — what labs 12 and 16
#: open when the learner names no job of their own (``PPOLAB_VERL_JOB``).
EXAMPLE_JOB = DATA / "verl_jobs" / "ppo_fire_tiny"


def shipped(path: str | Path | None, folder: str, suffix: str = "") -> str | Path | None:
    """``path`` itself, unless it names nothing here and is the name of a shipped example (``ppo_fire_tiny``): then
    that example's path under the course data (``DATA/<folder>/<name><suffix>``) — so ``ppolab doctor verl
    ppo_fire_tiny --metrics ppo_fire_tiny`` works from a wheel install, as shipped runs open by name."""
    if path is None or Path(path).expanduser().exists() or "/" in str(path) or "\\" in str(path):
        return path
    candidate = DATA / folder / f"{path}{suffix}"
    return candidate if candidate.exists() else path


def lab_job() -> Path:
    """The verl job a lab opens: ``$PPOLAB_VERL_JOB`` when set (an output folder or a verl YAML), else
    :data:`EXAMPLE_JOB`."""
    import os

    return Path(os.environ["PPOLAB_VERL_JOB"]).expanduser() if os.environ.get("PPOLAB_VERL_JOB") else EXAMPLE_JOB


#: Fields whose values ppolab's own trainer limits more narrowly than verl does (its loggers; verl's −1 for "no
#: cap" or "use the warm-up ratio"): the doctor does not read them, so ppolab's limits never pass for verl's checks.
NOT_VERLS_LIMITS = frozenset({"trainer.logger", "data.val_max_samples", "data.train_max_samples",
                              "actor_rollout_ref.rollout.name",  # ppolab: hf | vllm, and its rollout dtype hf only
                              "actor_rollout_ref.actor.optim.lr_warmup_steps", "critic.optim.lr_warmup_steps"})


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def ppolab_view(raw: dict[str, Any]):
    """(ppolab's PPOConfig of the fields it shares with ``raw``, the verl keys it has no field for, the shared keys
    whose value ppolab cannot take — with the value): verl's names, ppolab's types."""
    from ppolab.config import ConfigError
    from ppolab.config.loader import compose, to_tree, valid_keys

    known = set(valid_keys()) - NOT_VERLS_LIMITS
    flat = _flat(raw)
    shared = {k: v for k, v in flat.items() if k in known and v is not None}
    ignored = sorted(k for k in flat if k not in known)
    refused: dict[str, Any] = {}
    for _ in range(len(shared) + 1):
        try:
            return compose([("verl config", to_tree("verl config", shared))]), ignored, refused
        except ConfigError as e:
            bad = next((k for k in shared if f"{k}=" in str(e)), None)
            if bad is None:
                raise
            refused[bad] = shared.pop(bad)
    raise AssertionError("unreachable")


def layout_line(par: DataParallel) -> str:
    """One line: the actor's data-parallel size and what it is divided from (:func:`ppolab.verl_config.
    data_parallel`) — the divisor of every per-rank number the report prints (chapter §11.4)."""
    if par.error:
        return tr("STOP: {world} GPU(s) cannot be cut into model-parallel groups of {group} ({source}): verl cannot "
                  "lay this job out — make the GPU count a multiple of the group").format(
            world=par.world, group=par.group, source=par.source)
    if par.group == "dynamic CP":
        return tr("data-parallel size 1 ({source}: every rank holds the whole batch)").format(source=par.source)
    if not par.group and "." not in par.source:
        return tr("data-parallel size taken as the {world} GPU(s): ppolab does not read the {engine} engine's "
                  "parallel sizes").format(world=par.world, engine=par.source)
    if not par.group:
        return tr("data-parallel size {dp}: every GPU is a data-parallel rank (no sequence or model "
                  "parallelism)").format(dp=par.dp)
    return tr("data-parallel size {dp} = {world} GPU(s) ÷ ({group}) ({source}): the per-rank numbers below divide "
              "by {dp}, not by the GPU count (§11.4)").format(dp=par.dp, world=par.world, group=par.group,
                                                              source=par.source)


def version_line(v: VerlVersion) -> str:
    """One line: the verl release(s) the job's config keys point to (:func:`ppolab.verl_versions.job_version`)."""
    t = verl_versions.table()
    first, last = t["versions"][0], t["versions"][-1]
    said = "; ".join((tr("{key} from {release}") if bound == "from" else tr("{key} until {release}")).format(
        key=key, release=release) for key, bound, release in v.evidence)
    if not v.releases:
        line = tr("verl version: its keys fit no single release from {first} to {last} (a hand-edited config, or keys "
                  "added with +): read with {last}'s rules").format(first=first, last=last)
    elif v.releases == (last,):
        line = tr("verl version: {span} by its keys ({evidence}) — the release ppolab follows").format(
            span=v.span, evidence=said)
    else:
        line = tr("verl version: {span} by its keys ({evidence}); read with {last}'s rules, and where {span}'s update "
                  "differs the arithmetic says so").format(span=v.span, evidence=said or "—",
                                                            last=last)
    if v.unknown and v.releases and v.releases[-1] == last:
        line += tr("; {n} key(s) no release up to {last} has ({key}…): a newer verl, or added with +").format(
            n=len(v.unknown), last=last, key=v.unknown[0])
    return line


def arithmetic(cfg, dp: int, version: VerlVersion | None = None) -> list[tuple[str, str, str]]:
    """Lab 12's table of the step (chapter §11–§12), then one line each for the passes' micro-batching, the KL
    paths and the loss: (quantity, formula or setting, value)."""
    from ppolab.batching import plan_batches
    from ppolab.config.validation import CRITIC_TOP_LEVEL_BUDGET

    a, ro, ref, c, alg = (cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.ref,
                          cfg.critic, cfg.algorithm)
    n = ro.n
    critic = alg.adv_estimator == "gae"
    micro = None if a.use_dynamic_bsz else a.ppo_micro_batch_size_per_gpu
    plan = plan_batches(cfg.data.train_batch_size, n, a.ppo_mini_batch_size, dp, micro, a.ppo_epochs,
                        pad_to=cfg.padding_multiple(dp))
    rows = [(tr(q), tr(f, may_stay=True), v) for q, f, v in plan.rows()]  # a formula's words; its keys stay
    unset = tr("unset (see verl's checks)")
    rows.append((tr("actor micro-batches (§11.5)"), f"use_dynamic_bsz={a.use_dynamic_bsz}",
                 tr("ppo_max_token_len_per_gpu={n} tokens a micro-batch").format(n=a.ppo_max_token_len_per_gpu)
                 if a.use_dynamic_bsz else tr("ppo_micro_batch_size_per_gpu={n} rows").format(
                     n=a.ppo_micro_batch_size_per_gpu) if a.ppo_micro_batch_size_per_gpu else unset))
    uses_ref = alg.use_kl_in_reward or a.use_kl_loss
    for name, part in (("old log-prob pass (§2)", ro), ("reference pass (§7)", ref)):
        if part is ref and not uses_ref:
            rows.append((tr(name), "use_kl_in_reward / use_kl_loss",
                         tr("not built: no KL path needs π_ref (verl's trainer/ppo/utils.py::need_reference_policy)")))
            continue
        rows.append((tr(name), f"log_prob_use_dynamic_bsz={part.log_prob_use_dynamic_bsz}",
                     tr("{n} tokens a micro-batch").format(n=part.log_prob_max_token_len_per_gpu)
                     if part.log_prob_use_dynamic_bsz else tr("{n} rows a micro-batch").format(
                         n=part.log_prob_micro_batch_size_per_gpu) if part.log_prob_micro_batch_size_per_gpu
                     else unset))
    if critic:
        rows.append((tr("critic micro-batches (§11.6: V1's engine)"), "ppo_infer_max_token_len_per_gpu, dynamic",
                     tr("{n} tokens a micro-batch; {epochs} epoch(s) of {mini}×{rollout_n} rows").format(
                         n=c.ppo_infer_max_token_len_per_gpu, epochs=c.ppo_epochs, mini=c.ppo_mini_batch_size,
                         rollout_n=n)))
        # what a verl user sets for the critic and V1's trainer never hands its engine (chapter §11.6)
        ignored = [f"critic.{k}={v}" for k, v in (
            ("ppo_micro_batch_size_per_gpu", None if c.use_dynamic_bsz else c.ppo_micro_batch_size_per_gpu),
            ("ppo_max_token_len_per_gpu", c.ppo_max_token_len_per_gpu
             if c.ppo_max_token_len_per_gpu not in (CRITIC_TOP_LEVEL_BUDGET, c.ppo_infer_max_token_len_per_gpu)
             else None)) if v is not None]
        if ignored:
            rows[-1] = rows[-1][:2] + (rows[-1][2] + tr(" — ignored by V1's critic engine: {keys}").format(
                keys=", ".join(ignored)),)
    paths = []
    if alg.use_kl_in_reward:
        paths.append(tr("reward side: {estimator}, {ctrl} β={beta} (§7.1)").format(
            estimator=alg.kl_penalty, ctrl=alg.kl_ctrl.type, beta=alg.kl_ctrl.kl_coef))
        if alg.kl_ctrl.kl_coef == 0 and alg.kl_ctrl.type == "fixed":
            paths[-1] += tr(" — β = 0: a no-op that still runs the reference pass")
    if a.use_kl_loss:
        paths.append(tr("loss side: {estimator}, kl_loss_coef={coef} (§7.2)").format(
            estimator=a.kl_loss_type, coef=a.kl_loss_coef))
        if a.kl_loss_coef == 0:
            paths[-1] += tr(" — β = 0: a no-op that still runs the reference pass")
    rows.append((tr("KL to π_ref (§7)"), "use_kl_in_reward / use_kl_loss",
                 "; ".join(paths) or tr("neither path is on")))
    if version is not None and version.legacy_workers and a.loss_agg_mode == "token-mean":
        # verl ≤ 0.7.1's legacy dp_actor: no global token count reached agg_loss (ppolab.verl_versions)
        rows.append((tr("token-mean in verl {span}").format(span=version.span), "workers/actor/dp_actor.py (legacy)",
                     tr("each micro-batch's own token mean × 1/gradient_accumulation: micro-batches weigh by their "
                        "rows, not their tokens — from 0.8.0 (and in ppolab) every token sum is divided by the "
                        "mini-batch's global token count (§10.1, lab 13)")))
    low, high = clip_bounds(a)
    rows.append((tr("policy loss (§3–§5, §10)"), f"loss_mode={a.policy_loss.loss_mode}",
                 f"loss_agg_mode={a.loss_agg_mode}, clip ε=({low}, {high}), c={a.clip_ratio_c}, "
                 f"entropy_coeff={a.entropy_coeff}"))
    return rows


def notes(cfg) -> list[str]:
    """What the config says that its writer may not mean (beside §16's points): a ``clip_ratio`` the window does not
    read — verl 0.9.1's defaults set ``clip_ratio_low`` and ``clip_ratio_high`` to 0.2 themselves, so changing
    ``clip_ratio`` alone leaves the window where it was (chapter §4)."""
    a = cfg.actor_rollout_ref.actor
    low, high = clip_bounds(a)
    if a.policy_loss.loss_mode == "vanilla" and clip_ratio_unread(a):
        return [sign_text(Sign(
            "§4 clip_ratio={eps} is not the clip window: clip_ratio_low={low} and clip_ratio_high={high} are set "
            "(verl's defaults set both to 0.2), and compute_policy_loss_vanilla reads clip_ratio only where they "
            "are null — set clip_ratio_low and clip_ratio_high for the window you mean",
            eps=a.clip_ratio, low=low, high=high))]
    return []


def _metric(frame, name: str) -> float | None:
    if frame is None or name not in frame.columns:
        return None
    col = frame[name].dropna()
    return float(col.iloc[-len(col) // 2:].median()) if len(col) else None


def mistakes(cfg, dp: int, frame=None) -> list[Sign]:
    """§16's points this config (and, given, its metrics ``frame``) trips: one line each, with the chapter's word
    (each a :class:`~ppolab.i18n.Sign`: the English line, shown in the notebook's language)."""
    a, ro, alg = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.algorithm
    out = []
    if alg.adv_estimator in ("grpo", "grpo_passk", "grpo_vectorized", "rloo", "rloo_vectorized") \
            and a.policy_loss.loss_mode == "vanilla":
        out.append(Sign("§16 mistake 1: "
                        "adv_estimator={estimator} with policy_loss.loss_mode=vanilla: the advantages are "
                        "{estimator}'s, the loss is still vanilla PPO's clipped loss — the estimator does not change "
                        "the loss",
                        estimator=alg.adv_estimator))
    if frame is not None and "actor/ppo_kl" in frame.columns and any(
            k in frame.columns for k in ("actor/kl_loss", "actor/reward_kl_penalty")):
        out.append(Sign("§16 mistake 2: "
                        "actor/ppo_kl is logged beside the reference KL: ppo_kl compares π_θ with π_old (PPO's "
                        "old policy), the reference KL is actor/kl_loss or actor/reward_kl_penalty — another path"))
    if alg.use_kl_in_reward and a.use_kl_loss:
        out.append(Sign("§16 mistake 3: "
                        "both KL paths are on (reward side β={beta}, loss side kl_loss_coef={coef}): they act "
                        "in different stages and add up — two constraints", beta=alg.kl_ctrl.kl_coef,
                        coef=a.kl_loss_coef))
    if not a.use_dynamic_bsz and a.ppo_micro_batch_size_per_gpu and \
            a.ppo_micro_batch_size_per_gpu * dp < a.ppo_mini_batch_size * ro.n:
        out.append(Sign("§16 mistake 4: "
                        "micro-batch {micro}/GPU is only a gradient-accumulation slice: the optimizer steps "
                        "once per mini-batch of {mini} trajectories", micro=a.ppo_micro_batch_size_per_gpu,
                        mini=a.ppo_mini_batch_size * ro.n))
    if ro.n > 1:
        out.append(Sign("§16 mistake 5: ppo_mini_batch_size={mini} counts prompts: the trainer multiplies it by "
                        "rollout.n={n}, so a mini-batch is {rows} trajectories (memory and optimizer steps follow "
                        "that number)", mini=a.ppo_mini_batch_size, n=ro.n, rows=a.ppo_mini_batch_size * ro.n))
    if a.ppo_epochs > 1:
        n_mini = -(-cfg.data.train_batch_size // a.ppo_mini_batch_size)
        out.append(Sign("§16 mistake 6: "
                        "ppo_epochs={epochs}: not a repeated forward — {epochs} epochs × {n_mini} mini-batches "
                        "= {steps} optimizer steps each training step, the same data re-scored by the updated "
                        "policy", epochs=a.ppo_epochs, n_mini=n_mini, steps=a.ppo_epochs * n_mini))
    weighting = {"token-mean": "every token weighs the same, so long responses weigh more",
                 "seq-mean-token-mean": "every response weighs the same, so a long response's tokens weigh less",
                 "seq-mean-token-sum": "every response's summed tokens: long responses weigh more",
                 "seq-mean-token-sum-norm": "summed tokens over a constant: long responses weigh more"}
    # §16's seventh mistake is about length: only where the job's responses differ in length (its log says so) is
    # the weighting a choice with consequences — without metrics the doctor cannot know, and a line on every job is
    # noise
    longest, shortest = _metric(frame, "response_length/max"), _metric(frame, "response_length/min")
    if longest is not None and shortest is not None and longest >= 1.5 * max(shortest, 1.0):
        out.append(Sign("§16 mistake 7: loss_agg_mode={mode}: {weighting} — and this job's responses run from "
                        "{short:.0f} to {long:.0f} tokens (response_length/min and /max, the later steps' median): "
                        "token-mean and seq-mean-token-mean optimise differently weighted objectives",
                        mode=a.loss_agg_mode, weighting=tr(weighting.get(a.loss_agg_mode, "its own weighting")),
                        short=shortest, long=longest))
    multi = getattr(getattr(ro, "multi_turn", None), "enable", False)
    if multi:
        out.append(Sign("§16 mistake 8: "
                        "multi-turn rollout with tools: tool observations join the context (attention) with "
                        "response_mask=0, so they are not the model's actions and stay out of the actor loss"))
    if frame is not None:
        adv_max, adv_min = _metric(frame, "critic/advantages/max"), _metric(frame, "critic/advantages/min")
        kl, beta = _metric(frame, "actor/reward_kl_penalty"), _metric(frame, "actor/reward_kl_penalty_coeff")
        score = _metric(frame, "critic/score/mean")
        if adv_max is not None and adv_min is not None and abs(adv_max) < 1e-6 and abs(adv_min) < 1e-6:
            out.append(Sign("§16 mistake 9: "
                            "the advantages are zero (critic/advantages max = min = 0 over the later steps): "
                            "groups with uniform rewards — no learnable signal, whatever the clip ratio"))
        elif kl is not None and beta is not None and score is not None and beta * kl > abs(score):
            out.append(Sign("§16 mistake 9: "
                            "the reward is drowned by the KL: β·KL ≈ {penalty:.3g} per token against a mean "
                            "score {score:.3g} — the clip has no task signal to keep in check",
                            penalty=beta * kl, score=score))
    return out


def _division_text(error: ValueError) -> str:
    """The planner's division that did not come out even (:class:`ppolab.batching.NotDivisible`) in the report's
    language; any other error as its text."""
    from ppolab.batching import NotDivisible

    if not isinstance(error, NotDivisible):
        return str(error)
    return tr("{a} = {x} is not divisible by {b} = {y}").format(a=error.num_label, x=error.num, b=error.den_label,
                                                                 y=error.den)


#: Where a stop of ppolab's check_config cites verl's own code that asserts it when the job runs (not its
#: validate_config): such a stop is verl's even where validate_config passes.
VERL_RUNTIME_ASSERTS = ("workers/engine_workers.py::TrainingWorker.train_mini_batch",
                        "workers/engine/utils.py::prepare_micro_batches")

#: The report's parts, in order: verl's own checks, the arithmetic (lab 12), §16's points (lab 16), the metrics
#: report (lab 15; only with ``metrics``).
PARTS = ("checks", "arithmetic", "mistakes", "metrics")


def diagnose(path: str | Path, overrides: Sequence[str] = (), metrics: str | Path | None = None,
             parts: Sequence[str] = PARTS) -> list[str]:
    """The doctor's report as lines (see the module's docstring), in the notebook's language (``ppolab.i18n``);
    the same text the command prints. ``parts``: those of :data:`PARTS` to show (the first line, naming the config,
    always comes)."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"parts={list(parts)!r}: unknown {unknown}; choose from {list(PARTS)}")
    from ppolab.config.validation import check_config

    path, metrics = shipped(path, "verl_jobs"), shipped(metrics, "verl_logs", ".jsonl")
    raw, f = read_verl_config(path, overrides)
    cfg, ignored, refused = ppolab_view(raw)
    par = data_parallel(raw)
    release = verl_versions.job_version(raw)
    world, dp = par.world, par.dp
    try:  # the shipped example by its place in the project, not this machine's absolute path
        shown = f.resolve().relative_to(EXAMPLE_JOB.parents[2])
    except ValueError:
        shown = f
    lines = [tr("verl config {path} — {world} GPU(s) (trainer.n_gpus_per_node × nnodes); {ignored} verl keys "
                "ppolab has no field for are not read").format(path=shown, world=world, ignored=len(ignored)),
             "  " + layout_line(par), "  " + version_line(release)]
    lines += [tr("  {key}={value!r}: ppolab cannot read this value (left at its default)").format(key=k, value=v)
              for k, v in refused.items()]
    try:
        errors, _ = check_config(cfg.resolve(), world, dp, megatron=par.strategy == "megatron")
    except Exception as e:  # noqa: BLE001 — a field combination the checks cannot even evaluate
        errors = [f"{type(e).__name__}: {e}"]
    if "checks" in parts:
        lines.append("")
        refused, changed, _ = disarm(raw)
        verdict = None if refused else verl_verdict(raw)
        verl_stops = verdict is not None and verdict[1] is not None and not verdict[1].startswith("could not run")
        lines.append(tr("verl's own checks:") if errors or verl_stops or refused
                     else tr("verl's own checks: none would stop this job"))
        if verdict is not None:
            version, stop = verdict
            if stop is None:
                said = tr("passes")
            elif stop.startswith("could not run: "):
                said = tr("could not run here ({why}); ppolab's copy of its checks follows").format(
                    why=stop[len("could not run: "):])
            else:
                said = tr("stops: {stop}").format(stop=stop)
            lines.append("  " + tr("verl {version}'s utils/config.py::validate_config, run here: {said}").format(
                version=version, said=said))
        if refused:
            lines.append("  " + tr("verl's utils/config.py::validate_config is not run on this config: it names "
                                   "code verl would run (the doctor runs nothing a config names); ppolab's copy of "
                                   "its checks follows"))
        lines += [f"  {tr('not run:')} {r}" for r in refused] + [f"  {c}" for c in changed if verdict is not None]
        if verdict is not None and verdict[1] is None:
            # verl's validate_config ran and passes the job: a stop stays one only where it cites what verl's own
            # workers assert at the first update; the rest is ppolab's rule, never a stop under verl's name
            runtime = [e for e in errors if any(place in e for place in VERL_RUNTIME_ASSERTS)]
            ours = [e for e in errors if e not in runtime]
            lines += [f"  STOP: {e}" for e in runtime]
            if ours:
                lines.append("  " + tr("ppolab's own checks refuse what verl passes — ppolab's rules, not verl's "
                                       "verdict (verl runs this job):"))
                lines += [f"  {tr('ppolab only:')} {e}" for e in ours]
        else:
            lines += [f"  STOP: {e}" for e in errors]
        if not errors and (refused or (verdict is not None and verdict[1] is not None
                                       and verdict[1].startswith("could not run"))):
            lines.append("  " + tr("ppolab's copy of verl's checks: none would stop this job"))
    if "arithmetic" in parts:
        lines.append("")
        lines.append(tr("the step in the chapter's arithmetic (§11–§12, lab 12):"))
        try:
            rows = arithmetic(cfg, dp, release)
            w0 = max(len(q) for q, _, _ in rows)
            lines += [f"  {q:<{w0}}  {v}  ({formula})" for q, formula, v in rows]
        except ValueError as e:  # a division verl would refuse: named above; the arithmetic stops there too
            lines.append("  " + tr("cannot be laid out: {error}").format(error=_division_text(e)))
        lines += [f"  {note}" for note in notes(cfg)]
    frame = None
    if metrics is not None:
        from ppolab.verl_logs import read_verl_metrics

        frame = read_verl_metrics(metrics)
    if "mistakes" in parts:
        lines.append("")
        lines.append(tr("§16, the nine mistakes — what this job trips:"))
        lines += [f"  {sign_text(m)}" for m in mistakes(cfg, dp, frame)]
    if metrics is not None and "metrics" in parts:
        from ppolab.verl_logs import report

        lines.append("")
        lines += report(metrics)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``ppolab doctor verl PATH [--metrics FILE_OR_DIR] [key=value …]``."""
    p = argparse.ArgumentParser(prog="ppolab doctor", description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("verl",), help="what to examine: a verl job")
    p.add_argument("path", help="a verl output folder (its .hydra/config.yaml), a verl YAML, or the shipped example's "
                                "name (ppo_fire_tiny)")
    p.add_argument("--metrics", help="the job's metrics: a FileLogger JSONL or a TensorBoard folder (ppo_fire_tiny: "
                                     "the shipped example's log)")
    p.add_argument("--zh", action="store_true", help="the report in Chinese, as a Chinese notebook shows it")
    p.add_argument("overrides", nargs="*", help="verl overrides, key=value")
    args = p.parse_intermixed_args(argv)  # options anywhere: `doctor verl JOB --zh key=value` as well
    from ppolab.config import ConfigError
    from ppolab.i18n import get_language, set_language

    before = get_language()
    if args.zh:
        set_language("zh")
    try:
        print("\n".join(diagnose(args.path, args.overrides, args.metrics)))
    except (FileFormatError, MissingFileError, ConfigError) as e:  # ConfigError: an override (apply_overrides)
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        set_language(before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
