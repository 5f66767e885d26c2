"""Chapter §15's numbers: what each logged metric means and the warning signs found in a run's metrics."""
from __future__ import annotations

import math

from ppolab.i18n import Sign, sign_text, tr  # noqa: F401 (sign_text re-exported)
from ppolab.run.reader import resolve_run


#: One line per verl metric name (exact names; ``prefix/*`` entries cover a family, see :func:`meaning`).
METRIC_MEANINGS = {
    "actor/pg_loss": "policy-gradient loss after loss_agg_mode; its sign alone says little — read it with the "
                     "advantage scale",
    "actor/pg_clipfrac": "share of response tokens where the clipped surrogate was the active branch "
                         "(micro-batch masked means, averaged)",
    "actor/pg_clipfrac_lower": "share of tokens where the dual clip (clip_ratio_c) bounded a negative-advantage loss",
    "actor/ppo_kl": "approximate KL between the current policy and π_old (the PPO anchor) — not the reference KL",
    "actor/entropy": "mean token entropy of π_old on the response tokens (aggregated with loss_agg_mode)",
    "actor/entropy_loss": "the entropy term of the actor loss, aggregated with loss_agg_mode",
    "actor/kl_loss": "loss-side KL estimator to π_ref, before multiplying by kl_loss_coef",
    "actor/kl_coef": "kl_loss_coef: the weight of actor/kl_loss in the actor loss",
    "actor/loss": "the total actor loss that was back-propagated (pg_loss − entropy_coeff·entropy + kl_coef·kl_loss)",
    "actor/grad_norm": "global gradient norm of the actor before clipping (optim.clip_grad)",
    "actor/lr": "the actor's learning rate at this step",
    "actor/reward_kl_penalty": "reward-side KL estimate between π_old and π_ref (use_kl_in_reward)",
    "actor/reward_kl_penalty_coeff": "reward-side β, the coefficient subtracted per token from the reward "
                                     "(adaptive or fixed)",
    "critic/vf_loss": "clipped value regression loss ½·max((V−G)², (V_clip−G)²)",
    "critic/vf_clipfrac": "share of tokens where the clipped value error was the larger one",
    "critic/vpred_mean": "mean critic prediction during the critic update",
    "critic/vf_explained_var": "1 − Var(G − V)/Var(G): how much of the return variance the critic explains "
                               "(1 perfect, ≤0 useless)",
    "critic/grad_norm": "global gradient norm of the critic before clipping",
    "critic/loss": "the total critic loss that was back-propagated",
    "critic/lr": "the critic's learning rate at this step",
    "critic/score/*": "sequence score from the reward function (sum of token_level_scores per real trajectory)",
    "critic/rewards/*": "sequence reward after reward-side KL (sum of token_level_rewards per real trajectory)",
    "critic/advantages/*": "advantages over the valid response tokens",
    "critic/returns/*": "returns (value targets) over the valid response tokens",
    "critic/values/*": "V_old, the critic's values over the valid response tokens",
    "response_length/*": "response tokens per real trajectory (response_mask sums)",
    "response_length/clip_ratio": "share of responses that hit data.max_response_length (truncated)",
    "prompt_length/*": "prompt tokens per real trajectory",
    "val/accuracy": "greedy validation accuracy on the held-out prompts",
    "val/reward_mean": "mean validation reward",
    "val/response_length_mean": "mean validation response length",
    "val-core/*": "verl's per-data-source validation metric (reward mean@k)",
    "timing_s/*": "wall-clock seconds of one stage of the step "
                  "(gen, reward, balance, old_log_prob, ref, values, adv, update_*)",
    "perf/total_num_tokens": "prompt + response tokens of the step batch",
    "perf/time_per_step": "wall-clock seconds of the whole step",
    "perf/throughput": "tokens per second per data-parallel rank",
    "perf/*": "performance counters",
    "training/global_step": "the training step counter",
    "training/epoch": "pass over the training prompts",
    "training/rollout_probs_diff_max": "max |π_old − π_rollout| probability gap on response tokens "
                                       "(rollout/training mismatch)",
    "training/rollout_probs_diff_mean": "mean |π_old − π_rollout| probability gap on response tokens",
    "training/rollout_probs_diff_std": "std of |π_old − π_rollout| on response tokens",
    "training/*": "trainer bookkeeping",
    "ppolab/signal/uniform_group_frac": "ppolab's own (verl logs none): share of the prompt groups whose responses "
                                        "all got the same score — a group-relative advantage is 0 there",
    "ppolab/signal/identical_group_frac": "ppolab's own: share of the prompt groups whose responses are token for "
                                          "token identical (a near-greedy sampler)",
    "ppolab/signal/zero_adv_frac": "ppolab's own: share of the response tokens whose advantage is 0 (no learning "
                                   "signal there)",
    "ppolab/dump/*": "from a verl job's rollout dumps (trainer.rollout_data_dir), per step: trajectories, groups, "
                     "scores and response lengths in characters (ppolab.verl_dumps)",
    "global_seqlen/min": "smallest per-rank token sum without balancing (contiguous chunks)",
    "global_seqlen/max": "largest per-rank token sum without balancing",
    "global_seqlen/minmax_diff": "max − min of the unbalanced per-rank token sums",
    "global_seqlen/balanced_min": "smallest per-rank token sum after Karmarkar–Karp balancing",
    "global_seqlen/balanced_max": "largest per-rank token sum after balancing",
    "global_seqlen/mean": "tokens per rank on average",
    "rollout_corr/*": "rollout-correction diagnostics (IS weights, mismatch KL) of π_old vs π_rollout",
}


#: Thresholds of :func:`warning_signs`.
THRESHOLDS = {
    "pg_clipfrac_high": 0.2,  # median of the late half above this: updates too large
    "ppo_kl_large": 0.05,  # |ppo_kl| above this at any step
    "entropy_collapse_ratio": 0.1,  # late entropy below this fraction of the early entropy
    "grad_norm_spike": 10.0,  # a grad_norm above this many times the run's median
    "clip_ratio_high": 0.2,  # response_length/clip_ratio mean of the late half above this
    "vf_clipfrac_high": 0.3,  # critic/vf_clipfrac median of the late half above this
    "pg_clipfrac_lower_high": 0.05,  # dual-clip share above this in the late half
    "pg_clipfrac_zero": 0.0,  # late max of pg_clipfrac at or below this: the policy barely moves (§15 table)
    "kl_term_dominates": 1.0,  # late median kl_coef·kl_loss above this many times |pg_loss| (§15 table)
    "vf_loss_large": 0.5,  # late median vf_loss above this fraction of ½·(returns max − min)² (§15 table)
    "rollout_probs_diff_high": 0.01,  # mean |π_old − π_rollout| above this at any step (a bf16 vLLM run: ~1e-3)
}


def known_meaning(name: str) -> str | None:
    """The one-line meaning of metric ``name`` (exact entry first, then the longest matching ``prefix/*``), or None
    for a name ppolab has no description for."""
    if name in METRIC_MEANINGS:
        return METRIC_MEANINGS[name]
    parts = name.split("/")
    for cut in range(len(parts) - 1, 0, -1):
        key = "/".join(parts[:cut]) + "/*"
        if key in METRIC_MEANINGS:
            return METRIC_MEANINGS[key]
    return None


def meaning(name: str) -> str:
    """:func:`known_meaning`, or a line saying ppolab has no description for that name."""
    return known_meaning(name) or "(no description: not a verl metric name ppolab knows)"


def _frame(run):
    import pandas as pd

    if isinstance(run, pd.DataFrame):
        return run
    return resolve_run(run).metrics


def _numbers(m):
    """``m`` with each column of objects or text as numbers when every value reads as one (``"0.5"``, a bool), else left
    out: a metric a custom reward or a damaged log holds as text, an object or a list has no sign to read."""
    import pandas as pd

    mixed = [c for c in m.columns if not pd.api.types.is_numeric_dtype(m[c])]  # objects, or pandas 3's str
    if not mixed:
        return m
    m = m.copy()
    for c in mixed:
        try:
            m[c] = pd.to_numeric(m[c].map(lambda v: float(v) if isinstance(v, bool) else v))
        except (ValueError, TypeError, OverflowError):
            del m[c]
    return m


def warning_signs(run=None, thresholds: dict | None = None) -> list[str]:
    """Chapter §15's warning signs, checked on a run's metrics (a Run, a run name/path, or a metrics DataFrame
    indexed by step). Returns one human-readable English line per sign found (empty list: nothing alarming);
    each is a :class:`Sign`, which :func:`sign_text` shows in the notebook's language.

    "Late" means the second half of the training steps. Checks: non-finite losses; actor/pg_clipfrac persistently
    high; |actor/ppo_kl| large; actor/pg_clipfrac_lower high; actor/entropy collapse; actor/grad_norm and
    critic/grad_norm spikes; response_length/clip_ratio high; critic/vf_clipfrac high; critic/vf_explained_var
    negative late in training; actor/pg_clipfrac stuck at 0; the loss-side KL term kl_coef·kl_loss larger
    than |pg_loss|; critic/vf_loss persistently large against the spread of the returns; the rollout engine
    disagreeing with the trainer (training/rollout_probs_diff_mean); critic/score non-finite or the same for
    every response.
    """
    th = {**THRESHOLDS, **(thresholds or {})}
    unknown = set(thresholds or {}) - set(THRESHOLDS)
    if unknown:
        raise ValueError(f"unknown thresholds {sorted(unknown)}; allowed: {list(THRESHOLDS)}")
    m = _numbers(_frame(run))
    if "training/global_step" in m:  # step 0 holds only the validation before training
        m = m[m["training/global_step"].notna()]
    out: list[str] = []
    if len(m) == 0:
        return out
    from ppolab.rewards import reward_warning_signs

    # critic/score non-finite (NaN/inf, logged as null) or the same for every response
    out += reward_warning_signs(m)

    def col(name):
        return m[name].dropna() if name in m else None

    def late(s):
        return s.iloc[len(s) // 2:]

    for name in ("actor/pg_loss", "actor/loss", "critic/vf_loss", "actor/grad_norm", "critic/grad_norm"):
        if name not in m or m[name].notna().sum() < len(m) / 2:  # not logged (or logged only occasionally)
            continue
        s = m[name].astype(float)
        bad = s[~s.apply(math.isfinite)]  # NaN (logged as null) or ±inf
        if len(bad):
            out.append(Sign("{name} is not finite (NaN/inf) at {n} step(s), first at step {first}",
                            name=name, n=len(bad), first=bad.index[0]))
    s = col("actor/pg_clipfrac")
    if s is not None and len(s) and late(s).median() > th["pg_clipfrac_high"]:
        out.append(Sign("actor/pg_clipfrac persistently high (late median {median:.3f} > {limit}): updates too "
                        "large — lower lr, ppo_epochs or raise the mini-batch",
                        median=late(s).median(), limit=th["pg_clipfrac_high"]))
    if s is not None and len(s) >= 2 and late(s).max() <= th["pg_clipfrac_zero"]:
        out.append(Sign("actor/pg_clipfrac stays at 0 (late max {max:.3g}): the policy barely moves between π_old "
                        "and the update — expected only with one mini-batch and one epoch (fully on-policy)",
                        max=late(s).max()))
    s = col("actor/ppo_kl")
    if s is not None and len(s) and s.abs().max() > th["ppo_kl_large"]:
        out.append(Sign("actor/ppo_kl large (max |ppo_kl| {max:.4f} at step {step} > {limit}): the update moved far "
                        "from π_old", max=s.abs().max(), step=s.abs().idxmax(), limit=th["ppo_kl_large"]))
    s = col("actor/pg_clipfrac_lower")
    if s is not None and len(s) and late(s).mean() > th["pg_clipfrac_lower_high"]:
        out.append(Sign("actor/pg_clipfrac_lower high (late mean {mean:.3f}): extreme ratios on negative advantages",
                        mean=late(s).mean()))
    s = col("actor/entropy")
    if s is not None and len(s) >= 4:
        early = s.iloc[: max(1, len(s) // 10)].mean()
        end = s.iloc[-max(1, len(s) // 10):].mean()
        if early > 0 and end < th["entropy_collapse_ratio"] * early:
            out.append(Sign("actor/entropy collapsed ({early:.3f} → {end:.3f}, below {ratio:.0%} of its start): "
                            "exploration is gone", early=early, end=end, ratio=th["entropy_collapse_ratio"]))
    for name in ("actor/grad_norm", "critic/grad_norm"):
        s = col(name)
        if s is not None and len(s) >= 4:
            med = s.median()
            spikes = s[s > th["grad_norm_spike"] * med] if med > 0 else s.iloc[:0]
            if len(spikes):
                out.append(Sign("{name} spikes: {n} step(s) above {factor:g}× the median {median:.3g} (first at step "
                                "{first}, {value:.3g})", name=name, n=len(spikes), factor=th["grad_norm_spike"],
                                median=med, first=spikes.index[0], value=spikes.iloc[0]))
    s = col("response_length/clip_ratio")
    if s is not None and len(s) and late(s).mean() > th["clip_ratio_high"]:
        out.append(Sign("response_length/clip_ratio high (late mean {mean:.2f}): many responses are truncated at "
                        "max_response_length", mean=late(s).mean()))
    s = col("critic/vf_clipfrac")
    if s is not None and len(s) and late(s).median() > th["vf_clipfrac_high"]:
        out.append(Sign("critic/vf_clipfrac high (late median {median:.3f}): critic steps too large",
                        median=late(s).median()))
    if col("actor/kl_loss") is not None and col("actor/kl_coef") is not None and col("actor/pg_loss") is not None:
        kl_term = late((m["actor/kl_coef"] * m["actor/kl_loss"]).dropna()).median()
        pg = late(m["actor/pg_loss"].dropna()).abs().median()
        if len(m["actor/kl_loss"].dropna()) >= 2 and kl_term > th["kl_term_dominates"] * pg:
            out.append(Sign("KL term dominates: late median kl_coef·kl_loss {kl:.3g} > {factor:g}×|pg_loss| {pg:.3g} "
                            "— the reference KL, not the advantage, drives the update",
                            kl=kl_term, factor=th["kl_term_dominates"], pg=pg))
    s = col("critic/vf_loss")
    if (s is not None and len(s) >= 2 and col("critic/returns/max") is not None
            and col("critic/returns/min") is not None):
        span = late((m["critic/returns/max"] - m["critic/returns/min"]).dropna()).mean()
        scale = 0.5 * span ** 2 if span > 0 else 1.0
        if late(s).median() > th["vf_loss_large"] * scale:
            out.append(Sign("critic/vf_loss persistently large (late median {median:.3g} > {factor:g}×½·(returns "
                            "span {span:.3g})²): critic and return scale do not match",
                            median=late(s).median(), factor=th["vf_loss_large"], span=span))
    s = col("training/rollout_probs_diff_mean")
    if s is not None and len(s) and s.max() > th["rollout_probs_diff_high"]:
        out.append(Sign("training/rollout_probs_diff_mean high (max {max:.3g} at step {step} > {limit:g}): the "
                        "rollout engine samples from another policy than the trainer's — stale weights or an adapter "
                        "that did not reach the engine, or low precision; fix the weight sync, or correct with "
                        "algorithm.rollout_correction.rollout_is",
                        max=s.max(), step=s.idxmax(), limit=th["rollout_probs_diff_high"]))
    s = col("critic/vf_explained_var")
    if s is not None and len(s) >= 2 and late(s).mean() < 0:
        out.append(Sign("critic/vf_explained_var negative late in training (late mean {mean:.3f}): the critic "
                        "explains less than a constant", mean=late(s).mean()))
    return out
