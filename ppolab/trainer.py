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

The trainer orchestrates; it holds no formula and no update loop. Each role is a worker (``ppolab.worker``: the
actor, critic and reference each own their model context, optimizer and ``infer`` / ``update``); every formula
comes from ``ppolab.algos``; only ``ppolab.run.recorder.Recorder`` writes the run directory.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import torch

from ppolab import algos, distributed
from ppolab.batching import plan_batches, total_steps
from ppolab.config import PPOConfig
from ppolab.distributed import DistInfo
from ppolab.batch import Batch, concat_padded, pad_and_balance
from ppolab.eval import validation_metrics
from ppolab.metrics import data_metrics, signal_metrics, timer, timing_metrics
from ppolab.rewards import reward_components, score_responses
from ppolab.rng import load_rng_state, rng_state, seed_everything
from ppolab.rollout import SamplingParams, make_rollout_engine, require_engine
from ppolab.update_plan import UpdatePlan, forward_batching
from ppolab.worker import ActorWorker, CriticWorker, InferBatching, ReferenceWorker, build_models


class PPOTrainer:
    """Builds models, workers, data and the rollout engine from a validated :class:`PPOConfig`; runs steps."""

    def __init__(self, config: PPOConfig, dist_info: DistInfo | None = None,
                 say: Callable[[str], None] | None = None, value_loss: Callable | None = None):
        """``say``: told each phase of the build as it starts (``ppolab.progress``: the main job's first lines);
        ``value_loss``: the critic's loss instead of verl's (:class:`ppolab.worker.CriticWorker`; lab 17)."""
        from ppolab.data import check_data_files, load_rl_dataset
        from ppolab.rewards import get_reward_fn

        self.config = cfg = config
        # Files and the reward function are checked before the model loads: a mistake costs no waiting.
        check_data_files(cfg.data, need_val=cfg.trainer.test_freq > 0 or cfg.trainer.val_before_train)
        self.reward_fn = get_reward_fn(cfg.custom_reward_function)
        self.reward_timeout_s = cfg.custom_reward_function.timeout_s
        self.dist = dist_info or DistInfo()
        self.dp_rank, self.dp_size = self.dist.rank, self.dist.world_size
        self.local_rows: list[int] | None = None  # this rank's chunk of the balanced batch
        self.actor_state_before: dict[str, Any] | None = None  # step(keep_actor_state=True)
        seed_everything(cfg.trainer.seed)
        arr = cfg.actor_rollout_ref
        require_engine(arr.rollout.name)  # a missing vllm is reported before the model loads
        self.use_critic, self.use_ref = cfg.use_critic, cfg.use_reference_policy
        say = say or (lambda text: None)
        m = arr.model
        trains = f"LoRA rank {m.lora_rank}" if m.lora_rank else "all weights trained"
        say(f"loading the model {m.path} ({m.dtype}, {trains}{', a critic' if self.use_critic else ''}) …")
        self.models = build_models(cfg, self.dist)
        self.device, self.tokenizer = self.models.device, self.models.tokenizer
        roles = dict(temperature=arr.rollout.temperature, dist=self.dist)
        self.actor = ActorWorker(arr.actor, self.models, rollout_n=arr.rollout.n, **roles)
        self.critic = CriticWorker(cfg.critic, self.models, rollout_n=arr.rollout.n, value_loss=value_loss, **roles) \
            if self.use_critic else None
        self.ref = ReferenceWorker(self.models, remove_padding=m.use_remove_padding, **roles) if self.use_ref else None
        self.train_data = load_rl_dataset(cfg.data.train_files, self.tokenizer, cfg.data.max_prompt_length)
        val = (load_rl_dataset(cfg.data.val_files, self.tokenizer, cfg.data.max_prompt_length)
               if cfg.data.val_files else [])
        self.val_data = val[: cfg.data.val_max_samples] if cfg.data.val_max_samples else val
        self.total_steps = total_steps(cfg.trainer, len(self.train_data) // cfg.data.train_batch_size)
        say(f"data: {len(self.train_data)} training prompts, {len(self.val_data)} validation prompts; "
            f"starting the {arr.rollout.name} rollout engine …")
        vllm_args = dict(seed=cfg.trainer.seed,
                         max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length)
        self.rollout = make_rollout_engine(arr.rollout, self.models,
                                           **(vllm_args if arr.rollout.name == "vllm" else {}))
        self.kl_ctrl_in_reward = (algos.get_kl_controller(cfg.algorithm.kl_ctrl)
                                  if cfg.algorithm.use_kl_in_reward else None)
        self.plan = plan_batches(cfg.data.train_batch_size, arr.rollout.n, arr.actor.ppo_mini_batch_size,
                                 self.dp_size, None if arr.actor.use_dynamic_bsz else
                                 arr.actor.ppo_micro_batch_size_per_gpu, arr.actor.ppo_epochs,
                                 pad_to=self.padding_multiple())
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
        # A copy, counted by the worker for the global token count (verl `forward_backward_batch`).
        batch["loss_mask"] = batch["response_mask"].clone()
        return batch

    def greedy_baselines(self, prompts: list[dict[str, Any]]) -> torch.Tensor:
        """The score of one greedy (``do_sample=False``) response per prompt, (P,): ReMax's ``reward_baselines``,
        generated and scored the way verl's trainer does for ``adv_estimator=remax``."""
        r = self.config.actor_rollout_ref.rollout
        out = self.rollout.generate([p["input_ids"] for p in prompts], 1,
                                    SamplingParams(r.temperature, r.top_p, r.top_k, False),
                                    self.config.data.max_response_length)
        scores, _ = score_responses(self.reward_fn, prompts, self.decode(out.responses), self.reward_timeout_s)
        return torch.tensor(scores, dtype=out.response_mask.dtype)

    def decode(self, responses: torch.Tensor) -> list[str]:
        return self.tokenizer.batch_decode(responses, skip_special_tokens=True)

    # ================================================================== stage 2: reward
    def compute_reward(self, batch: Batch) -> Batch:
        """verl's reward signature per trajectory; the score sits on the last valid response token. The other
        keys of a dict return are kept per row as ``reward_extra_info`` (the components ``gdpo`` combines)."""
        keys = ("data_source", "ground_truth", "extra_info")
        items = [dict(zip(keys, row)) for row in zip(*(batch.lists[k] for k in keys))]
        scores, batch.lists["reward_extra_info"] = score_responses(self.reward_fn, items,
                                                                   self.decode(batch["responses"]),
                                                                   self.reward_timeout_s)
        # The last position with response_mask = 1: the end of the policy's own text (tool observations,
        # spliced in with mask 0, may sit before it; padding after it).
        mask = batch["response_mask"]
        positions = torch.arange(mask.shape[1]).expand_as(mask)
        last = torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(-1).values.clamp(min=0)
        token_level_scores = torch.zeros_like(mask)
        token_level_scores[torch.arange(len(batch)), last] = torch.tensor(scores, dtype=mask.dtype)
        batch["token_level_scores"] = token_level_scores * mask
        return batch

    # ================================================================== stage 3: balance
    def balance_batch(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Pad with synthetic samples to a multiple of lcm(dp, mini×n) and split rows across DP ranks by
        Karmarkar–Karp on the attention workload (verl V1 `trainer_base.py` stage 3, `padding_utils.py`)."""
        batch, metrics = pad_and_balance(batch, self.padding_multiple(), self.dp_size, self.tokenizer)
        chunk = len(batch) // self.dp_size  # rank k works on the k-th contiguous chunk (equal-size partitions)
        self.local_rows = list(range(self.dp_rank * chunk, (self.dp_rank + 1) * chunk))
        return batch, metrics

    def padding_multiple(self) -> int:
        """lcm(dp, actor mini×n, critic mini×n when there is a critic): the row count balance_batch pads to."""
        return self.config.padding_multiple(self.dp_size)

    def local(self, batch: Batch) -> Batch:
        """This rank's chunk of the balanced batch (the whole batch with one process)."""
        if not self.dist.enabled:
            return batch
        if self.local_rows is None or len(self.local_rows) * self.dp_size != len(batch):
            raise RuntimeError("balance_batch must run before a forward or an update with several ranks")
        return batch.select(self.local_rows)

    def _infer(self, worker, batch: Batch, batching: InferBatching, **want: bool) -> dict[str, torch.Tensor]:
        """``worker.infer`` on this rank's rows, gathered over ranks: outputs for every row, in row order."""
        out = worker.infer(self.local(batch), batching, **want)
        if not self.dist.enabled:
            return out
        gathered = distributed.all_gather_object(out, self.dist)
        return {k: torch.cat([g[k] for g in gathered]) for k in out}

    # ================================================================== stages 4–6: forward passes
    def compute_old_log_prob(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """π_old: recomputed by the actor (decoupled, the default) or copied from the rollout (bypass mode)."""
        cfg = self.config
        rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
        if cfg.algorithm.rollout_correction.bypass_mode:
            batch["old_log_probs"] = batch["rollout_log_probs"].clone()
            return batch, {}
        out = self._infer(self.actor, batch, forward_batching(rollout, len(batch)),
                          entropy=True, sum_pi_squared=actor.calculate_sum_pi_squared)
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
        """π_ref: the same forward with LoRA disabled (or the frozen copy), same temperature (verl V1
        `trainer_base.py` stage 5)."""
        ref = self.config.actor_rollout_ref.ref
        batch["ref_log_prob"] = self._infer(self.ref, batch, forward_batching(ref, len(batch)))["log_probs"]
        return batch

    def compute_values(self, batch: Batch) -> Batch:
        """V_old: the critic's values of the states before each response token, micro-batched as the critic
        engine does (token budget ``critic.ppo_infer_max_token_len_per_gpu``, verl V1 `trainer_base.py`; the
        top-level critic micro-batch keys do not reach it, chapter §11.6)."""
        batch["values"] = self._infer(self.critic, batch, self.critic.engine_batching(),
                                      log_probs=False, values=True)["values"]
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
        # verl runs this whenever rollout log-probs exist outside bypass mode; ppolab only when a correction is
        # configured (rollout_is or rollout_rs), so runs without one log no rollout_corr/* (they log
        # training/rollout_probs_diff_* at stage 4, as verl does).
        if (corr.rollout_is or corr.rollout_rs) and not corr.bypass_mode and mask.any():
            weights, rs_mask, corr_metrics = algos.rollout_correction_and_rejection_mask(
                batch["old_log_probs"], batch["rollout_log_probs"], mask, corr.rollout_is, corr.rollout_is_threshold,
                corr.rollout_is_batch_normalize, corr.rollout_rs, corr.rollout_rs_threshold)
            metrics.update(corr_metrics)
            if weights is not None:
                batch["rollout_is_weights"] = weights
            if corr.rollout_rs:
                if "response_attention_mask" not in batch:  # rejection changes what is learned, not what is seen:
                    batch["response_attention_mask"] = mask.clone()  # later forwards still attend to every token
                batch["response_mask"] = mask = rs_mask
        # verl's compute_advantage(data, ...) hands each estimator what it declares from the whole DataProto
        # (gdpo reads its components from non_tensor_batch and their positions from batch["attention_mask"]).
        tensors, non_tensor_batch = self.verl_data(batch)
        batch["advantages"], batch["returns"] = algos.compute_advantage_from_data(
            tensors, non_tensor_batch, alg.adv_estimator, gamma=alg.gamma, lam=alg.lam,
            norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo, config=alg)
        return batch, metrics

    @staticmethod
    def verl_data(batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The batch as verl's DataProto halves: ``batch`` (every tensor plus verl's ``attention_mask``) and
        ``non_tensor_batch`` (the per-row lists, each reward component as its own column — verl merges
        ``reward_extra_info`` into it — and ``uid``)."""
        tensors = {**batch.tensors, "attention_mask": batch.attention_mask()}
        rows = {k: v for k, v in batch.lists.items() if k != "reward_extra_info"}
        rows.update(reward_components(batch.lists.get("reward_extra_info")))
        rows["uid"] = batch["uid"].tolist()
        return tensors, rows

    # ================================================================== stages 8–9: updates
    def update_critic(self, batch: Batch) -> tuple[dict[str, float], dict[str, torch.Tensor], UpdatePlan]:
        """Clipped value loss over critic mini-batches (critic.ppo_mini_batch_size × n rows) and epochs, each cut
        into micro-batches by the engine's token budget (``CriticWorker.engine_batching``). Also returns the vpreds
        each optimizer step saw (``critic_vpreds``: (steps, N, R) with NaN elsewhere) and the plan it executed."""
        return self.critic.update(self.local(batch))

    def update_actor(self, batch: Batch) -> tuple[dict[str, float], dict[str, torch.Tensor], UpdatePlan]:
        """PPO loss over actor mini-batches (ppo_mini_batch_size × n rows) and epochs; one optimizer step per
        mini-batch. Also returns the log-probs (``actor_log_probs``) and, where the loss computes it, the entropy
        (``actor_entropy``) each optimizer step saw ((steps, N, R) with NaN elsewhere), and the plan it executed."""
        return self.actor.update(self.local(batch))

    # ================================================================== one step
    def step(self, keep_actor_state: bool = False) -> tuple[dict[str, float], Batch, dict[str, torch.Tensor],
                                                            dict[str, UpdatePlan]]:
        """One training step through the nine stages; returns (metrics, final batch, histories, plans), histories
        holding ``ppolab.run.step.HISTORIES`` per optimizer step (``ppolab.worker.UpdateHistory``), plans the update
        plan each worker executed, by role (``ppolab.update_plan``). ``keep_actor_state``: leave the actor's state
        from just before its update in ``self.actor_state_before`` (:meth:`actor_state`; None otherwise)."""
        self.global_step += 1
        self.actor_state_before = None
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
            plans: dict[str, UpdatePlan] = {}
            if self.use_critic:
                with timer(timing, "update_critic"):
                    m, h, plans["critic"] = self.update_critic(batch)
                    metrics.update(m)
                    histories.update(h)
            if self.config.trainer.critic_warmup <= self.global_step:
                if keep_actor_state:  # a copy: Adam changes its moments in place
                    self.actor_state_before = self.actor_state()
                with timer(timing, "update_actor"):
                    m, h, plans["actor"] = self.update_actor(batch)
                    metrics.update(m)
                    histories.update(h)
            self.rollout.sync_weights()
        if self.kl_ctrl_in_reward is None and self.config.actor_rollout_ref.actor.use_kl_loss:
            metrics["actor/kl_coef"] = self.config.actor_rollout_ref.actor.kl_loss_coef
        metrics.update(data_metrics(batch, self.use_critic, self.config.data.max_response_length))
        metrics.update(signal_metrics(batch))
        metrics.update(timing_metrics(batch, timing, self.dp_size))
        return metrics, batch, histories, plans

    # ================================================================== validation
    def validate(self) -> dict[str, float]:
        """Greedy decoding (val_kwargs) on the validation prompts: ``val/accuracy`` and friends."""
        if not self.val_data:
            return {}
        vk = self.config.actor_rollout_ref.rollout.val_kwargs
        sampling = SamplingParams(vk.temperature or 1.0, vk.top_p, vk.top_k, vk.do_sample)
        out = self.rollout.generate([p["input_ids"] for p in self.val_data], vk.n, sampling,
                                    self.config.data.max_response_length)
        items = [p for p in self.val_data for _ in range(vk.n)]
        scores, _ = score_responses(self.reward_fn, items, self.decode(out.responses), self.reward_timeout_s)
        return validation_metrics(items, scores, out.response_mask.sum(-1), vk.n)

    # ================================================================== checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue exactly: trainable weights, each worker's optimizer and
        scheduler, the data cursor, the KL controller and the RNG states (torch per rank: ranks sample
        differently). Tensors and JSON-able values only; :meth:`ppolab.run.recorder.Recorder.save_checkpoint` writes
        it."""
        workers = {"actor": self.actor, **({"critic": self.critic} if self.critic is not None else {})}
        return {
            "weights": self.models.trainable_state(),
            "workers": {name: w.state_dict() for name, w in workers.items()},
            "progress": {"global_step": self.global_step, "data_epoch": self.data_epoch,
                         "data_cursor": self.data_cursor,
                         "kl_ctrl_value": self.kl_ctrl_in_reward.value if self.kl_ctrl_in_reward else None},
            "rng": rng_state(),
        }

    def actor_state(self) -> dict[str, Any]:
        """A copy of what the actor's next update starts from: its trainable weights ("actor.<i>", as
        ``PolicyModels.trainable_state`` names them), optimizer and scheduler state — what a replay of the update
        loads (``trainer.record_update_state``, ``ppolab.run.checkpoints.update_state_record``)."""
        weights = {k: v.clone() for k, v in self.models.trainable_state().items() if k.startswith("actor.")}
        return {"weights": weights, **copy.deepcopy(self.actor.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.models.load_trainable_state(state["weights"])
        self.actor.load_state_dict(state["workers"]["actor"])
        if self.critic is not None:
            self.critic.load_state_dict(state["workers"]["critic"])
        progress = state["progress"]
        self.global_step, self.data_epoch = progress["global_step"], progress["data_epoch"]
        self._order = self._epoch_order(self.data_epoch)
        self.data_cursor = progress["data_cursor"]
        if self.kl_ctrl_in_reward is not None:
            self.kl_ctrl_in_reward.value = progress["kl_ctrl_value"]
        load_rng_state(state["rng"])

    def close(self) -> None:
        """Release the rollout engine (a vLLM engine holds memory and process groups until shut down)."""
        close = getattr(self.rollout, "close", None)
        if close is not None:
            close()
