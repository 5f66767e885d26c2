"""Lab 17, the capstone: one recorded training step rebuilt from its tensors, compared metric by metric with what
the run logged in ``metrics.jsonl``.

The lab's learner writes the formulas in plain torch; this module gives them only the bookkeeping the trainer
does (which rows each rank and micro-batch held at every optimizer step, the global counts) and the logged values
to compare with. :func:`rebuild_actor_step` is the reference the checks use for one optimizer step, built from
``ppolab.algos`` exactly as :class:`ppolab.worker.ActorWorker` calls it.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ppolab import algos
from ppolab.errors import whole_argument
from ppolab.metrics import accumulate_micro_metrics
from ppolab.numbers.cases import cached_case
from ppolab.numbers.needs import RunLacks, require
from ppolab.numbers.steps import actor_config
from ppolab.run.reader import Run, resolve_run
from ppolab.run.step import StepRecord
from ppolab.update_plan import UpdatePlan

SHIPPED = "ppo_fire_tiny"

#: The logged metrics each part of the capstone rebuilds (a run that does not log one leaves it out).
PART_METRICS: dict[str, tuple[str, ...]] = {
    "17.1": ("actor/reward_kl_penalty_coeff", "actor/reward_kl_penalty", "critic/rewards/mean"),
    "17.2": ("rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rollout_rs_seq_masked_fraction"),
    "17.3": ("critic/advantages/mean", "critic/advantages/max", "critic/advantages/min",
             "critic/returns/mean", "critic/returns/max", "critic/returns/min"),
    "17.4": ("actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/kl_loss",
             "actor/entropy_loss"),
    "17.5": ("actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/kl_loss",
             "actor/entropy_loss"),
    "17.6": ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean"),
    "17.7": ("actor/loss", "critic/loss"),
}

#: Tolerances of the comparison: a plain-torch rebuild sums in another order than the trainer (float32).
REL, ABS = 1e-4, 1e-6

#: Where a rebuilt metric differs from the logged one: the usual reason, per metric.
HINTS: dict[str, str] = {
    "actor/reward_kl_penalty_coeff": "β of this step is the controller's value *before* this step's update: start "
                                     "from the previous step's logged β and KL (chapter §7.1)",
    "actor/reward_kl_penalty": "kld uses old_log_probs vs ref_log_prob under loss_mask (the mask before rejection); "
                               "the batch mean counts every row, padding rows too",
    "critic/rewards/mean": "rewards = scores − β·kld, summed per row, averaged over the real rows only",
    "rollout_corr/rollout_rs_masked_fraction": "both options must pass (AND); the fraction is over the valid tokens "
                                               "of loss_mask",
    "rollout_corr/rollout_rs_seq_masked_fraction": "a row with any rejected token counts; divide by all rows, "
                                                   "padding rows too",
    "critic/advantages/mean": "GAE runs backwards over the masked tokens, then whitens over response_mask "
                              "(after rejection); the statistics read real rows at response_mask",
    "critic/returns/mean": "returns = GAE advantages before whitening + values",
    "actor/pg_loss": "token-mean over the *global* Σ loss_mask × dp_size, summed over micro-batches, averaged over "
                     "ranks, then over optimizer steps",
    "actor/pg_clipfrac": "a plain mean of each micro-batch's clip fraction (not token-weighted), over micro-batches "
                         "and ranks",
    "actor/pg_clipfrac_lower": "the dual clip bites where A < 0 and max(−A·r, −A·clip(r)) > −A·c",
    "actor/ppo_kl": "masked mean of old − new log-prob per micro-batch, then a plain mean",
    "actor/kl_loss": "k3 (low_var_kl) of π_θ vs π_ref, aggregated like pg_loss",
    "actor/entropy_loss": "π_θ's entropy at this optimizer step (actor_entropy[k], not the stage-4 entropy), "
                          "aggregated like pg_loss: summed over micro-batches",
    "critic/vf_loss": "½·max of the two squared errors, token-mean over the global Σ loss_mask × dp_size, summed "
                      "over micro-batches",
    "critic/vf_clipfrac": "share of tokens where the clipped error is strictly larger, a plain mean over "
                          "micro-batches and ranks",
    "critic/vpred_mean": "masked mean of the new predictions per micro-batch, then a plain mean",
    "actor/loss": "Σ micro-batch losses = pg_loss − entropy_coeff·entropy_loss + kl_loss_coef·kl_loss",
    "critic/loss": "the critic's loss is its vf_loss",
}


#: The report's own lines in Chinese (the chapter's terms; metric and config names stay as they are).
_ZH: dict[str, str] = {
    "actor/reward_kl_penalty_coeff": "这一步的 β 是 controller 在本步更新*之前*的值：从上一步记录的 β 与 KL 出发"
                                     "（本章 §7.1）",
    "actor/reward_kl_penalty": "kld 用 old_log_probs 对 ref_log_prob，在 loss_mask（rejection 之前的 mask）上计算；"
                               "batch 均值把每一行都算进去，padding 行也算",
    "critic/rewards/mean": "rewards = scores − β·kld，按行求和，只在真实行上取平均",
    "rollout_corr/rollout_rs_masked_fraction": "所有 option 都必须通过（AND）；比例以 loss_mask 的有效 token 为分母",
    "rollout_corr/rollout_rs_seq_masked_fraction": "只要有一个 token 被拒绝，这一行就算；分母是所有行，padding 行也算",
    "critic/advantages/mean": "GAE 在被 mask 的 token 上倒序运行，然后在 response_mask（rejection 之后）上白化；"
                              "统计量读取真实行在 response_mask 上的值",
    "critic/returns/mean": "returns = 白化之前的 GAE advantages + values",
    "actor/pg_loss": "token-mean 除以*全局* Σ loss_mask 再 × dp_size，在 micro-batch 上求和，在 rank 上取平均，"
                     "再在 optimizer step 上取平均",
    "actor/pg_clipfrac": "每个 micro-batch 的 clip 比例的简单平均（不按 token 加权），跨 micro-batch 与 rank",
    "actor/pg_clipfrac_lower": "dual clip 在 A < 0 且 max(−A·r, −A·clip(r)) > −A·c 处生效",
    "actor/ppo_kl": "每个 micro-batch 上 old − new log-prob 的 masked mean，再取简单平均",
    "actor/kl_loss": "π_θ 对 π_ref 的 k3（low_var_kl），聚合方式同 pg_loss",
    "actor/entropy_loss": "π_θ 在这个 optimizer step 的 entropy（actor_entropy[k]，不是第 4 阶段的 entropy），"
                          "聚合方式同 pg_loss：在 micro-batch 上求和",
    "critic/vf_loss": "两个平方误差取 max 的一半，token-mean 除以全局 Σ loss_mask × dp_size，在 micro-batch 上求和",
    "critic/vf_clipfrac": "clipped 误差严格更大的 token 比例，跨 micro-batch 与 rank 的简单平均",
    "critic/vpred_mean": "每个 micro-batch 上新预测值的 masked mean，再取简单平均",
    "actor/loss": "Σ micro-batch loss = pg_loss − entropy_coeff·entropy_loss + kl_loss_coef·kl_loss",
    "critic/loss": "critic 的 loss 就是它的 vf_loss",
    "recompute it as the trainer does": "按 trainer 的做法重新计算",
    "off by a factor dp_size = {dp}: did you multiply by dp_size?": "差一个因子 dp_size = {dp}：你乘 dp_size 了吗？",
    "{dp}× too large: the ranks are averaged, not summed": "大了 {dp} 倍：各 rank 之间是取平均，不是求和",
    "the sign is flipped": "符号反了",
    "  {key}: this run does not log it": "  {key}：这个 run 没有记录它",
    "  {key}: not a number yet": "  {key}：还不是一个数",
    "  {key}: match ({value:.6g})": "  {key}：一致（{value:.6g}）",
    "  {key}: differs — yours {got:.6g}: {why}": "  {key}：不一致——你的 {got:.6g}：{why}",
    "(no numbers yet)": "（还没有数）",
    "step {step}, your numbers against metrics.jsonl:": "step {step}，你的数与 metrics.jsonl 对比：",
    "step {step}, optimizer step {k}, your numbers against its rebuild:": "step {step}，optimizer step {k}，"
                                                                          "你的数与它的重建对比：",
}


def _t(text: str) -> str:
    """``text`` in the current language (the report's lines: :data:`_ZH`)."""
    from ppolab.i18n import get_language

    return _ZH.get(text, text) if get_language() == "zh" else text


def _hint(key: str) -> str:
    """The usual reason ``key`` differs (:data:`HINTS`), in the current language."""
    from ppolab.i18n import get_language

    if key not in HINTS:
        return _t("recompute it as the trainer does")
    return _ZH.get(key, HINTS[key]) if get_language() == "zh" else HINTS[key]


# ------------------------------------------------------------------ the case
def _logged_row(r: Run, step: int) -> dict[str, float]:
    m = r.metrics
    if step not in m.index:
        raise KeyError(f"step {step} is not in {r.path}/metrics.jsonl")
    return {k: float(v) for k, v in m.loc[step].items() if isinstance(v, (int, float)) and not math.isnan(v)}


def capstone_step(run: Run | str | None = None) -> int:
    """The recorded step the capstone rebuilds: one whose every rank ran at least two micro-batches per optimizer step
    where the run has such a step (a sum over micro-batches then differs from a mean), then where the dual clip bit
    most (logged pg_clipfrac_lower), then where the clip bit most (pg_clipfrac); on the shipped ppo_fire_tiny (two
    micro-batches of 4 rows per rank at every step), step 21: dual clip, clip, rejection, padding rows and the
    adaptive β all fire there."""
    return int(_step_case(run, default=SHIPPED)["step"])


@cached_case
def _step_case(r: Run) -> dict[str, int]:
    require(r, default=SHIPPED)
    m = r.metrics

    def several_micro_batches(s: int) -> bool:
        plan = r.step(s).plan("actor")
        return all(len(rank) >= 2 for opt in plan.steps for rank in opt.micro_batches)

    def score(s: int) -> tuple[bool, float, float, int]:
        row = m.loc[s] if s in m.index else {}
        get = lambda k: float(row.get(k, 0.0) or 0.0) if len(row) else 0.0  # noqa: E731
        return (several_micro_batches(s), get("actor/pg_clipfrac_lower"), get("actor/pg_clipfrac"), -s)
    return {"step": max(r.steps, key=score)}


def logged(run: Run | str | None = None, step: int | None = None) -> dict[str, float]:
    """Every number metrics.jsonl holds for training step ``step`` (default: :func:`capstone_step`)."""
    r = resolve_run(run, SHIPPED)
    return _logged_row(r, capstone_step(r) if step is None else step)


def part_truth(part: str, run: Run | str | None = None, step: int | None = None) -> dict[str, float]:
    """The logged values of ``part``'s metrics (those this run logs and its recorded tensors can rebuild: a run
    recorded before ``actor_entropy`` existed logs actor/entropy_loss but cannot rebuild it)."""
    r = resolve_run(run, SHIPPED)
    s = capstone_step(r) if step is None else step
    row = logged(r, s)
    keys = [k for k in PART_METRICS[part] if k in row]
    if "actor_entropy" not in r.step(s).tensors:
        keys = [k for k in keys if k != "actor/entropy_loss"]
    return {k: row[k] for k in keys}


# ------------------------------------------------------------------ the trainer's bookkeeping
Plan = list[list[list[list[int]]]]  # optimizer step → rank → micro-batch → row


def capstone_plan(run: Run | str | None = None, step: int | None = None, role: str = "actor") -> UpdatePlan:
    """The ``role``'s update plan at the capstone step (or ``step``): the one the worker recorded, or for a run
    recorded before plans were kept, ``ppolab.update_plan.plan_update`` on the recorded batch (``.recorded``,
    ``.note()`` say which)."""
    r = resolve_run(run, SHIPPED)
    return r.step(capstone_step(r) if step is None else step).plan(role)


def micro_batch_rows(run: Run | str | None = None, step: int | None = None, role: str = "actor") -> Plan:
    """Which rows every micro-batch held: ``plan[k][rank]`` is the list of micro-batches (each a list of row
    indices of the recorded batch) of optimizer step ``k`` on DP rank ``rank``, in execution order — the worker's
    update plan (:func:`capstone_plan`; verl `TrainingWorker.train_mini_batch`): rank r holds the r-th contiguous chunk
    of the balanced batch, cuts it into ``ppo_mini_batch_size × n / dp`` rows per mini-batch for ``ppo_epochs``
    epochs (shuffled with ``data_loader_seed + r`` when ``shuffle``), and each mini-batch into micro-batches (the
    actor: fixed ``ppo_micro_batch_size_per_gpu`` or the ``ppo_max_token_len_per_gpu`` budget; the critic: the
    engine's ``ppo_infer_max_token_len_per_gpu`` budget, chapter §11.6)."""
    return [opt.micro_batches for opt in capstone_plan(run, step, role).steps]


def dp_size(run: Run | str | None = None, step: int | None = None) -> int:
    """The data-parallel ranks the step was trained on."""
    r = resolve_run(run, SHIPPED)
    return capstone_plan(r, step).dp_size


# ------------------------------------------------------------------ the reference for one optimizer step
def rebuild_actor_step(run: Run | str | None = None, step: int | None = None, opt_step: int = 0) -> dict[str, float]:
    """Optimizer step ``opt_step``'s actor metrics, rebuilt with ``ppolab.algos.ppo_loss`` per rank and micro-batch
    as the worker calls it, summed/averaged over micro-batches (``accumulate_micro_metrics``) and averaged over
    ranks; ``actor/entropy_loss`` from the recorded entropy of π_θ at that optimizer step (``actor_entropy``,
    where the run recorded it)."""
    r = resolve_run(run, SHIPPED)
    return _actor_metrics(r, capstone_step(r) if step is None else step, opt_step, actor_config(r))


def _actor_metrics(r: Run, s: int, opt_step: int, cfg: Any, plan: UpdatePlan | None = None) -> dict[str, float]:
    """:func:`rebuild_actor_step` with the actor config ``cfg`` and the update ``plan`` (the run's, or a what-if of
    ``ppolab.numbers.capstone_what_if``)."""
    rec = r.step(s)
    t = rec.tensors
    plan = plan or capstone_plan(r, s, "actor")
    opt_step = whole_argument("opt_step", opt_step, range(len(plan.steps)), f"an optimizer step of step {s}")
    ranks = plan.steps[opt_step].micro_batches
    info = plan.steps[opt_step].info()  # the global counts the worker divided every micro-batch's loss by
    weights = _is_weights(r, rec)
    per_rank = []
    for micro in ranks:
        out = []
        for mb in micro:
            idx = torch.as_tensor(mb)
            mask = t["response_mask"][idx].float()
            old = t["old_log_probs"][idx].float()
            lp = torch.where(mask > 0, torch.nan_to_num(t["actor_log_probs"][opt_step][idx], nan=0.0), old)
            entropy = (torch.nan_to_num(t["actor_entropy"][opt_step][idx].float(), nan=0.0) * mask
                       if "actor_entropy" in t else None)
            _, metrics = algos.ppo_loss(
                cfg, old_log_prob=old, log_prob=lp, advantages=t["advantages"][idx].float(), response_mask=mask,
                entropy=entropy, ref_log_prob=t["ref_log_prob"][idx].float() if "ref_log_prob" in t else None,
                rollout_is_weights=None if weights is None else weights[idx], global_batch_info=info)
            metrics.pop("actor/kl_coef", None)
            out.append(metrics)
        per_rank.append(accumulate_micro_metrics(out))
    return {k: float(np.mean([m[k] for m in per_rank])) for k in per_rank[0]}


def _is_weights(r: Run, rec: StepRecord) -> torch.Tensor | None:
    """The rollout IS weights the policy loss multiplied in (stage 7), recomputed from the recorded log-probs."""
    corr = r.ppo_config().algorithm.rollout_correction
    t = rec.tensors
    if not corr.rollout_is or corr.bypass_mode or "rollout_log_probs" not in t:
        return None
    if corr.rollout_is_batch_normalize:
        raise RunLacks("rollout IS weights without batch normalisation (rollout_is_batch_normalize=false)", r)
    return algos.rollout_is_weights(t["old_log_probs"], t["rollout_log_probs"], t["response_mask"].float(),
                                    corr.rollout_is, corr.rollout_is_threshold)


def actor_case(run: Run | str | None = None) -> dict[str, int]:
    """The capstone step and the optimizer step 17.4 asks about: the one where the dual clip bites on the most
    tokens, else where the clip does, else the last one; with the step's optimizer steps ``n_opt`` and ranks
    ``dp``."""
    return _actor_case(run, default=SHIPPED)


@cached_case
def _actor_case(r: Run) -> dict[str, int]:
    require(r, default=SHIPPED)
    s = capstone_step(r)
    n = len(micro_batch_rows(r, s, "actor"))
    metrics = [rebuild_actor_step(r, s, k) for k in range(n)]
    k = max(range(n), key=lambda i: (metrics[i].get("actor/pg_clipfrac_lower", 0.0),
                                     metrics[i].get("actor/pg_clipfrac", 0.0), i))
    return {"step": s, "opt_step": k, "n_opt": n, "dp": len(micro_batch_rows(r, s, "actor")[0])}


# ------------------------------------------------------------------ the comparison
def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=ABS)


def _number(x: Any) -> float | None:
    """``x`` as one float, or None: a tensor or array of one element counts, of any other size (a numpy array's
    ``size`` is an int, a tensor's ``numel()`` a method) or anything else is "not a number yet"."""
    if hasattr(x, "item"):
        numel = getattr(x, "numel", None)
        try:
            n = numel() if callable(numel) else int(getattr(x, "size", 1))
            if n != 1:
                return None
            x = x.item()
        except Exception:  # an odd object with an item(): not a number, whatever it raised
            return None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def compare_to_logged(answer: dict[str, Any], run: Run | str | None = None, step: int | None = None,
                      opt_step: int | None = None) -> list[str]:
    """One line per metric of ``answer``: ``match`` (within 1e-4 relative, with the value), or ``differs`` with a
    hint (a factor dp_size or a flipped sign is named when the numbers show it) — never the logged value, which a
    wrong try would otherwise hand over. With ``opt_step`` the comparison is with that optimizer step's rebuild
    (:func:`rebuild_actor_step`; the run logs no per-step values)."""
    r = resolve_run(run, SHIPPED)
    s = capstone_step(r) if step is None else step
    want = logged(r, s) if opt_step is None else rebuild_actor_step(r, s, opt_step)
    dp = dp_size(r, s)
    lines = []
    for key, value in (answer or {}).items():
        got = _number(value)
        if key not in want:
            lines.append(_t("  {key}: this run does not log it").format(key=key))
            continue
        if got is None:
            lines.append(_t("  {key}: not a number yet").format(key=key))
            continue
        if _close(got, want[key]):
            lines.append(_t("  {key}: match ({value:.6g})").format(key=key, value=want[key]))
            continue
        why = _hint(key)
        if want[key] and dp > 1 and _close(got * dp, want[key]):
            why = _t("off by a factor dp_size = {dp}: did you multiply by dp_size?").format(dp=dp)
        elif want[key] and dp > 1 and _close(got, want[key] * dp):
            why = _t("{dp}× too large: the ranks are averaged, not summed").format(dp=dp)
        elif want[key] and _close(-got, want[key]):
            why = _t("the sign is flipped")
        # the logged value is shown only once it matches: a wrong try must not hand over the number to copy
        lines.append(_t("  {key}: differs — yours {got:.6g}: {why}").format(key=key, got=got, why=why))
    return lines


def report(answer: dict[str, Any], run: Run | str | None = None, step: int | None = None,
           opt_step: int | None = None) -> None:
    """Print :func:`compare_to_logged` under a title (a lab cell's per-metric report)."""
    if not isinstance(answer, dict) or not answer:
        print(_t("(no numbers yet)"))
        return
    r = resolve_run(run, SHIPPED)
    s = capstone_step(r) if step is None else step
    print(_t("step {step}, your numbers against metrics.jsonl:").format(step=s) if opt_step is None else
          _t("step {step}, optimizer step {k}, your numbers against its rebuild:").format(step=s, k=opt_step))
    print("\n".join(compare_to_logged(answer, r, s, opt_step)))
