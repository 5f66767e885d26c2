"""The semantic checks of a resolved config: every error names the dotted key and what is allowed.

:func:`check_config` returns (errors, notices); :func:`ppolab.config.loader.validate` raises the errors as
one :class:`ConfigError` and returns the notices (legal combinations that are usually unintended).
"""
from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Iterable
from typing import Any

from ppolab.config.schema import PPOConfig
from ppolab.i18n import tr
from ppolab.vocab import (ADV_ESTIMATORS, BYPASS_LOSS_TYPES, GROUP_ADV_ESTIMATORS, KL_PENALTY_TYPES, LOSS_AGG_MODES,
                          POLICY_LOSS_MODES, ROLLOUT_RS_OPTIONS, clip_bounds, clip_ratio_unread)

_A, _R, _REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"

def registry_names() -> dict[str, tuple[str, ...]]:
    """Valid ``loss_mode``, ``adv_estimator`` and KL-estimator names: verl's (``ppolab.vocab``), plus any a user
    registered with ``register_policy_loss`` / ``register_adv_est`` once ``ppolab.algos`` is loaded (looked up, not
    imported: ``import ppolab.config`` stays torch-free)."""
    names = {"loss_mode": POLICY_LOSS_MODES, "adv_estimator": ADV_ESTIMATORS, "kl": KL_PENALTY_TYPES}
    algos = sys.modules.get("ppolab.algos")
    if algos is not None:
        names["loss_mode"] += tuple(k for k in algos.POLICY_LOSS_REGISTRY if k not in POLICY_LOSS_MODES)
        names["adv_estimator"] += tuple(k for k in algos.ADV_ESTIMATOR_REGISTRY if k not in ADV_ESTIMATORS)
    return names


class _Checks:
    """Collects errors and notices about one resolved config; every message starts with the dotted key."""

    def __init__(self, cfg: PPOConfig, world_size: int, dp_size: int | None = None, megatron: bool = False) -> None:
        self.cfg, self.world_size, self.megatron = cfg, world_size, megatron
        #: the data-parallel ranks a mini-batch is cut over: the world in ppolab's trainer (every rank is data
        #: parallel); fewer in a verl job with sequence or model parallelism (``verl_config.data_parallel``)
        self.dp_size = world_size if dp_size is None else dp_size
        self.dp_name = "world_size" if self.dp_size == world_size else tr("the data-parallel size")
        self.errors: list[str] = []
        self.notices: list[str] = []

    def get(self, key: str) -> Any:
        value: Any = self.cfg
        for part in key.split("."):
            value = getattr(value, part)
        return value

    def ok(self, cond: Any, message: str) -> bool:
        if not cond:
            self.errors.append(message)
        return bool(cond)

    def choice(self, key: str, allowed: Iterable[Any], value: Any = ...) -> None:
        allowed = tuple(allowed)
        v = self.get(key) if value is ... else value
        if v not in allowed:
            names = ["null" if a is None else str(a) for a in allowed]
            close = difflib.get_close_matches(str(v), names, n=1)
            hint = tr(" (did you mean {name}?)").format(name=close[0]) if close else ""
            self.errors.append(tr("{key}={v!r} is not valid{hint}; choose one of {names}").format(
                key=key, v=v, hint=hint, names=", ".join(names)))

    def kl_name(self, key: str, allowed: tuple[str, ...]) -> None:
        if str(self.get(key)).rstrip("+") == "full":
            self.errors.append(tr("{key}={v!r} is not allowed: verl does not implement the full-distribution "
                                  "KL (it raises NotImplementedError); choose one of {names}").format(
                key=key, v="full", names=", ".join(allowed)))
        else:
            self.choice(key, allowed)

    def positive(self, key: str, optional: bool = False) -> bool:
        v = self.get(key)
        if v is None and optional:
            return True
        return self.ok(isinstance(v, int) and not isinstance(v, bool) and v > 0,
                       tr("{key}={v!r} must be a positive integer (or null)" if optional
                          else "{key}={v!r} must be a positive integer").format(key=key, v=v))

    def at_least(self, key: str, lo: float, strict: bool = False, why: str = "") -> bool:
        v = self.get(key)
        op = ">" if strict else "≥"
        return self.ok(v > lo if strict else v >= lo,
                       tr("{key}={v!r} must be {op} {lo:g}").format(key=key, v=v, op=op, lo=lo) + tr(why))

    def unit(self, key: str, lo_open: bool, hi_open: bool = False) -> None:
        """``key`` in [0, 1] with the given ends open."""
        v = self.get(key)
        good = (v > 0 if lo_open else v >= 0) and (v < 1 if hi_open else v <= 1)
        self.ok(good, tr("{key}={v!r} must be in {interval}").format(
            key=key, v=v, interval=f"{'(' if lo_open else '['}0, 1{')' if hi_open else ']'}"))

    def budget(self, key: str) -> None:
        """A dynamic-bsz token budget must hold one full-length sequence (verl asserts it)."""
        longest = self.cfg.data.max_prompt_length + self.cfg.data.max_response_length
        self.ok(self.get(key) >= longest, tr("{key}={v} is smaller than data.max_prompt_length + "
                                             "data.max_response_length = {longest}: one full-length sequence would "
                                             "not fit").format(key=key, v=self.get(key), longest=longest))


def _batch_errors(c: _Checks, p: str) -> list[str]:
    """verl's batch arithmetic (chapter §11) for the actor or critic ``p``, with full dotted keys."""
    tb, n, ws = c.cfg.data.train_batch_size, c.cfg.actor_rollout_ref.rollout.n, c.dp_size
    mini, micro = c.get(f"{p}.ppo_mini_batch_size"), c.get(f"{p}.ppo_micro_batch_size_per_gpu")
    out = []
    if tb < mini and not c.get(f"{p}.use_dynamic_bsz"):
        out.append(tr("data.train_batch_size={tb} must be ≥ {p}.ppo_mini_batch_size={mini} (verl's check): a "
                      "step would be one mini-batch made mostly of synthetic padding rows").format(tb=tb, p=p,
                                                                                                   mini=mini))
    if (mini * n) % ws:
        out.append(tr("{p}.ppo_mini_batch_size × {r}.n = {mini}×{n} is not divisible by {dp_name}={ws}: every "
                      "rank needs the same local mini-batch (verl's worker asserts it at its first update: "
                      "workers/engine_workers.py::TrainingWorker.train_mini_batch)").format(
            p=p, r=_R, mini=mini, n=n, dp_name=c.dp_name, ws=ws))
    elif not c.get(f"{p}.use_dynamic_bsz") and micro is not None and p != "critic" and (mini * n // ws) % micro:
        out.append(tr("{p}.ppo_micro_batch_size_per_gpu={micro} does not divide the local mini-batch "
                      "{p}.ppo_mini_batch_size × {r}.n / {dp_name} = {mini}×{n}/{ws} = {local} (verl's engine "
                      "asserts it at its first update: workers/engine/utils.py::prepare_micro_batches)").format(
            p=p, micro=micro, r=_R, dp_name=c.dp_name, mini=mini, n=n, ws=ws, local=mini * n // ws))
    return out


def _check_batches(c: _Checks, p: str) -> None:
    """Batch sizes of the actor or critic ``p``: positive, micro set unless dynamic, divisions exact.

    The critic's engine always packs by ``critic.ppo_infer_max_token_len_per_gpu`` (verl V1 `trainer_base.py`,
    chapter §11.6): its top-level micro-batch keys are checked only as verl's CriticConfig checks them (micro set
    unless use_dynamic_bsz), and its micro-batch plan is the token-budget one."""
    dyn = c.get(f"{p}.use_dynamic_bsz")
    critic = p == "critic"
    good = all([c.positive(f"{p}.ppo_mini_batch_size"), c.positive(f"{p}.ppo_epochs"),
                c.positive(f"{p}.ppo_max_token_len_per_gpu"),
                c.positive(f"{p}.ppo_micro_batch_size_per_gpu", optional=True),
                c.ok(dyn or c.get(f"{p}.ppo_micro_batch_size_per_gpu") is not None,
                     tr("{p}.ppo_micro_batch_size_per_gpu is unset and {p}.use_dynamic_bsz=false: set the "
                        "trajectories per forward/backward per GPU, or use_dynamic_bsz=true").format(p=p)
                     + (tr(" (verl's CriticConfig requires one although the V1 critic engine packs by "
                           "critic.ppo_infer_max_token_len_per_gpu)") if critic else "")),
                not critic or c.positive(f"{p}.ppo_infer_max_token_len_per_gpu")])
    if good and (critic or dyn):
        c.budget(f"{p}.ppo_infer_max_token_len_per_gpu" if critic else f"{p}.ppo_max_token_len_per_gpu")
    # verl's CriticConfig.validate reads the top-level use_dynamic_bsz (train_batch_size ≥ mini, below); the plan
    # is the engine's: token budget, no fixed micro-batch to divide the mini-batch.
    fixed_micro = None if dyn or critic else c.get(f"{p}.ppo_micro_batch_size_per_gpu")
    tb, n = c.cfg.data.train_batch_size, c.cfg.actor_rollout_ref.rollout.n
    if not (good and c.dp_size > 0 and tb > 0 and n > 0):
        return
    try:
        from ppolab.batching import plan_batches
    except ImportError:  # the planner is not importable (yet): the same arithmetic, checked here
        c.errors.extend(_batch_errors(c, p))
        return
    if tb < c.get(f"{p}.ppo_mini_batch_size") and not dyn:
        c.errors.extend(_batch_errors(c, p))
        return
    # verl/utils/config.py::validate_config: the trajectories divide by the GPUs (FSDP), by Megatron's
    # data-parallel size × the micro-batch (Megatron)
    megatron_bsz = c.dp_size * (c.get(f"{p}.ppo_micro_batch_size_per_gpu") or 1)
    if not critic and not dyn and c.megatron and (tb * n) % megatron_bsz:
        c.errors.append(tr("data.train_batch_size × {r}.n = {tb}×{n} = {rows} trajectories is not divisible by "
                           "Megatron's data-parallel size × {p}.ppo_micro_batch_size_per_gpu = {bsz} (verl's check: "
                           "real_train_batch_size % minimal_bsz == 0): change data.train_batch_size or {r}.n").format(
            r=_R, tb=tb, n=n, rows=tb * n, p=p, bsz=megatron_bsz))
    elif not critic and not dyn and not c.megatron and (tb * n) % c.world_size:
        c.errors.append(tr("data.train_batch_size × {r}.n = {tb}×{n} = {rows} trajectories is not divisible by the "
                           "{gpus} GPUs (verl's check: real_train_batch_size % n_gpus == 0 without "
                           "{p}.use_dynamic_bsz): change data.train_batch_size or {r}.n").format(
            r=_R, tb=tb, n=n, rows=tb * n, gpus=c.world_size, p=p))
    # A step whose tb×n rows do not fill whole mini-batches is padded with synthetic rows (verl V1 padding_utils,
    # chapter §9): the planner checks the padded batch; _notices says how many rows are added.
    try:
        plan_batches(tb, n, c.get(f"{p}.ppo_mini_batch_size"), c.dp_size, fixed_micro, c.get(f"{p}.ppo_epochs"),
                     pad_to=c.cfg.padding_multiple(c.dp_size))
    except ValueError as e:  # say it with dotted keys; keep the planner's words if ours find nothing
        c.errors.extend(_batch_errors(c, p) or [tr("{p} batch sizes: {error}").format(p=p, error=e)])


def _check_names(c: _Checks) -> None:
    names = registry_names()
    for p in (_A, "critic"):
        c.choice(f"{p}.loss_agg_mode", LOSS_AGG_MODES)
    before = len(c.errors)
    c.choice(f"{_A}.policy_loss.loss_mode", names["loss_mode"])
    if len(c.errors) > before:  # a learner's loss is registered only in the process that plugged it in
        c.errors[-1] += tr("; a loss of your own is plugged in first, in this process: {call} (or {register})").format(
            call="ppolab.experiments.capstone_grade.plug_in(your_loss, name)",
            register="ppolab.algos.register_policy_loss")
    c.kl_name(f"{_A}.kl_loss_type", names["kl"])
    c.kl_name("algorithm.kl_penalty", names["kl"])
    c.choice("algorithm.adv_estimator", names["adv_estimator"])
    c.choice("algorithm.kl_ctrl.type", ("fixed", "adaptive"))
    c.choice("algorithm.rollout_correction.rollout_is", (None, "token", "sequence"))
    c.choice(f"{_R}.dtype", (None, "float32", "bfloat16", "float16"))
    c.choice(f"{_R}.name", ("hf", "vllm"))
    c.choice("actor_rollout_ref.model.dtype", ("float32", "bfloat16", "float16"))
    c.choice("trainer.device", ("auto", "cpu", "cuda"))
    for sink in c.cfg.trainer.logger:
        c.choice("trainer.logger", ("console", "tensorboard"), value=sink)


def _check_data_model(c: _Checks) -> None:
    cfg = c.cfg
    c.ok(cfg.data.train_files, tr("data.train_files is empty: give at least one {fmt} file").format(fmt="parquet"))
    c.ok(cfg.data.val_files or not (cfg.trainer.test_freq > 0 or cfg.trainer.val_before_train),
         tr("data.val_files is empty but trainer.test_freq / trainer.val_before_train ask for validation: give "
            "val files, or set trainer.test_freq=-1 and trainer.val_before_train=false"))
    for key in ("train_batch_size", "max_prompt_length", "max_response_length"):
        c.positive(f"data.{key}")
    c.positive("data.val_max_samples", optional=True)
    c.ok(cfg.actor_rollout_ref.model.path, tr("actor_rollout_ref.model.path is empty: give a model directory"))
    actor_path, critic_path = cfg.actor_rollout_ref.model.path, cfg.critic.model.path
    c.ok(not (cfg.use_critic and cfg.actor_rollout_ref.model.lora_rank > 0 and critic_path and actor_path
              and os.path.realpath(critic_path) != os.path.realpath(actor_path)),
         tr("critic.model.path={path!r} would be ignored: with actor_rollout_ref.model.lora_rank > 0 the "
            "critic is a LoRA adapter on the actor's base model; unset critic.model.path, or set "
            "actor_rollout_ref.model.lora_rank=0 for a separate critic model").format(path=critic_path))
    for m in ("actor_rollout_ref.model", "critic.model") if cfg.use_critic else ("actor_rollout_ref.model",):
        rank, targets = c.get(f"{m}.lora_rank"), c.get(f"{m}.target_modules")
        if c.ok(isinstance(rank, int) and rank >= 0,
                tr("{key}={v!r} must be ≥ 0 (0 = no LoRA)").format(key=f"{m}.lora_rank", v=rank)) and rank > 0:
            c.positive(f"{m}.lora_alpha")
            names = isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)
            c.ok(targets == "all-linear" or names,
                 tr("{key}={v!r} must be a non-empty list of module names or {all_linear}").format(
                     key=f"{m}.target_modules", v=targets, all_linear="'all-linear'"))


def _check_rollout(c: _Checks) -> None:
    cfg, ro = c.cfg, c.cfg.actor_rollout_ref.rollout
    c.positive(f"{_R}.n")
    c.at_least(f"{_R}.temperature", 0, strict=True,
               why=" (the update divides logits by it; greedy validation is val_kwargs.temperature=0)")
    c.at_least(f"{_R}.val_kwargs.temperature", 0)
    for key in (f"{_R}.top_p", f"{_R}.val_kwargs.top_p", f"{_R}.gpu_memory_utilization"):
        c.unit(key, lo_open=True)
    for key in (f"{_R}.top_k", f"{_R}.val_kwargs.top_k"):
        c.ok(c.get(key) == -1 or c.get(key) >= 1, tr("{key}={v!r} must be -1 (off) or ≥ 1").format(key=key,
                                                                                                    v=c.get(key)))
    c.positive(f"{_R}.val_kwargs.n")
    c.positive(f"{_R}.multi_turn.max_tool_response_length")
    turns = ro.multi_turn.max_assistant_turns
    c.ok(not ro.multi_turn.enable or (isinstance(turns, int) and turns >= 1),
         tr("{key}={v!r}: multi_turn.enable=true needs a turn limit ≥ 1").format(
             key=f"{_R}.multi_turn.max_assistant_turns", v=turns))
    if c.positive(f"{_R}.max_model_len", optional=True) and ro.max_model_len is not None:
        need = cfg.data.max_prompt_length + cfg.data.max_response_length
        c.ok(ro.max_model_len >= need, tr("{key}={v} is shorter than data.max_prompt_length + "
                                          "data.max_response_length = {need}").format(key=f"{_R}.max_model_len",
                                                                                      v=ro.max_model_len, need=need))
    c.ok(ro.name != "vllm" or cfg.actor_rollout_ref.model.lora_rank > 0,
         tr("{r}.name=vllm pushes the actor to vLLM as a LoRA adapter; set actor_rollout_ref.model.lora_rank > 0 "
            "or use {r}.name=hf for full fine-tuning").format(r=_R))
    model_dtype = cfg.actor_rollout_ref.model.dtype
    if ro.dtype is not None and ro.dtype != model_dtype:
        tool_agent = ro.multi_turn.enable and ro.agent.default_agent_loop == "tool_agent"
        c.ok(ro.name == "hf" and not tool_agent,
             tr("{key}={dtype!r} differs from actor_rollout_ref.model.dtype={model_dtype!r}: a separate "
                "rollout dtype is implemented for the single-turn hf engine only; leave {key}=null").format(
                 key=f"{_R}.dtype", dtype=ro.dtype, model_dtype=model_dtype))
        c.ok(model_dtype == "float32",
             tr("{key}={dtype!r} with actor_rollout_ref.model.dtype={model_dtype!r}: the hf engine generates on "
                "the actor's own weights and can only lower their precision (autocast from float32); leave it null "
                "or set model.dtype=float32").format(key=f"{_R}.dtype", dtype=ro.dtype, model_dtype=model_dtype))
    c.ok(ro.name != "vllm" or not (ro.multi_turn.enable and ro.agent.default_agent_loop == "tool_agent"),
         tr("{r}.name=vllm with the tool agent loop: ppolab's tool agent runs on the hf engine; use "
            "{r}.name=hf").format(r=_R))
    # Forward-only passes: old log-probs (skipped in bypass mode), ref log-probs (when a KL path is on).
    bypass = cfg.algorithm.rollout_correction.bypass_mode
    for p in [q for q, used in ((_R, not bypass), (_REF, cfg.use_reference_policy)) if used]:
        if c.positive(f"{p}.log_prob_max_token_len_per_gpu") and c.get(f"{p}.log_prob_use_dynamic_bsz"):
            c.budget(f"{p}.log_prob_max_token_len_per_gpu")
        elif not c.get(f"{p}.log_prob_use_dynamic_bsz"):
            c.ok(c.get(f"{p}.log_prob_micro_batch_size_per_gpu") is not None,
                 tr("{p}.log_prob_micro_batch_size_per_gpu is unset and {p}.log_prob_use_dynamic_bsz=false: set the "
                    "rows per log-prob forward, or log_prob_use_dynamic_bsz=true").format(p=p))
            c.positive(f"{p}.log_prob_micro_batch_size_per_gpu", optional=True)


def _check_actor_critic(c: _Checks) -> None:
    cfg, ca = c.cfg, c.cfg.actor_rollout_ref.actor
    for key in ("clip_ratio", "clip_ratio_high"):
        v = getattr(ca, key)
        c.ok(v is None or v >= 0, tr("{key}={v!r} must be ≥ 0").format(key=f"{_A}.{key}", v=v))
    low = "clip_ratio_low" if ca.clip_ratio_low is not None else "clip_ratio"
    # ε_low ≥ 1 is legal in verl (its CISPO example sets clip_ratio_low=10 on purpose): the lower bound 1 − ε_low is
    # then ≤ 0, which a ratio never reaches — a notice (_notices), not a stop
    c.ok(low == "clip_ratio" or getattr(ca, low) >= 0,
         tr("{key}={v!r} must be ≥ 0: it is ε_low, and a negative one puts the ratio's lower bound 1 − ε_low above 1, "
            "clipping tokens the policy has not moved").format(key=f"{_A}.{low}", v=getattr(ca, low)))
    c.at_least(f"{_A}.clip_ratio_c", 1, strict=True, why=" (dual-clip bound −A·C; verl asserts C > 1)")
    c.at_least(f"{_A}.kl_loss_coef", 0)
    c.at_least("critic.cliprange_value", 0, strict=True)
    c.ok(not (cfg.algorithm.adv_estimator == "gae" and cfg.critic.enable is False),
         tr("critic.enable=false but algorithm.adv_estimator=gae needs a critic for its values; set "
            "critic.enable=true (or null), or use a critic-free estimator such as grpo"))
    for p in (_A, "critic") if cfg.use_critic else (_A,):
        _check_batches(c, p)
        f = c.get(f"{p}.loss_scale_factor")
        c.ok(f is None or f > 0, tr("{key}={v!r} must be > 0 (or null)").format(key=f"{p}.loss_scale_factor", v=f))
        c.at_least(f"{p}.optim.lr", 0, strict=True)
        c.at_least(f"{p}.optim.clip_grad", 0, strict=True)
        c.at_least(f"{p}.optim.weight_decay", 0)
        c.at_least(f"{p}.optim.lr_warmup_steps", 0)
        betas = c.get(f"{p}.optim.betas")
        c.ok(len(betas) == 2 and all(0 <= b < 1 for b in betas),
             tr("{key}={v!r} must be two numbers in [0, 1)").format(key=f"{p}.optim.betas", v=betas))


def _check_policy_loss(c: _Checks) -> None:
    """The knobs of the chosen ``policy_loss.loss_mode`` (verl reads them only inside that loss, chapter §5.2)."""
    ca, key = c.cfg.actor_rollout_ref.actor, f"{_A}.policy_loss"
    pl, mode = ca.policy_loss, ca.policy_loss.loss_mode
    if mode == "dro":
        c.ok(pl.dro_beta is not None and pl.dro_beta > 0,
             tr("{key}.dro_beta={v!r} must be > 0 with {key}.loss_mode=dro (the weight β of the quadratic "
                "log-ratio penalty; verl raises without it)").format(key=key, v=pl.dro_beta))
    if mode == "clip_cov":
        c.at_least(f"{key}.clip_cov_ratio", 0, strict=True, why=" (share of tokens clip_cov may zero)")
        c.ok(pl.clip_cov_lb < pl.clip_cov_ub,
             tr("{key}.clip_cov_lb={lb!r} must be < {key}.clip_cov_ub={ub!r}: a token is a candidate when "
                "lb < cov < ub").format(key=key, lb=pl.clip_cov_lb, ub=pl.clip_cov_ub))
    if mode == "kl_cov":
        c.at_least(f"{key}.kl_cov_ratio", 0, strict=True, why=" (share of tokens kl_cov penalises)")
        c.at_least(f"{key}.ppo_kl_coef", 0)
    if mode == "bypass_mode":
        rc = pl.rollout_correction
        c.choice(f"{key}.rollout_correction.loss_type", BYPASS_LOSS_TYPES)
        c.choice(f"{key}.rollout_correction.rollout_is", (None, "token", "sequence"))
        if rc.rollout_rs is not None:
            try:
                from ppolab.algos.correction import parse_rollout_rs
            except ImportError:
                return
            try:
                parse_rollout_rs(rc.rollout_rs, rc.rollout_rs_threshold)
            except (ValueError, TypeError) as e:
                c.errors.append(tr("{key}.rollout_correction.rollout_rs={rs!r} with rollout_rs_threshold="
                                   "{threshold!r}: {error}").format(key=key, rs=rc.rollout_rs,
                                                                    threshold=rc.rollout_rs_threshold,
                                                                    error=spec_error(e)))
    est, alg = c.cfg.algorithm.adv_estimator, c.cfg.algorithm
    if est == "gdpo":
        keys, weights = alg.gdpo_reward_keys, alg.gdpo_reward_weights
        if c.ok(keys, tr("algorithm.gdpo_reward_keys is empty but algorithm.adv_estimator=gdpo normalises each "
                         "reward component on its own: list the keys compute_score returns, e.g. [format_reward, "
                         "accuracy_reward]")):
            c.ok(weights is None or len(weights) == len(keys),
                 tr("algorithm.gdpo_reward_weights has {n_weights} entries for {n_keys} algorithm.gdpo_reward_keys: "
                    "give one weight per key (or null for all 1)").format(n_weights=len(weights or []),
                                                                          n_keys=len(keys)))
    if est in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        c.ok(ca.calculate_sum_pi_squared,
             tr("algorithm.adv_estimator={est} needs {a}.calculate_sum_pi_squared=true (its baseline weights use "
                "Σπ² from the old-log-prob forward)").format(est=est, a=_A))


def _check_algorithm_trainer(c: _Checks) -> None:
    cfg, alg = c.cfg, c.cfg.algorithm
    est, n = alg.adv_estimator, cfg.actor_rollout_ref.rollout.n
    # verl gives a group of one mean 0 and std 1 (core_algos.py, `len(id2score[idx]) == 1`): the raw score is the
    # advantage — legal, a notice (_notices). Only grpo_passk raises on it, at the first step's advantages.
    c.ok(not (est == "grpo_passk" and n == 1),
         tr("{r}.n=1 with algorithm.adv_estimator=grpo_passk: a group of one has no baseline and verl raises at the "
            "first step (core_algos.py::compute_grpo_passk_outcome_advantage needs ≥ 2 samples a group); set "
            "{r}.n ≥ 2 (e.g. 8)").format(r=_R))
    c.unit("algorithm.gamma", lo_open=False)
    c.unit("algorithm.lam", lo_open=False)
    if cfg.custom_reward_function.timeout_s is not None:
        c.at_least("custom_reward_function.timeout_s", 0, strict=True, why=" seconds (or null for no limit)")
    c.at_least("algorithm.kl_ctrl.kl_coef", 0)
    if alg.kl_ctrl.type == "adaptive":
        c.at_least("algorithm.kl_ctrl.horizon", 0, strict=True, why=" for the adaptive controller")
        c.at_least("algorithm.kl_ctrl.target_kl", 0, strict=True, why=" for the adaptive controller")
    rc, logp = alg.rollout_correction, cfg.actor_rollout_ref.rollout.calculate_log_probs
    c.ok(logp or not rc.bypass_mode, tr("algorithm.rollout_correction.bypass_mode=true needs "
                                        "{r}.calculate_log_probs=true (bypass mode uses the rollout log-probs as old "
                                        "log-probs)").format(r=_R))
    c.ok(logp or not rc.rollout_is,
         tr("algorithm.rollout_correction.rollout_is={v!r} needs {r}.calculate_log_probs=true (the IS weights are "
            "old / rollout probabilities)").format(v=rc.rollout_is, r=_R))
    if isinstance(rc.rollout_is_threshold, str):  # IcePop "lower_upper": verl's parser decides
        from ppolab.algos.correction import parse_is_threshold

        try:
            parse_is_threshold(rc.rollout_is_threshold)
        except ValueError as e:
            c.errors.append(tr("algorithm.rollout_correction.rollout_is_threshold: {error}").format(
                error=spec_error(e)))
    else:
        c.at_least("algorithm.rollout_correction.rollout_is_threshold", 0, strict=True)
    c.ok(rc.loss_type == "ppo_clip",
         tr("algorithm.rollout_correction.loss_type={v!r} has no effect (verl V1 reads it only under "
            "loss_mode=bypass_mode): set {a}.policy_loss.rollout_correction.loss_type instead").format(
             v=rc.loss_type, a=_A))
    c.ok(not cfg.actor_rollout_ref.actor.policy_loss.rollout_correction.bypass_mode,
         tr("{a}.policy_loss.rollout_correction.bypass_mode has no effect (the loss never reads it): set "
            "algorithm.rollout_correction.bypass_mode=true for V1 bypass, or policy_loss.loss_mode=bypass_mode").format(
             a=_A))
    if rc.rollout_rs is not None:
        _check_rollout_rs(c, logp)
    t = cfg.trainer
    c.positive("trainer.total_training_steps", optional=True)
    c.positive("trainer.total_epochs", optional=True)
    c.ok(t.total_training_steps is not None or t.total_epochs is not None,
         tr("trainer.total_training_steps and trainer.total_epochs are both null: give at least one (the run would "
            "never stop)"))
    for key in ("trainer.save_freq", "trainer.test_freq", "trainer.record_freq"):
        c.ok(c.get(key) == -1 or c.get(key) >= 1,
             tr("{key}={v!r} is not valid: use a step interval ≥ 1, or -1 for never (not 0)").format(key=key,
                                                                                                    v=c.get(key)))
    c.at_least("trainer.critic_warmup", 0)
    c.positive("trainer.n_gpus_per_node", optional=True)
    c.positive("trainer.nnodes", optional=True)
    if t.n_gpus_per_node is not None or t.nnodes is not None:
        nodes, per_node = t.nnodes or 1, t.n_gpus_per_node or 1
        c.ok(nodes * per_node == c.world_size,
             tr("trainer.nnodes × trainer.n_gpus_per_node = {nodes} × {per_node} = {total}, but {world} process(es) "
                "were launched: start {command} (or leave both null to take the launcher's)").format(
                 nodes=nodes, per_node=per_node, total=nodes * per_node, world=c.world_size,
                 command=f"torchrun --nnodes {nodes} --nproc_per_node {per_node}"))
    c.ok(not cfg.actor_rollout_ref.actor.global_batch_info,
         tr("{a}.global_batch_info is set per mini-batch by the worker (verl writes it at run time); it is not a "
            "config key — remove it").format(a=_A))


def _check_rollout_rs(c: _Checks, logp: bool) -> None:
    """``rollout_rs`` / ``rollout_rs_threshold``: verl's own parser decides, the message names both keys."""
    rc, key = c.cfg.algorithm.rollout_correction, "algorithm.rollout_correction.rollout_rs"
    c.ok(logp, tr("{key}={v!r} needs {r}.calculate_log_probs=true (rejection compares the old and the rollout "
                  "log-probs)").format(key=key, v=rc.rollout_rs, r=_R))
    try:
        from ppolab.algos.correction import parse_rollout_rs
    except ImportError:  # the formula core is not importable: nothing more can be checked here
        return
    for option in (o.strip() for o in str(rc.rollout_rs).split(",") if o.strip()):
        if option not in ROLLOUT_RS_OPTIONS:
            close = difflib.get_close_matches(option, ROLLOUT_RS_OPTIONS, n=1)
            hint = tr(" (did you mean {name}?)").format(name=close[0]) if close else ""
            c.errors.append(tr("{key}: option {option!r} is not valid{hint}; choose a comma list of {options}").format(
                key=key, option=option, hint=hint, options=", ".join(ROLLOUT_RS_OPTIONS)))
            return
    try:
        parse_rollout_rs(rc.rollout_rs, rc.rollout_rs_threshold)
    except (ValueError, TypeError) as e:
        c.errors.append(tr("{key}={v!r} with {key}_threshold={threshold!r}: {error}").format(
            key=key, v=rc.rollout_rs, threshold=rc.rollout_rs_threshold, error=spec_error(e)))


def spec_error(e: Exception) -> str:
    """A refusal of verl's threshold parsers (``ppolab.algos.correction``) in the learner's language: its template
    through ``tr`` where it keeps one, else its text."""
    template, fields = getattr(e, "template", None), getattr(e, "fields", None)
    return tr(template).format(**fields) if template is not None and fields is not None else str(e)


#: The notice of both KL paths on (chapter §7.4): an i18n template, so that ppolab.widgets.mistakes can find it among
#: the notices in either language (:func:`kl_twice_notice`).
KL_TWICE = ("both KL paths are on (algorithm.use_kl_in_reward and {a}.use_kl_loss): the reference KL shapes the "
            "rewards AND is added to the loss, so it is applied twice (chapter §7.4); turn one off unless this is "
            "intended")


def kl_twice_notice() -> str:
    """The notice :func:`check_config` gives when both KL paths are on, in the current language."""
    return tr(KL_TWICE).format(a=_A)


def _notices(c: _Checks) -> None:
    """Legal combinations that are usually unintended."""
    cfg, alg = c.cfg, c.cfg.algorithm
    actor = cfg.actor_rollout_ref.actor
    if clip_ratio_unread(actor):
        low, high = clip_bounds(actor)
        c.notices.append(tr("{a}.clip_ratio={eps} is not the clip window: clip_ratio_low and clip_ratio_high are set "
                            "({low}/{high}; verl's defaults are 0.2/0.2) and clip_ratio is read only where they are "
                            "null (chapter §4.4); set those two for the window you mean").format(
            a=_A, eps=actor.clip_ratio, low=low, high=high))
    n = cfg.actor_rollout_ref.rollout.n
    if alg.adv_estimator in GROUP_ADV_ESTIMATORS and alg.adv_estimator != "grpo_passk" and n == 1:
        c.notices.append(tr("{r}.n=1 with algorithm.adv_estimator={est}: a group of one has no baseline — verl gives "
                            "it mean 0 and std 1, so the raw score is the advantage (chapter §2); set {r}.n ≥ 2 "
                            "(e.g. 8) for a group baseline").format(r=_R, est=alg.adv_estimator))
    if actor.use_kl_loss and alg.use_kl_in_reward:
        c.notices.append(kl_twice_notice())
    for p in (_A, "critic") if cfg.use_critic else (_A,):
        mode, factor = c.get(f"{p}.loss_agg_mode"), c.get(f"{p}.loss_scale_factor")
        if mode == "seq-mean-token-sum-norm" and factor is None:
            c.notices.append(tr("{p}.loss_agg_mode=seq-mean-token-sum-norm with {p}.loss_scale_factor=null divides "
                                "by the micro-batch's padded width, so the loss changes with the micro-batch split "
                                "(chapter §13); set loss_scale_factor (e.g. the max response length)").format(p=p))
    if cfg.use_critic:
        _critic_v1_notices(c)
    if cfg.critic.enable and alg.adv_estimator != "gae":
        c.notices.append(tr("critic.enable=true with algorithm.adv_estimator={est}: the critic is trained but the "
                            "advantages do not use its values").format(est=alg.adv_estimator))
    if alg.rollout_correction.bypass_mode and alg.rollout_correction.rollout_is:
        c.notices.append(tr("algorithm.rollout_correction.rollout_is is ignored in bypass mode (old = rollout "
                            "log-probs, so there is nothing to correct)"))
    if alg.rollout_correction.bypass_mode and alg.rollout_correction.rollout_rs:
        c.notices.append(tr("algorithm.rollout_correction.rollout_rs is ignored in bypass mode (old = rollout "
                            "log-probs, so nothing can be rejected)"))
    tb, n = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
    if not c.errors and tb > 0 and n > 0 and c.dp_size > 0:
        multiple = c.cfg.padding_multiple(c.dp_size)
        if (tb * n) % multiple:
            c.notices.append(tr("data.train_batch_size × {r}.n = {tb}×{n} = {rows} rows is not a multiple of "
                                "lcm({dp_name}, mini-batch × n) = {multiple}: every step adds {pad} synthetic padding "
                                "rows (response_mask 0, is_pad; verl V1 padding_utils, chapter §9) that count in "
                                "seq-mean denominators").format(r=_R, tb=tb, n=n, rows=tb * n, dp_name=c.dp_name,
                                                                multiple=multiple, pad=(-tb * n) % multiple))
    actor = cfg.actor_rollout_ref.actor
    low = "clip_ratio_low" if actor.clip_ratio_low is not None else "clip_ratio"
    if getattr(actor, low) >= 1 and actor.policy_loss.loss_mode in ("vanilla", "cispo"):
        c.notices.append(tr("{a}.{low}={eps} ≥ 1: the ratio's lower bound 1 − ε_low = {bound:.3g} is never reached, "
                            "so no token is clipped from below (verl runs it; its CISPO example sets "
                            "clip_ratio_low=10 for exactly this)").format(a=_A, low=low, eps=getattr(actor, low),
                                                                          bound=1 - getattr(actor, low)))
    mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if mode == "geo_mean":
        c.notices.append(tr("{a}.policy_loss.loss_mode=geo_mean averages its sequence losses with a plain mean over "
                            "the micro-batch rows and ignores {a}.loss_agg_mode and the global batch counts (as "
                            "verl), so the loss changes with the micro-batch split and the number of ranks").format(
            a=_A))
    if mode in ("dppo_tv", "dppo_kl") and cfg.actor_rollout_ref.actor.clip_ratio_c == 3.0:
        c.notices.append(tr("{a}.policy_loss.loss_mode={mode} truncates the IS ratio at {a}.clip_ratio_c=3.0 (the "
                            "config default wins over DPPO's own fallback of 20, as in verl); set clip_ratio_c to "
                            "change it. clip_ratio / clip_ratio_low / clip_ratio_high are {mode}'s divergence "
                            "thresholds here").format(a=_A, mode=mode))
    if mode == "bypass_mode" and not alg.rollout_correction.bypass_mode:
        c.notices.append(tr("{a}.policy_loss.loss_mode=bypass_mode expects old_log_prob = the rollout log-probs, but "
                            "algorithm.rollout_correction.bypass_mode=false: the loss will treat the recomputed old "
                            "log-probs as rollout log-probs").format(a=_A))
    if alg.kl_ctrl.type == "adaptive" and not alg.use_kl_in_reward:
        c.notices.append(tr("algorithm.kl_ctrl.type=adaptive has no effect: the controller only drives the "
                            "reward-side KL and algorithm.use_kl_in_reward=false"))


#: verl's CriticConfig default of ``critic.ppo_max_token_len_per_gpu``: a changed value is one the user set.
CRITIC_TOP_LEVEL_BUDGET = 32768


def _critic_v1_notices(c: _Checks) -> None:
    """The critic's top-level micro-batch keys that verl V1 ignores (chapter §8, §11.6, §14.1; verl
    `trainer_base.py` hands the critic engine only ``ppo_infer_max_token_len_per_gpu``), where their value asks for
    something the engine does not do. A fixed micro-batch at least as large as the local mini-batch asks for no cut
    and is what verl's CriticConfig requires unless use_dynamic_bsz, so it passes silently."""
    critic, n = c.cfg.critic, c.cfg.actor_rollout_ref.rollout.n
    budget = f"critic.ppo_infer_max_token_len_per_gpu={critic.ppo_infer_max_token_len_per_gpu}"
    why = tr("verl V1 does not pass it to the critic engine, which cuts both the value forward (stage 6) and the "
             "critic update (stage 8) by the token budget {budget} (on verl's command line "
             "+critic.ppo_infer_max_token_len_per_gpu=…; chapter §11.6)").format(budget=budget)
    micro = critic.ppo_micro_batch_size_per_gpu
    local = critic.ppo_mini_batch_size * n // c.dp_size if c.dp_size > 0 else 0
    if not critic.use_dynamic_bsz and isinstance(micro, int) and 0 < micro < local:
        c.notices.append(tr("critic.ppo_micro_batch_size_per_gpu={micro} (with critic.use_dynamic_bsz=false) is "
                            "ignored: {why}; the critic's mini-batches of {local} rows are not cut into {micro}-row "
                            "micro-batches").format(micro=micro, why=why, local=local))
    if critic.ppo_max_token_len_per_gpu not in (CRITIC_TOP_LEVEL_BUDGET, critic.ppo_infer_max_token_len_per_gpu):
        c.notices.append(tr("critic.ppo_max_token_len_per_gpu={v} is ignored: {why}").format(
            v=critic.ppo_max_token_len_per_gpu, why=why))


def check_config(cfg: PPOConfig, world_size: int = 1, dp_size: int | None = None,
                 megatron: bool = False) -> tuple[list[str], list[str]]:
    """(errors, notices) of a *resolved* config; :func:`validate` is the public entry. ``dp_size`` and
    ``megatron``: a verl job's data-parallel size and engine, where the doctor reads them
    (:func:`ppolab.verl_config.data_parallel`); ppolab's own trainer is data parallel on every rank."""
    c = _Checks(cfg, world_size, dp_size, megatron)
    c.ok(isinstance(world_size, int) and world_size > 0,
         tr("world_size={v!r} must be a positive int").format(v=world_size))
    for check in (_check_names, _check_data_model, _check_rollout, _check_actor_critic, _check_policy_loss,
                  _check_algorithm_trainer, _notices):
        check(c)
    return c.errors, c.notices
