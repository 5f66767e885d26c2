"""PPOTrainer: verl's V1 training step as nine stages, one method each, same names (chapter §1; verl V1
`trainer_base.py`).

    batch = generate_sequences(prompts)       1 sample (ppolab generates here; verl reads a replay buffer)
    batch = compute_reward(batch)             2 scores on the last response token
    batch = balance_batch(batch)              3 padding samples + length-balanced DP partitions
    batch = compute_old_log_prob(batch)       4 π_old (or bypass: old = rollout log-probs)
    batch = compute_ref_log_prob(batch)       5 π_ref, when a KL path is on
    batch = compute_values(batch)             6 V_old, when there is a critic
    batch = compute_advantage(batch)          7 reward KL, rollout IS weights, the estimator
    update_critic(batch)                      8 clipped value loss, mini-/micro-batches
    update_actor(batch)                       9 PPO loss, mini-/micro-batches

The trainer knows stages, not formulas: every formula comes from ``ppolab.algos``; the micro-batch
machinery from ``ppolab.engine``; only ``ppolab.record.Recorder`` writes the run directory.
"""
from __future__ import annotations

import random
import time
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from ppolab import algos
from ppolab.batching import balance_metrics, balance_partitions, padding_multiple, plan_batches
from ppolab import distributed
from ppolab.config import PPOConfig
from ppolab.distributed import DistInfo
from ppolab.rewards import call_reward, call_reward_with_info
from ppolab.engine import Batch, micro_batches, pad_right, reduce_metrics, to_device, train_mini_batches, trimmed_inputs
from ppolab.roles import PolicyModels, forward_response
from ppolab.rollout import SamplingParams, make_rollout_engine, require_engine


class PPOTrainer:
    """Builds models, data and optimizers from a validated :class:`PPOConfig` and runs training steps."""

    def __init__(self, config: PPOConfig, dist_info: DistInfo | None = None):
        from ppolab.data import check_data_files, load_rl_dataset
        from ppolab.rewards import get_reward_fn

        self.config = cfg = config
        # Files and the reward function are checked before the model loads: a mistake costs no waiting.
        check_data_files(cfg.data, need_val=cfg.trainer.test_freq > 0 or cfg.trainer.val_before_train)
        self.reward_fn = get_reward_fn(cfg.custom_reward_function)
        self.dist = dist_info or DistInfo()
        self.dp_rank, self.dp_size = self.dist.rank, self.dist.world_size
        self.all_reduce_sum = distributed.all_reduce_sum if self.dist.enabled else None
        self.grad_sync = distributed.average_gradients if self.dist.enabled else None
        self.local_rows: list[int] | None = None  # this rank's chunk of the balanced batch
        seed_everything(cfg.trainer.seed)
        device = cfg.trainer.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        arr, actor = cfg.actor_rollout_ref, cfg.actor_rollout_ref.actor
        require_engine(arr.rollout.name)  # a missing vllm is reported before the model loads
        self.use_critic, self.use_ref = cfg.use_critic, cfg.use_reference_policy
        self.models = PolicyModels(
            arr.model.path, arr.model.lora_rank, arr.model.lora_alpha, arr.model.target_modules, arr.model.dtype,
            str(self.device), use_critic=self.use_critic, use_reference=self.use_ref,
            critic_lora_rank=cfg.critic.model.lora_rank, critic_lora_alpha=cfg.critic.model.lora_alpha,
            critic_path=cfg.critic.model.path, seed=cfg.trainer.seed,
        )
        self.tokenizer = self.models.tokenizer
        self.train_data = load_rl_dataset(cfg.data.train_files, self.tokenizer, cfg.data.max_prompt_length)
        val = (load_rl_dataset(cfg.data.val_files, self.tokenizer, cfg.data.max_prompt_length)
               if cfg.data.val_files else [])
        self.val_data = val[: cfg.data.val_max_samples] if cfg.data.val_max_samples else val
        vllm_args = dict(seed=cfg.trainer.seed,
                         max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length)
        self.rollout = make_rollout_engine(arr.rollout, self.models,
                                           **(vllm_args if arr.rollout.name == "vllm" else {}))
        self.actor_optimizer, self.actor_scheduler = make_optimizer(self.models.actor_parameters(), actor.optim)
        if self.use_critic:
            self.critic_optimizer, self.critic_scheduler = make_optimizer(self.models.critic_parameters(),
                                                                          cfg.critic.optim)
        self.kl_ctrl_in_reward = (algos.get_kl_controller(cfg.algorithm.kl_ctrl)
                                  if cfg.algorithm.use_kl_in_reward else None)
        self.plan = plan_batches(cfg.data.train_batch_size, arr.rollout.n, actor.ppo_mini_batch_size, self.dp_size,
                                 None if actor.use_dynamic_bsz else actor.ppo_micro_batch_size_per_gpu,
                                 actor.ppo_epochs, pad_to=self.padding_multiple())
        self.global_step = 0
        self.data_epoch, self.data_cursor = 0, 0
        self._order = self._epoch_order(0)

    # ================================================================== data
    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.config.data.shuffle:
            return list(range(len(self.train_data)))
        seed = self.config.data.seed if self.config.data.seed is not None else self.config.trainer.seed
        return torch.randperm(len(self.train_data), generator=torch.Generator().manual_seed(seed + epoch)).tolist()

    def next_prompts(self) -> list[dict[str, Any]]:
        """The next ``train_batch_size`` prompts; an incomplete tail starts a new epoch (drop_last)."""
        size = self.config.data.train_batch_size
        if self.data_cursor + size > len(self._order):
            self.data_epoch, self.data_cursor = self.data_epoch + 1, 0
            self._order = self._epoch_order(self.data_epoch)
        rows = self._order[self.data_cursor:self.data_cursor + size]
        self.data_cursor += size
        return [self.train_data[i] for i in rows]

    # ================================================================== stage 1: sample
    def generate_sequences(self, prompts: list[dict[str, Any]]) -> Batch:
        """Roll out ``rollout.n`` responses per prompt; trajectories of one prompt share a ``uid``. With several
        ranks each generates a contiguous share of the prompts and every rank gathers the whole batch."""
        r = self.config.actor_rollout_ref.rollout
        share = np.array_split(np.arange(len(prompts)), self.dp_size)[self.dp_rank].tolist()
        mine = [prompts[i] for i in share]
        out = self.rollout.generate([p["input_ids"] for p in mine], r.n,
                                    SamplingParams(r.temperature, r.top_p, r.top_k, True),
                                    self.config.data.max_response_length)
        n = r.n
        batch = Batch(
            {"prompts": out.prompts, "prompt_mask": out.prompt_mask, "responses": out.responses,
             "response_mask": out.response_mask, "rollout_log_probs": out.rollout_log_probs,
             "uid": torch.as_tensor(share, dtype=torch.long).repeat_interleave(n),
             "is_pad": torch.zeros(len(mine) * n, dtype=torch.bool)},
            {k: [p[k] for p in mine for _ in range(n)] for k in ("data_source", "ground_truth", "extra_info", "index")},
        )
        if out.response_attention_mask is not None:
            batch["response_attention_mask"] = out.response_attention_mask
        if self.config.algorithm.adv_estimator == "remax":  # ReMax's baseline: one greedy answer per prompt
            batch["reward_baselines"] = self.greedy_baselines(mine).repeat_interleave(n)
        if self.dist.enabled:
            batch = concat_padded(distributed.all_gather_object(batch, self.dist), self.tokenizer.pad_token_id)
        batch["loss_mask"] = batch["response_mask"].clone()  # a copy, counted by the engine (verl
        # `forward_backward_batch`)
        return batch

    def greedy_baselines(self, prompts: list[dict[str, Any]]) -> torch.Tensor:
        """The score of one greedy (``do_sample=False``) response per prompt, (P,): ReMax's ``reward_baselines``,
        generated and scored the way verl's trainer does for ``adv_estimator=remax``."""
        r = self.config.actor_rollout_ref.rollout
        out = self.rollout.generate([p["input_ids"] for p in prompts], 1,
                                    SamplingParams(r.temperature, r.top_p, r.top_k, False),
                                    self.config.data.max_response_length)
        texts = self.tokenizer.batch_decode(out.responses, skip_special_tokens=True)
        return torch.tensor([call_reward(self.reward_fn, p["data_source"], text, p["ground_truth"], p["extra_info"])
                             for p, text in zip(prompts, texts)], dtype=out.response_mask.dtype)

    # ================================================================== stage 2: reward
    def compute_reward(self, batch: Batch) -> Batch:
        """verl's reward signature per trajectory; the score sits on the last valid response token. The other
        keys of a dict return are kept per row as ``reward_extra_info`` (the components ``gdpo`` combines)."""
        texts = self.tokenizer.batch_decode(batch["responses"], skip_special_tokens=True)
        scores = torch.zeros(len(batch), dtype=batch["response_mask"].dtype)
        extras = []
        for i, text in enumerate(texts):  # a NaN, None or crash stops here, naming the function and response
            scores[i], extra = call_reward_with_info(self.reward_fn, batch.lists["data_source"][i], text,
                                                     batch.lists["ground_truth"][i], batch.lists["extra_info"][i])
            extras.append(extra)
        batch.lists["reward_extra_info"] = extras
        # The last position with response_mask = 1: the end of the policy's own text (tool observations,
        # spliced in with mask 0, may sit before it; padding after it).
        width = batch["response_mask"].shape[1]
        positions = torch.arange(width).expand_as(batch["response_mask"])
        last = torch.where(batch["response_mask"].bool(), positions, torch.full_like(positions, -1)).max(-1).values
        last = last.clamp(min=0)
        token_level_scores = torch.zeros_like(batch["response_mask"])
        token_level_scores[torch.arange(len(batch)), last] = scores
        batch["token_level_scores"] = token_level_scores * batch["response_mask"]
        return batch

    # ================================================================== stage 3: balance
    def balance_batch(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Pad with synthetic samples to a multiple of lcm(dp, mini×n) and split rows across DP ranks by
        Karmarkar–Karp on the attention workload (verl V1 `trainer_base.py` stage 3,
        `padding_utils.py`)."""
        batch = add_padding_samples(batch, (-len(batch)) % self.padding_multiple(), self.tokenizer)
        partitions = balance_partitions(batch.seq_lens(), self.dp_size)
        metrics = balance_metrics(batch.seq_lens(), partitions)
        batch = batch.select([i for part in partitions for i in part])
        batch["row_id"] = torch.arange(len(batch))
        # Rank k works on the k-th contiguous chunk (the partitions have equal sizes).
        chunk = len(batch) // self.dp_size
        self.local_rows = list(range(self.dp_rank * chunk, (self.dp_rank + 1) * chunk))
        return batch, metrics

    def padding_multiple(self) -> int:
        """lcm(dp, actor mini×n, critic mini×n when there is a critic): the row count balance_batch pads to."""
        cfg, n = self.config, self.config.actor_rollout_ref.rollout.n
        minis = [cfg.actor_rollout_ref.actor.ppo_mini_batch_size * n]
        if self.use_critic:
            minis.append(cfg.critic.ppo_mini_batch_size * n)
        return padding_multiple(self.dp_size, *minis)

    # ================================================================== stages 4–6: forward passes
    def _infer(self, role, batch: Batch, micro_size: int | None, max_tokens: int, want_entropy=False,
               value_head=None, want_sum_pi_squared=False) -> dict[str, torch.Tensor]:
        """Forward-only pass over micro-batches of this rank's chunk, gathered over ranks; outputs in row
        order, padded to R."""
        if self.dist.enabled:
            local = self._infer_rows(role, batch.select(self.local_rows), micro_size, max_tokens, want_entropy,
                                     value_head, want_sum_pi_squared)
            gathered = distributed.all_gather_object(local, self.dist)
            return {k: torch.cat([g[k] for g in gathered]) for k in local}
        return self._infer_rows(role, batch, micro_size, max_tokens, want_entropy, value_head, want_sum_pi_squared)

    def _infer_rows(self, role, batch: Batch, micro_size: int | None, max_tokens: int, want_entropy=False,
                    value_head=None, want_sum_pi_squared=False) -> dict[str, torch.Tensor]:
        temperature = self.config.actor_rollout_ref.rollout.temperature
        width = batch["responses"].shape[1]
        results: dict[str, list] = {"rows": [], "log_probs": [], "entropy": [], "values": [], "sum_pi_squared": []}
        with torch.no_grad(), role() as model:
            was_training = model.training
            model.eval()
            for rows in micro_batches(batch, micro_size, max_tokens):
                mb = to_device(batch.select(rows), self.device)
                ids, mask, r_len = trimmed_inputs(mb)
                out = forward_response(model, ids, mask, r_len, temperature, value_head is None, want_entropy,
                                       value_head, want_sum_pi_squared)
                results["rows"] += rows
                for key in ("log_probs", "entropy", "values", "sum_pi_squared"):
                    value = getattr(out, key)
                    if value is not None:
                        results[key].append(pad_right(value.float().cpu(), width))
            model.train(was_training)
        order = torch.argsort(torch.as_tensor(results["rows"]))
        return {k: torch.cat(v)[order] for k, v in results.items() if k != "rows" and v}

    def compute_old_log_prob(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """π_old: recomputed by the actor (decoupled, the default) or copied from the rollout (bypass mode)."""
        cfg = self.config
        rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
        if cfg.algorithm.rollout_correction.bypass_mode:
            batch["old_log_probs"] = batch["rollout_log_probs"].clone()
            return batch, {}
        micro = None if rollout.log_prob_use_dynamic_bsz else rollout.log_prob_micro_batch_size_per_gpu or len(batch)
        out = self._infer(self.models.actor, batch, micro, rollout.log_prob_max_token_len_per_gpu, want_entropy=True,
                          want_sum_pi_squared=actor.calculate_sum_pi_squared)
        batch["old_log_probs"], batch["entropy"] = out["log_probs"], out["entropy"]
        if actor.calculate_sum_pi_squared:  # Σ_v π(v)² per position, for the optimal-token-baseline estimators
            batch["sum_pi_squared"] = out["sum_pi_squared"]
        mask = batch["response_mask"]
        metrics = {"actor/entropy": float(algos.agg_loss(out["entropy"], mask, actor.loss_agg_mode,
                                                         loss_scale_factor=actor.loss_scale_factor))}
        if rollout.calculate_log_probs:
            metrics.update(algos.rollout_probs_diff(out["log_probs"], batch["rollout_log_probs"], mask))
        return batch, metrics

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """π_ref: the same forward with LoRA disabled (or the frozen copy), same temperature (verl V1 `trainer_base.py`
        stage 5)."""
        ref = self.config.actor_rollout_ref.ref
        micro = None if ref.log_prob_use_dynamic_bsz else ref.log_prob_micro_batch_size_per_gpu or len(batch)
        batch["ref_log_prob"] = self._infer(self.models.reference, batch, micro,
                                            ref.log_prob_max_token_len_per_gpu)["log_probs"]
        return batch

    def compute_values(self, batch: Batch) -> Batch:
        """V_old: the critic's values of the states before each response token."""
        critic = self.config.critic
        micro = None if critic.use_dynamic_bsz else critic.ppo_micro_batch_size_per_gpu or len(batch)
        out = self._infer(self.models.critic, batch, micro, critic.ppo_max_token_len_per_gpu,
                          value_head=self.models.value_head)
        batch["values"] = out["values"]
        return batch

    # ================================================================== stage 7: advantage
    def compute_advantage(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Reward-side KL (if on), rollout IS weights and rejection (if configured, not in bypass), then the
        estimator. Rejection (``rollout_rs``) rewrites ``response_mask`` — not ``loss_mask`` — before the advantage,
        as verl V1 does."""
        alg, metrics = self.config.algorithm, {}
        mask = batch["response_mask"]
        if alg.use_kl_in_reward:
            batch["token_level_rewards"], metrics = algos.apply_kl_penalty(
                batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_prob"], mask,
                self.kl_ctrl_in_reward, alg.kl_penalty)
        else:
            batch["token_level_rewards"] = batch["token_level_scores"]
        corr = alg.rollout_correction
        if (corr.rollout_is or corr.rollout_rs) and not corr.bypass_mode and mask.any():
            old, rollout = batch["old_log_probs"], batch["rollout_log_probs"]
            if corr.rollout_is:
                batch["rollout_is_weights"] = algos.rollout_is_weights(old, rollout, mask, corr.rollout_is,
                                                                       corr.rollout_is_threshold)
            metrics.update(algos.rollout_corr_metrics(old, rollout, mask, batch.tensors.get("rollout_is_weights")))
            if corr.rollout_rs:
                if "response_attention_mask" not in batch:  # rejection changes what is learned, not what is seen:
                    batch["response_attention_mask"] = mask.clone()  # later forwards still attend to every token
                batch["response_mask"], rs_metrics = algos.rollout_rejection_mask(
                    old, rollout, mask, corr.rollout_rs, corr.rollout_rs_threshold)
                metrics.update(rs_metrics)
                mask = batch["response_mask"]
        extras = batch.lists.get("reward_extra_info") or []
        shared = set.intersection(*(set(e) for e in extras)) if extras else set()
        components = {k: [e[k] for e in extras] for k in sorted(shared)}  # verl's non_tensor_batch reward keys
        batch["advantages"], batch["returns"] = algos.compute_advantage(
            alg.adv_estimator, batch["token_level_rewards"], mask, index=batch["uid"].tolist(),
            values=batch.tensors.get("values"), reward_baselines=batch.tensors.get("reward_baselines"),
            gamma=alg.gamma, lam=alg.lam, norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo, config=alg,
            reward_components=components, sum_pi_squared=batch.tensors.get("sum_pi_squared"),
            old_log_probs=batch["old_log_probs"], rollout_is_weights=batch.tensors.get("rollout_is_weights"))
        return batch, metrics

    # ================================================================== stage 8: critic
    def update_critic(self, batch: Batch) -> tuple[dict[str, float], torch.Tensor]:
        """Clipped value loss over critic mini-batches (critic.ppo_mini_batch_size × n rows) and epochs. Also
        returns the vpreds each optimizer step saw, (steps, N, R) with NaN elsewhere."""
        c, n = self.config.critic, self.config.actor_rollout_ref.rollout.n
        temperature = self.config.actor_rollout_ref.rollout.temperature
        history = UpdateHistory(batch["responses"].shape)

        def micro_loss(mb: Batch, global_info: dict) -> tuple[torch.Tensor, dict]:
            mb = to_device(mb, self.device)
            ids, mask, r_len = trimmed_inputs(mb)
            with self.models.critic() as model:
                vpreds = forward_response(model, ids, mask, r_len, temperature, False, False,
                                          self.models.value_head).values
            info = {**global_info, "loss_scale_factor": c.loss_scale_factor}
            history.see(mb["row_id"], vpreds)
            return algos.value_loss(vpreds, mb["returns"][:, :r_len], mb["values"][:, :r_len],
                                    mb["response_mask"][:, :r_len], c.cliprange_value, c.loss_agg_mode, info)

        steps = train_mini_batches(
            self._local(batch), c.ppo_mini_batch_size * n, c.ppo_epochs, c.shuffle, c.data_loader_seed + self.dp_rank,
            None if c.use_dynamic_bsz else c.ppo_micro_batch_size_per_gpu, c.ppo_max_token_len_per_gpu,
            self.models.critic_parameters(), self.critic_optimizer, c.optim.clip_grad, micro_loss,
            self.dp_size, self.all_reduce_sum, prefix="critic", on_optimizer_step=history.flush,
            grad_sync=self.grad_sync)
        self.critic_scheduler.step()
        steps = distributed.mean_metrics_over_ranks(steps, self.dist)
        return reduce_metrics(steps), distributed.merge_histories(history.stacked(), self.dist)

    # ================================================================== stage 9: actor
    def update_actor(self, batch: Batch) -> tuple[dict[str, float], torch.Tensor]:
        """PPO loss over actor mini-batches (ppo_mini_batch_size × n rows) and epochs; one optimizer step per
        mini-batch. Also returns the log-probs each optimizer step saw, (steps, N, R) with NaN elsewhere."""
        a, n = self.config.actor_rollout_ref.actor, self.config.actor_rollout_ref.rollout.n
        temperature = self.config.actor_rollout_ref.rollout.temperature
        want_entropy = a.calculate_entropy or a.entropy_coeff != 0
        history = UpdateHistory(batch["responses"].shape)

        def micro_loss(mb: Batch, global_info: dict) -> tuple[torch.Tensor, dict]:
            mb = to_device(mb, self.device)
            ids, mask, r_len = trimmed_inputs(mb)
            with self.models.actor() as model:
                out = forward_response(model, ids, mask, r_len, temperature, True, want_entropy)
            a.global_batch_info = {**global_info, "loss_scale_factor": a.loss_scale_factor}
            cut = lambda key: mb[key][:, :r_len] if key in mb else None  # noqa: E731
            loss, metrics = algos.ppo_loss(a, out.log_probs, cut("old_log_probs"), cut("advantages"),
                                           cut("response_mask"), out.entropy, cut("ref_log_prob"),
                                           cut("rollout_is_weights"))
            history.see(mb["row_id"], out.log_probs)
            return loss, metrics

        steps = train_mini_batches(
            self._local(batch), a.ppo_mini_batch_size * n, a.ppo_epochs, a.shuffle, a.data_loader_seed + self.dp_rank,
            None if a.use_dynamic_bsz else a.ppo_micro_batch_size_per_gpu, a.ppo_max_token_len_per_gpu,
            self.models.actor_parameters(), self.actor_optimizer, a.optim.clip_grad, micro_loss,
            self.dp_size, self.all_reduce_sum, prefix="actor", on_optimizer_step=history.flush,
            grad_sync=self.grad_sync)
        a.global_batch_info = {}
        self.actor_scheduler.step()
        steps = distributed.mean_metrics_over_ranks(steps, self.dist)
        return reduce_metrics(steps), distributed.merge_histories(history.stacked(), self.dist)

    def _local(self, batch: Batch) -> Batch:
        """This rank's chunk of the balanced batch (the whole batch with one process)."""
        if not self.dist.enabled:
            return batch
        if self.local_rows is None or len(self.local_rows) * self.dp_size != len(batch):
            raise RuntimeError("balance_batch must run before an update with several ranks")
        return batch.select(self.local_rows)

    # ================================================================== one step
    def step(self) -> tuple[dict[str, float], Batch, dict[str, torch.Tensor]]:
        """One training step through the nine stages; returns (metrics, final batch, histories), histories
        holding ``actor_log_probs`` and ``critic_vpreds`` per optimizer step (see :class:`UpdateHistory`)."""
        self.global_step += 1
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {"training/global_step": self.global_step, "training/epoch": self.data_epoch}
        with timer(timing, "step"):
            with timer(timing, "gen"):
                batch = self.generate_sequences(self.next_prompts())
            with timer(timing, "reward"):
                batch = self.compute_reward(batch)
            with timer(timing, "balance"):
                batch, m = self.balance_batch(batch)
                metrics.update(m)
            with timer(timing, "old_log_prob"):
                batch, m = self.compute_old_log_prob(batch)
                metrics.update(m)
            if self.use_ref:
                with timer(timing, "ref"):
                    batch = self.compute_ref_log_prob(batch)
            if self.use_critic:
                with timer(timing, "values"):
                    batch = self.compute_values(batch)
            with timer(timing, "adv"):
                batch, m = self.compute_advantage(batch)
                metrics.update(m)
            histories: dict[str, torch.Tensor] = {}
            if self.use_critic:
                with timer(timing, "update_critic"):
                    m, histories["critic_vpreds"] = self.update_critic(batch)
                    metrics.update(m)
            if self.config.trainer.critic_warmup <= self.global_step:
                with timer(timing, "update_actor"):
                    m, histories["actor_log_probs"] = self.update_actor(batch)
                    metrics.update(m)
            self.rollout.sync_weights()
        if self.kl_ctrl_in_reward is None and self.config.actor_rollout_ref.actor.use_kl_loss:
            metrics["actor/kl_coef"] = self.config.actor_rollout_ref.actor.kl_loss_coef
        metrics.update(data_metrics(batch, self.use_critic, self.config.data.max_response_length))
        metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
        tokens = float((batch["prompt_mask"].sum() + batch["response_mask"].sum()))
        metrics.update({"perf/total_num_tokens": tokens, "perf/time_per_step": timing["step"],
                        "perf/throughput": tokens / timing["step"] / self.dp_size})
        return metrics, batch, histories

    # ================================================================== validation
    def close(self) -> None:
        """Release the rollout engine (a vLLM engine holds memory and process groups until shut down)."""
        close = getattr(self.rollout, "close", None)
        if close is not None:
            close()

    def validate(self) -> dict[str, float]:
        """Greedy decoding (val_kwargs) on the validation prompts: ``val/accuracy`` and friends."""
        if not self.val_data:
            return {}
        vk = self.config.actor_rollout_ref.rollout.val_kwargs
        sampling = SamplingParams(vk.temperature or 1.0, vk.top_p, vk.top_k, vk.do_sample)
        out = self.rollout.generate([p["input_ids"] for p in self.val_data], vk.n, sampling,
                                    self.config.data.max_response_length)
        texts = self.tokenizer.batch_decode(out.responses, skip_special_tokens=True)
        items = [p for p in self.val_data for _ in range(vk.n)]
        scores, by_source = [], {}
        for item, text in zip(items, texts):
            s = call_reward(self.reward_fn, item["data_source"], text, item["ground_truth"], item["extra_info"])
            scores.append(s)
            by_source.setdefault(item["data_source"], []).append(s)
        metrics = {"val/accuracy": float(np.mean([s == 1.0 for s in scores])),
                   "val/reward_mean": float(np.mean(scores)),
                   "val/response_length_mean": float(out.response_mask.sum(-1).mean())}
        for source, values in by_source.items():
            metrics[f"val-core/{source}/reward/mean@{vk.n}"] = float(np.mean(values))
        return metrics


# ====================================================================== helpers (no formulas)
class UpdateHistory:
    """What the model computed for each row at every optimizer step of an update — the actor's log-probs
    (the ratio drifting from 1 across mini-batches and epochs) or the critic's vpreds — as (steps, N, R),
    NaN for rows outside that step's mini-batch. Recorded for the labs; the update never reads it."""

    def __init__(self, shape: torch.Size):
        self.shape, self.steps, self._seen = shape, [], []

    def see(self, row_ids: torch.Tensor, values: torch.Tensor) -> None:
        self._seen.append((row_ids.cpu(), pad_right(values.detach().float().cpu(), self.shape[1], float("nan"))))

    def flush(self, *_: Any) -> None:
        record = torch.full(self.shape, float("nan"))
        for row_ids, values in self._seen:
            record[row_ids] = values
        self.steps.append(record)
        self._seen.clear()

    def stacked(self) -> torch.Tensor:
        return torch.stack(self.steps) if self.steps else torch.full((0, *self.shape), float("nan"))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextmanager
def timer(timing: dict[str, float], name: str):
    start = time.perf_counter()
    yield
    timing[name] = time.perf_counter() - start


def make_optimizer(params, optim) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with verl's defaults and a constant LR after a linear warm-up (stepped once per training step)."""
    optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay)
    warmup = max(optim.lr_warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    return optimizer, scheduler


def concat_padded(batches: list[Batch], pad_id: int) -> Batch:
    """Concatenate batches whose prompt (left-padded) and response (right-padded) widths differ."""
    p_width = max(b["prompts"].shape[1] for b in batches)
    r_width = max(b["responses"].shape[1] for b in batches)
    out = []
    for b in batches:
        t = dict(b.tensors)
        for key in ("prompts", "prompt_mask"):
            fill = pad_id if key == "prompts" else 0
            t[key] = torch.nn.functional.pad(t[key], (p_width - t[key].shape[1], 0), value=fill)
        for key in ("responses", "response_mask", "rollout_log_probs", "response_attention_mask"):
            if key not in t:
                continue
            fill = pad_id if key == "responses" else 0
            t[key] = pad_right(t[key], r_width, fill)
        out.append(Batch(t, b.lists))
    return Batch.concat(out)


def add_padding_samples(batch: Batch, count: int, tokenizer) -> Batch:
    """Synthetic rows so the batch divides (verl `padding_utils.py`): a 1-token prompt, a 1-token EOS response with
    response_mask = 0, score 0, rollout log-prob 0, all in one fresh group of their own."""
    if count == 0:
        return batch
    first = batch.select([0])
    pad = Batch({k: v.repeat(count, *([1] * (v.dim() - 1))) for k, v in first.tensors.items()},
                {k: v * count for k, v in first.lists.items()})
    for key in ("prompt_mask", "response_mask", "loss_mask", "rollout_log_probs", "token_level_scores",
                "response_attention_mask"):
        if key in pad:
            pad[key] = torch.zeros_like(pad[key])
    pad["prompt_mask"][:, -1] = 1
    pad["responses"] = torch.full_like(pad["responses"], tokenizer.pad_token_id)
    pad["responses"][:, 0] = tokenizer.eos_token_id
    pad["uid"] = torch.full_like(pad["uid"], int(batch["uid"].max()) + 1)
    pad["is_pad"] = torch.ones_like(pad["is_pad"])
    return Batch.concat([batch, pad])


def data_metrics(batch: Batch, use_critic: bool, max_response_length: int) -> dict[str, float]:
    """verl's ``compute_data_metrics``: score / reward / advantage / return / value statistics and lengths."""
    real = ~batch["is_pad"]
    mask = batch["response_mask"][real].bool()
    out: dict[str, float] = {}

    def stats(name: str, values: torch.Tensor) -> None:
        if values.numel():
            out.update({f"{name}/mean": float(values.mean()), f"{name}/max": float(values.max()),
                        f"{name}/min": float(values.min())})

    stats("critic/score", batch["token_level_scores"][real].sum(-1))
    stats("critic/rewards", batch["token_level_rewards"][real].sum(-1))
    stats("critic/advantages", batch["advantages"][real][mask])
    stats("critic/returns", batch["returns"][real][mask])
    if use_critic:
        stats("critic/values", batch["values"][real][mask])
        if mask.sum() > 1:
            out["critic/vf_explained_var"] = float(algos.explained_variance(
                batch["returns"][real], batch["values"][real], batch["response_mask"][real]))
    # Lengths from loss_mask, the mask as generated: rejection sampling (rollout_rs) zeroes tokens of response_mask
    # but does not shorten a response (verl counts lengths from the attention mask).
    lengths = batch.tensors.get("loss_mask", batch["response_mask"])[real].sum(-1)
    stats("response_length", lengths)
    out["response_length/clip_ratio"] = float((lengths >= max_response_length).float().mean())
    stats("prompt_length", batch["prompt_mask"][real].sum(-1).float())
    return out
