"""Workers: one role each — its model context, its config slice, its optimizer — offering ``infer`` and
``update`` (verl's trainer / worker split; chapter §1, §11–§13).

    actor      ActorWorker(config.actor_rollout_ref.actor, models, …)    infer: log π, entropy   update: ppo_loss
    critic     CriticWorker(config.critic, models, …)                    infer: V                update: value_loss
    reference  ReferenceWorker(models, …)                                infer: log π_ref

The actor and the critic share one update body, :meth:`Worker.update` — verl's ``train_mini_batch``: per
mini-batch, zero the gradients, compute the global counts (:class:`ppolab.algos.GlobalBatchInfo`) *before* the
micro-batch loop, forward/backward each micro-batch with the loss normalised by them, clip the global gradient
norm, step. The roles differ only in :meth:`Worker.loss`. A worker never reads the trainer and never writes into
its config: ``ppolab.replay`` builds one on a recorded batch with a changed copy of the config.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import torch

from ppolab import algos, distributed
from ppolab.algos import GlobalBatchInfo
from ppolab.distributed import DistInfo
from ppolab.batch import Batch, pad_right, to_device, trimmed_inputs
from ppolab.metrics import accumulate_micro_metrics, reduce_metrics
from ppolab.models import MODEL_LOCK, check_packing_supported
from ppolab.roles import PolicyModels
from ppolab.models import forward_response
from ppolab.update_plan import (InferBatching, OptimizerStep, RankRows, UpdatePlan, micro_batches, plan_update,
                                train_batching)

__all__ = ["ActorWorker", "CriticWorker", "InferBatching", "ReferenceWorker", "UpdateHistory", "UpdatePlan",
           "Worker", "build_models", "make_optimizer"]


def build_models(cfg: Any, dist: DistInfo | None = None) -> PolicyModels:
    """The one frozen base and its roles (actor adapter, critic adapter + value head, reference) from the config,
    on this rank's device (``distributed.select_device``: ``cuda:LOCAL_RANK`` on GPUs, else the CPU)."""
    dist = dist or DistInfo()
    device, _ = distributed.select_device(cfg.trainer.device, dist.local_rank, torch.cuda.is_available(),
                                          dist.world_size)
    arr = cfg.actor_rollout_ref
    packed = {"actor_rollout_ref.model.use_remove_padding": arr.model.use_remove_padding,
              "actor_rollout_ref.actor.use_remove_padding": arr.actor.use_remove_padding,
              "critic.model.use_remove_padding": cfg.use_critic and cfg.critic.model.use_remove_padding}
    check_packing_supported([key for key, on in packed.items() if on])
    with MODEL_LOCK:  # its loads, seed and adapter init: never beside another thread's load (ppolab.models)
        return PolicyModels(
            arr.model.path, arr.model.lora_rank, arr.model.lora_alpha, arr.model.target_modules, arr.model.dtype,
            str(device), use_critic=cfg.use_critic, use_reference=cfg.use_reference_policy,
            critic_lora_rank=cfg.critic.model.lora_rank, critic_lora_alpha=cfg.critic.model.lora_alpha,
            critic_path=cfg.critic.model.path,
            critic_target_modules=cfg.critic.model.target_modules, seed=cfg.trainer.seed,
            gradient_checkpointing=arr.model.enable_gradient_checkpointing,
        )


def make_optimizer(params: list[torch.nn.Parameter], optim) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW with verl's defaults and a constant LR after a linear warm-up (stepped once per training step)."""
    optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay)
    warmup = max(optim.lr_warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    return optimizer, scheduler


class UpdateHistory:
    """What the model computed for each row at every optimizer step of an update — the actor's log-probs
    (the ratio drifting from 1 across mini-batches and epochs) and entropy, or the critic's vpreds — as (steps, N, R),
    NaN for rows outside that step's mini-batch. Recorded for the labs; the update never reads it."""

    def __init__(self, shape: torch.Size):
        self.shape, self.steps, self._seen = shape, [], []

    def see(self, row_ids: torch.Tensor, values: torch.Tensor) -> None:
        self._seen.append((row_ids.cpu(), pad_right(values.detach().float().cpu(), self.shape[1], float("nan"))))

    def flush(self) -> None:
        record = torch.full(self.shape, float("nan"))
        for row_ids, values in self._seen:
            record[row_ids] = values
        self.steps.append(record)
        self._seen.clear()

    def stacked(self) -> torch.Tensor:
        return torch.stack(self.steps) if self.steps else torch.full((0, *self.shape), float("nan"))


class Worker:
    """One role. Subclasses give :meth:`model` (the role's model context), :meth:`parameters` and :meth:`loss`.

    ``config``: the role's config slice (``actor_rollout_ref.actor`` or ``critic``: both carry
    ``ppo_mini_batch_size``, ``ppo_epochs``, ``shuffle``, ``data_loader_seed``, the micro-batch keys, ``optim``,
    ``loss_agg_mode`` and ``loss_scale_factor``); ``temperature``: the rollout's, which every forward divides the
    logits by; ``rollout_n``: responses per prompt (a mini-batch holds ``ppo_mini_batch_size × n`` rows);
    ``optimizer``: None builds AdamW + warm-up from ``config.optim``; a replay passes its own.
    ``remove_padding``: whether every forward runs on packed rows (verl ``use_remove_padding``,
    :func:`ppolab.models.forward_response`); None reads it from the config slice (:meth:`packs`).
    """

    prefix = "worker"  # metric prefix: actor/… or critic/…

    def __init__(self, config: Any, models: PolicyModels, *, temperature: float, rollout_n: int = 1,
                 dist: DistInfo | None = None, optimizer: torch.optim.Optimizer | None = None,
                 remove_padding: bool | None = None):
        self.config, self.models = config, models
        self.temperature, self.rollout_n = temperature, rollout_n
        self.remove_padding = self.packs(config) if remove_padding is None else bool(remove_padding)
        self.dist = dist or DistInfo()
        self.device = models.device
        if optimizer is not None or config is None:  # a replay's own optimizer, or a frozen role (no config)
            self.optimizer, self.scheduler = optimizer, None
        else:
            self.optimizer, self.scheduler = make_optimizer(self.parameters(), config.optim)

    # ------------------------------------------------------------------ per role
    @staticmethod
    def packs(config: Any) -> bool:
        """The role's ``use_remove_padding`` in its config slice (the actor's, resolved from the model's)."""
        return bool(getattr(config, "use_remove_padding", None))

    def model(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        raise NotImplementedError

    def parameters(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError

    def loss(self, mb: Batch, info: GlobalBatchInfo) -> tuple[torch.Tensor, dict[str, float], dict[str, torch.Tensor]]:
        """One micro-batch (on the device, padding cut to its own longest row): (loss, metrics, per-token outputs
        for the histories, keyed by their recorded names: ``ppolab.run.step.HISTORIES``)."""
        raise NotImplementedError

    def train_batching(self) -> InferBatching:
        """How :meth:`update` cuts a mini-batch into micro-batches: the role's ``ppo_micro_batch_size_per_gpu``, or
        its ``ppo_max_token_len_per_gpu`` budget when ``use_dynamic_bsz`` (the actor; the critic: its engine's budget).
        The planner's :func:`ppolab.update_plan.train_batching`."""
        return train_batching(self.config, self.prefix)

    def micro_batches(self, batch: Batch, batching: InferBatching) -> list[list[int]]:
        """This rank's micro-batches of ``batch``. Dynamic ones on several ranks are planned from every rank's
        lengths, so all ranks run as many micro-batches (verl `rearrange_micro_batches`, ``same_micro_num_in_dp``:
        an all-reduce MAX of the count, then MIN of "every partition fits")."""
        dp_lengths = None
        if batching.micro_batch_size is None and self.dist.enabled:
            dp_lengths = distributed.all_gather_object(batch.lengths(), self.dist)
        return micro_batches(batch, batching.micro_batch_size, batching.max_token_len, dp_lengths=dp_lengths,
                             rank=self.dist.rank)

    # ------------------------------------------------------------------ forward only
    def infer(self, batch: Batch, batching: InferBatching, *, log_probs: bool = True, entropy: bool = False,
              values: bool = False, sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
        """A forward-only pass over ``batch`` in micro-batches, in eval mode and without gradients. Returns the
        requested per-token outputs ``log_probs``, ``entropy``, ``values``, ``sum_pi_squared`` as (N, R) float
        tensors on the CPU, in row order, right-padded to the batch's response width."""
        width = batch["responses"].shape[1]
        rows_seen: list[int] = []
        results: dict[str, list[torch.Tensor]] = {"log_probs": [], "entropy": [], "values": [], "sum_pi_squared": []}
        value_head = self.models.value_head if values else None
        with torch.inference_mode(), self.model() as model:
            was_training = model.training
            model.eval()
            for rows in self.micro_batches(batch, batching):
                mb = to_device(batch.select(rows), self.device)
                ids, mask, r_len = trimmed_inputs(mb)
                out = forward_response(model, ids, mask, r_len, self.temperature, log_probs, entropy, value_head,
                                       sum_pi_squared, remove_padding=self.remove_padding)
                rows_seen += rows
                for key in results:
                    value = getattr(out, key)
                    if value is not None:
                        results[key].append(pad_right(value.float().cpu(), width))
            model.train(was_training)
        order = torch.argsort(torch.as_tensor(rows_seen))
        return {k: torch.cat(v)[order] for k, v in results.items() if v}

    # ------------------------------------------------------------------ the update (one body for every role)
    def plan(self, batch: Batch) -> UpdatePlan:
        """This update's plan (:func:`ppolab.update_plan.plan_update`) from every rank's rows, gathered once: which
        rows each optimizer step and micro-batch holds on every rank, and each step's global counts (chapter §13) —
        all of it known before the first forward."""
        ranks = distributed.all_gather_object(RankRows.of(batch), self.dist)
        return plan_update(ranks, self.config, self.train_batching(), role=self.prefix, rollout_n=self.rollout_n)

    def update(self, batch: Batch) -> tuple[dict[str, float], dict[str, torch.Tensor], UpdatePlan]:
        """``ppo_epochs`` passes over this rank's rows in mini-batches of ``ppo_mini_batch_size × n / dp`` rows,
        one optimizer step each, exactly as :meth:`plan` lays them out; then one scheduler step. Returns (metrics
        averaged over optimizer steps and ranks, histories: recorded name → (steps, N, R) of what each optimizer
        step computed, merged over ranks — ``actor_log_probs`` and ``actor_entropy``, or ``critic_vpreds`` —, the
        plan it executed)."""
        params = self.parameters()
        plan = self.plan(batch)
        # Indexed by the balanced batch's row_id: every rank's chunk has the same size, so the step has len × dp rows.
        shape = torch.Size((len(batch) * self.dist.world_size, batch["responses"].shape[1]))
        histories: dict[str, UpdateHistory] = {}  # recorded name → its history, made at the first micro-batch
        steps = []
        for opt in plan.steps:
            steps.append(self.optimizer_step_of(batch, opt, params, histories, shape))
            for history in histories.values():
                history.flush()
        if self.scheduler is not None:
            self.scheduler.step()
        steps = distributed.mean_metrics_over_ranks(steps, self.dist)
        return reduce_metrics(steps), {name: distributed.merge_histories(h.stacked(), self.dist)
                                       for name, h in histories.items()}, plan

    def optimizer_step_of(self, batch: Batch, opt: OptimizerStep, params: list[torch.nn.Parameter],
                          histories: dict[str, UpdateHistory] | None = None,
                          shape: torch.Size | None = None) -> dict[str, float]:
        """One optimizer step of a plan on this rank's ``batch``: :meth:`backward_of` (zero the gradients,
        forward/backward each of this rank's micro-batches), then :meth:`optimizer_step`. Returns the step's
        metrics; what each micro-batch computed goes to ``histories``."""
        micro_metrics, total_loss = self.backward_of(batch, opt, histories, shape)
        grad_norm = self.optimizer_step(params)
        metrics = accumulate_micro_metrics(micro_metrics)
        metrics.update({f"{self.prefix}/grad_norm": grad_norm, f"{self.prefix}/loss": total_loss,
                        f"{self.prefix}/lr": self.optimizer.param_groups[0]["lr"]})
        return metrics

    def backward_of(self, batch: Batch, opt: OptimizerStep, histories: dict[str, UpdateHistory] | None = None,
                    shape: torch.Size | None = None) -> tuple[list[dict[str, float]], float]:
        """Zero the gradients, then forward and backward each of this rank's micro-batches of ``opt`` with the loss
        normalised by the step's global counts — computed before the loop, so a micro-batch never normalises by
        itself (chapter §13). The gradients of the whole mini-batch are left in ``.grad``. Returns (each
        micro-batch's metrics, Σ micro-batch losses)."""
        position = {int(row): i for i, row in enumerate(batch["row_id"])}  # row id → position on this rank
        self.optimizer.zero_grad(set_to_none=True)
        info = opt.info()  # GRPO-Zero's normaliser, in plain sight
        micro_metrics, total_loss = [], 0.0
        for micro_rows in opt.micro_batches[self.dist.rank]:
            mb = to_device(batch.select([position[row] for row in micro_rows]), self.device)
            loss, metrics, outputs = self.loss(mb, info)
            if histories is not None:
                for name, value in outputs.items():
                    histories.setdefault(name, UpdateHistory(shape)).see(mb["row_id"], value)
            loss.backward()
            total_loss += float(loss.detach())
            micro_metrics.append(metrics)
        return micro_metrics, total_loss

    def optimizer_step(self, params: list[torch.nn.Parameter]) -> float:
        """Average gradients over ranks (what DDP/FSDP do), clip the global norm, step — or, as verl does, skip the
        step and drop the gradients when the norm is not finite. Returns the norm before clipping."""
        if self.dist.enabled:
            distributed.average_gradients(params)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.optim.clip_grad)
        if math.isfinite(float(grad_norm)):
            self.optimizer.step()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Optimizer and scheduler state (the weights live in the shared models: ``PolicyModels.trainable_state``)."""
        return {"optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])


class ActorWorker(Worker):
    """The policy: base + ``actor`` adapter (or every weight without LoRA). Its loss is ``algos.ppo_loss``.

    ``terms``: which of ``algos.LOSS_TERMS`` its loss holds — None (training: all of them), or one term for a reading
    of that term's share of the gradient (``ppolab.numbers.update_effect``)."""

    prefix = "actor"
    terms: tuple[str, ...] | None = None

    def model(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        return self.models.actor()

    def parameters(self) -> list[torch.nn.Parameter]:
        return self.models.actor_parameters()

    def loss(self, mb: Batch, info: GlobalBatchInfo) -> tuple[torch.Tensor, dict[str, float], dict[str, torch.Tensor]]:
        c = self.config
        ids, mask, r_len = trimmed_inputs(mb)
        with self.model() as model:
            out = forward_response(model, ids, mask, r_len, self.temperature, True,
                                   c.calculate_entropy or c.entropy_coeff != 0, remove_padding=self.remove_padding)
        cut = lambda key: mb[key][:, :r_len] if key in mb else None  # noqa: E731
        loss, metrics = algos.ppo_loss(
            c, old_log_prob=cut("old_log_probs"), log_prob=out.log_probs, advantages=cut("advantages"),
            response_mask=cut("response_mask"), entropy=out.entropy, ref_log_prob=cut("ref_log_prob"),
            rollout_is_weights=cut("rollout_is_weights"), global_batch_info=info, terms=self.terms)
        # π_θ's entropy is recorded too: actor/entropy_loss is its aggregate, which a lab rebuilds (chapter §6)
        outputs = {"actor_log_probs": out.log_probs}
        if out.entropy is not None:
            outputs["actor_entropy"] = out.entropy
        return loss, metrics, outputs


class CriticWorker(Worker):
    """The value model: base + ``critic`` adapter + value head. Its loss is ``algos.value_loss`` — verl's clipped
    value loss, or ``value_loss`` when given (``algos.value_loss``'s ``loss_fn``: lab 17's part II)."""

    prefix = "critic"

    def __init__(self, config: Any, models: PolicyModels, *, value_loss: Callable | None = None, **kw: Any):
        super().__init__(config, models, **kw)
        self.value_loss = value_loss

    def model(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        return self.models.critic()

    def parameters(self) -> list[torch.nn.Parameter]:
        return self.models.critic_parameters()

    @staticmethod
    def packs(config: Any) -> bool:
        """``critic.model.use_remove_padding``: verl's critic has its own key."""
        return bool(getattr(getattr(config, "model", None), "use_remove_padding", None))

    def engine_batching(self) -> InferBatching:
        """The critic engine's micro-batching, the same for its value forward (stage 6) and its update (stage 8):
        token-budget packing with ``critic.ppo_infer_max_token_len_per_gpu``. verl V1 `trainer_base.py` writes that
        one key into the engine's ``infer_max_token_len_per_gpu`` and ``max_token_len_per_gpu``, and the engine
        keeps EngineConfig's ``use_dynamic_bsz=True``; the top-level ``critic.use_dynamic_bsz``,
        ``ppo_micro_batch_size_per_gpu`` and ``ppo_max_token_len_per_gpu`` never reach it (chapter §8, §11.6)."""
        return train_batching(self.config, "critic")

    def loss(self, mb: Batch, info: GlobalBatchInfo) -> tuple[torch.Tensor, dict[str, float], dict[str, torch.Tensor]]:
        c = self.config
        ids, mask, r_len = trimmed_inputs(mb)
        with self.model() as model:
            vpreds = forward_response(model, ids, mask, r_len, self.temperature, False, False,
                                      self.models.value_head, remove_padding=self.remove_padding).values
        loss, metrics = algos.value_loss(vpreds, mb["returns"][:, :r_len], mb["values"][:, :r_len],
                                         mb["response_mask"][:, :r_len], c.cliprange_value, c.loss_agg_mode, info,
                                         loss_fn=self.value_loss)
        return loss, metrics, {"critic_vpreds": vpreds}


class ReferenceWorker(Worker):
    """π_ref: the actor's base with the adapters disabled (or a frozen copy). Forward only: no optimizer."""

    prefix = "ref"

    def __init__(self, models: PolicyModels, *, temperature: float, dist: DistInfo | None = None,
                 remove_padding: bool = False):
        super().__init__(None, models, temperature=temperature, dist=dist, remove_padding=remove_padding)

    @contextlib.contextmanager
    def model(self) -> Iterator[torch.nn.Module]:
        with self.models.reference() as model:
            yield model

    def parameters(self) -> list[torch.nn.Parameter]:
        return []

    def update(self, batch: Batch) -> tuple[dict[str, float], dict[str, torch.Tensor], UpdatePlan]:
        raise TypeError("the reference policy is frozen: it has no update")
