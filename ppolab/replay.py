"""Replay the trainer's real actor update on a recorded step, under other batching and aggregation settings.

Why only recorded step 1 (mini-batch 0) is exact: a recorded step stores the batch the update trained on, not
the weights. The LoRA adapter at the start of step 1's update is its seeded initial state (B = 0, A drawn
from ``trainer.seed``), so the models built from ``run.ppo_config()`` hold exactly the weights that step 1's
first optimizer step started from. Every later optimizer step (mini-batch 1 of step 1, or any later step)
started from weights the run does not record; :func:`replay_actor_update` refuses those unless
``strict=False``, which replays them from the initial weights (a valid experiment, but not the run's state).

What runs is the trainer's own actor update, :meth:`ppolab.worker.Worker.update` — zero-grad → micro-batch
forward/backward with the global ``batch_num_tokens`` / ``global_batch_size`` → clip → step, and
``algos.ppo_loss`` — by an :class:`~ppolab.worker.ActorWorker` built from the recorded config: one mini-batch, one
epoch, ``SGD(lr=1)`` and ``clip_grad`` set huge, so the optimizer step is the plain gradient and
``update = −grad``. The settings are a changed *copy* of the recorded actor config; the weights are restored after
every replay. Nothing else of a trainer is built — no dataset, reward function or rollout engine — and the model
is loaded once per run (a few seconds), so a replay costs one update.

    out = replay_actor_update("grpo_tiny", micro_batch_size=1)
    out["grads"]          # list of tensors, one per actor parameter (the LoRA A/B matrices), shapes as the params
    out["micro_batches"]  # [[0], [1], ...] row positions inside the mini-batch, in execution order
    out["log_probs"]      # (M, R) log-probs the optimizer step saw; equal to the recorded actor_log_probs[0][rows]
"""
from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

import torch

from ppolab.algos.remove_padding import padded_slots
from ppolab.batch import Batch, trimmed_inputs
from ppolab.errors import flag_argument, whole_argument
from ppolab.run.reader import Run, cache_slot, resolve_run
from ppolab.update_plan import InferBatching, RankRows, UpdatePlan, forward_batching, plan_update, train_batching
from ppolab.worker import ActorWorker, ReferenceWorker, build_models

#: Sentinel: keep the run's own ``actor.loss_scale_factor`` (``None`` is a meaningful value of that field).
KEEP = object()
#: The gradient-clip threshold used in a replay: large enough never to clip.
NO_CLIP = 1e30

_MODELS: dict[str, Any] = {}
#: One replay at a time: a replay steps the run's shared models and puts their weights back, and an explorer's
#: background precompute may replay while a lab cell asks for another.
REPLAY_LOCK = threading.RLock()


def gradients(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of each parameter's ``.grad`` (zeros where a parameter got none)."""
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]


def restore(params: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
    """Put the shared models' weights back to ``saved`` and drop their gradients (after a replay stepped them)."""
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
            p.grad = None


def run_models(run: Run | str | os.PathLike | None = None):
    """The run's models (``PolicyModels``) at their seeded initial state, loaded once per run directory."""
    r = resolve_run(run)
    key = cache_slot(_MODELS, r.identity())  # another run at the same path has other models (config.json)
    if key not in _MODELS:
        _MODELS[key] = build_models(models_config(r))
    return _MODELS[key]


def models_config(run: Run):
    """The run's config with its model paths replaced by the directories :meth:`Run.model_path` finds by
    fingerprint — the recorded weights wherever the run was moved to, never a folder retrained in place (a new
    config; the run's own is not changed)."""
    cfg = run.ppo_config()
    arr = cfg.actor_rollout_ref
    model = dataclasses.replace(arr.model, path=str(run.model_path()))
    critic = cfg.critic
    if cfg.use_critic and critic.model.path:
        critic = dataclasses.replace(critic, model=dataclasses.replace(
            critic.model, path=str(run.model_path("critic.model.path"))))
    return dataclasses.replace(cfg, actor_rollout_ref=dataclasses.replace(arr, model=model), critic=critic)


def step_plan(run: Run | str | os.PathLike | None = None, step: int = 1) -> UpdatePlan:
    """The actor's update plan at recorded step ``step``: the one the worker recorded, or for a run recorded before
    plans were kept, the one :func:`ppolab.update_plan.plan_update` computes from the recorded batch
    (``plan.recorded`` tells which)."""
    return resolve_run(run).step(step).plan("actor")


def mini_batch_rows(run: Run | str | os.PathLike | None = None, step: int = 1, mini_batch: int = 0) -> list[int]:
    """Recorded row indices of mini-batch ``mini_batch`` in the first epoch — every rank's share, in the order
    the data loader gave them — read from the step's update plan (:func:`step_plan`)."""
    plan = step_plan(run, step)
    mini_batch = whole_argument("mini_batch", mini_batch, range(plan.steps_per_epoch),
                                f"a mini-batch of the first epoch of step {step}")
    return plan.steps[mini_batch].rows()


#: The most logits (rows × (R + 1) × vocab) the rows of one replay may hold in one micro-batch: 2^27 fp32 are 512 MiB,
#: and a replay's backward keeps their gradient too. The shipped runs (a 29-token vocabulary) are far below it; a
#: real vocabulary (151,936 tokens, 256-token responses) replays one group of rollout.n rows.
REPLAY_MAX_LOGITS = 1 << 27


def replay_rows(run: Run | str | os.PathLike | None = None, step: int = 1, mini_batch: int = 0,
                max_logits: int = REPLAY_MAX_LOGITS) -> list[int]:
    """The rows :func:`replay_actor_update` replays: :func:`mini_batch_rows`, or on a large run (its whole mini-batch
    in one micro-batch over ``max_logits`` logits) the first of them, a multiple of rollout.n (one group at least),
    so a replay's time and memory stay bounded. Every shipped run replays its whole mini-batch."""
    r = resolve_run(run)
    return _within(r, step, mini_batch_rows(r, step, mini_batch), max_logits)


def _within(r: Run, step: int, rows: list[int], max_logits: int) -> list[int]:
    """``rows``, or their first ones — a multiple of rollout.n, one group at least — whose logits fit ``max_logits``."""
    n = r.ppo_config().actor_rollout_ref.rollout.n
    per_row = (r.step(step).tensors["responses"].shape[1] + 1) * int(run_models(r).model.config.vocab_size)
    keep = max(n, max_logits // per_row // n * n)
    return rows[:keep] if keep < len(rows) else rows


#: What ``remove_padding`` of a replay chooses (its one-line error says so).
PACKING = "whether the forwards run on packed rows (True), padded (False) or as the run did (None)"


def replay_actor_update(run: Run | str | os.PathLike | None = None, step: int = 1, *,
                        micro_batch_size: int | None = None, use_dynamic_bsz: bool = False,
                        max_token_len: int | None = None, loss_agg_mode: str | None = None,
                        loss_scale_factor: Any = KEEP, mini_batch: int = 0, strict: bool = True,
                        loss_mode: str | None = None, remove_padding: bool | None = None) -> dict[str, Any]:
    """One optimizer step of the actor worker's update on the recorded rows of ``mini_batch`` of ``step``.

    Settings default to the run's own (``micro_batch_size=None`` → ``ppo_micro_batch_size_per_gpu``;
    ``max_token_len=None`` → ``ppo_max_token_len_per_gpu``; ``loss_scale_factor`` omitted → the run's value,
    ``None`` → the padded-width fallback; ``loss_mode=None`` → the run's ``policy_loss.loss_mode``, else another
    registered one, e.g. a learner's loss plugged in by ``ppolab.experiments.capstone_grade.plug_in``;
    ``remove_padding=None`` → the run's ``actor.use_remove_padding``, else packed (True) or padded (False) forwards,
    chapter §9). ``strict``: only
    step 1, mini-batch 0 replays the run's real state (module docstring); anything else raises ``ValueError`` unless
    ``strict=False``.

    Returns a dict: ``grads`` (list of tensors, one per actor parameter, the accumulated gradient of the
    mini-batch loss), ``update`` (weights after − before; = −grads with SGD lr = 1), ``metrics`` (the update's
    actor/* metrics), ``micro_batches`` (lists of positions 0 … M−1 in the mini-batch, execution order),
    ``rows`` (the recorded row index of each position), ``log_probs`` ((M, R) log-probs the forward of the
    optimizer step computed), ``seq_lens`` and ``response_lens`` (per position), ``widths`` (padded response
    width T of each micro-batch), ``exact`` and the resolved ``settings``. The rows are :func:`replay_rows`: the
    whole mini-batch (``mini_batch_rows`` rows), or on a large run only its first rows — say so where it shows.
    """
    r = resolve_run(run)
    step = whole_argument("step", step, None, "a recorded step's number")
    mini_batch = whole_argument("mini_batch", mini_batch, None, "a mini-batch of the first epoch")
    remove_padding = flag_argument("remove_padding", remove_padding, PACKING)
    if 1 not in r.steps:
        raise ValueError(f"{r.path} has no recorded step 1; only step 1 can be replayed from the seeded adapter")
    exact = step == 1 and mini_batch == 0
    if strict and not exact:
        raise ValueError(f"only the recorded step 1, mini-batch 0 started from weights a fresh trainer holds (the "
                         f"seeded initial adapter); step={step}, mini_batch={mini_batch} started from weights the run "
                         f"did not record. Pass strict=False to replay it from the initial weights anyway.")
    require_policy_loss(r, loss_mode)  # before any model loads
    rows, batch = _replay_batch(r, step, mini_batch)
    batch = Batch(dict(batch.tensors))  # a shallow copy: the batch cached for later replays is never written into
    cfg = r.ppo_config()
    a, n = _replay_config(r, len(rows), micro_batch_size, use_dynamic_bsz, max_token_len, loss_agg_mode,
                          loss_scale_factor, loss_mode, remove_padding)
    micro = None if a.use_dynamic_bsz else a.ppo_micro_batch_size_per_gpu
    settings = {"micro_batch_size": micro, "use_dynamic_bsz": a.use_dynamic_bsz,
                "max_token_len": a.ppo_max_token_len_per_gpu, "loss_agg_mode": a.loss_agg_mode,
                "loss_scale_factor": a.loss_scale_factor, "remove_padding": bool(a.use_remove_padding)}
    with REPLAY_LOCK:
        models = run_models(r)
        params = models.actor_parameters()
        before = [p.detach().clone() for p in params]
        worker = ActorWorker(a, models, temperature=cfg.actor_rollout_ref.rollout.temperature, rollout_n=n,
                             optimizer=torch.optim.SGD(params, lr=1.0))
        try:
            metrics, history, plan = worker.update(batch)
            grads = gradients(params)
            update = [p.detach() - b for p, b in zip(params, before)]
        finally:
            restore(params, before)
    r_lens = batch["response_mask"].sum(-1).long()
    parts = plan.steps[0].micro_batches[0]  # what the worker executed: positions (the replay batch's row_id)
    return {"grads": grads, "update": update, "metrics": metrics, "micro_batches": parts, "rows": rows,
            "mini_batch_rows": len(mini_batch_rows(r, step, mini_batch)),
            "log_probs": history["actor_log_probs"][0], "seq_lens": batch.seq_lens(), "response_lens": r_lens.tolist(),
            "widths": [max(int(r_lens[p].max()), 1) for p in parts], "exact": exact, "settings": settings,
            "plan_recorded": step_plan(r, step).recorded}


def replay_forward(run: Run | str | os.PathLike | None = None, *, micro_batch_size: int | None = None,
                   max_token_len: int | None = None, reference: bool = False,
                   max_logits: int = REPLAY_MAX_LOGITS, remove_padding: bool | None = None) -> dict[str, Any]:
    """Stage 4's π_old forward (``reference``: stage 5's π_ref) of recorded step 1, every row, rerun by the worker's
    own forward-only pass (:meth:`ppolab.worker.Worker.infer`, what ``PPOTrainer.compute_old_log_prob`` and
    ``compute_ref_log_prob`` call) at another micro-batching: ``micro_batch_size`` rows at a time, or packed by a
    token budget ``max_token_len`` — the knobs ``rollout.log_prob_micro_batch_size_per_gpu`` /
    ``log_prob_max_token_len_per_gpu`` and ``ref.log_prob_*`` (chapter §11.6). Both None: the run's own.
    ``remove_padding``: packed (True) or padded (False) forwards; None: the run's own (chapter §9).

    Step 1 only: its π_old is the seeded initial model, which :func:`run_models` holds (module docstring); π_ref is
    the frozen base at every step. Every row of the step, or on a large run the first ones whose logits fit
    ``max_logits`` (one group at least, as :func:`replay_rows`). Returns ``rows`` (the recorded row indices),
    ``log_probs`` (rows, R), ``recorded`` (the step's ``old_log_probs`` or ``ref_log_prob`` of those rows),
    ``response_mask``, ``micro_batches`` (positions in ``rows``, in execution order), ``packed`` (whether the
    forwards ran packed) and ``slots``: for each micro-batch, (token slots its padded forward computes — rows ×
    (longest prompt + longest response) —, slots of its packed rows, real tokens; §11.5's budgets count the real
    ones). No gradient is taken and no weight moves: a forward's batching and layout change its numbers at float
    rounding only."""
    remove_padding = flag_argument("remove_padding", remove_padding, PACKING)
    r = resolve_run(run)
    if 1 not in r.steps:
        raise ValueError(f"{r.path} has no recorded step 1; only step 1's π_old is the seeded initial model")
    cfg = r.ppo_config()
    key = "ref_log_prob" if reference else "old_log_probs"
    if key not in r.step(1).tensors:
        raise ValueError(f"{r.path}'s step 1 recorded no {key} (a run without "
                         f"{'a reference model' if reference else 'a recomputed π_old: bypass mode'})")
    rows = _within(r, 1, list(range(r.step(1).tensors["responses"].shape[0])), max_logits)
    batch = _rows_batch(r, 1, rows)
    side = cfg.actor_rollout_ref.ref if reference else cfg.actor_rollout_ref.rollout
    if micro_batch_size is not None and max_token_len is not None:
        raise ValueError("give micro_batch_size (fixed micro-batches) or max_token_len (packed by tokens), not both")
    batching = (forward_batching(side, len(batch)) if micro_batch_size is None and max_token_len is None
                else InferBatching(micro_batch_size, max_token_len))  # the run's own, as the trainer reads it
    temperature = cfg.actor_rollout_ref.rollout.temperature
    with REPLAY_LOCK:
        models = run_models(r)
        own = cfg.actor_rollout_ref.model if reference else cfg.actor_rollout_ref.actor
        packs = own.use_remove_padding if remove_padding is None else remove_padding
        worker = (ReferenceWorker(models, temperature=temperature, remove_padding=packs) if reference else
                  ActorWorker(None, models, temperature=temperature, remove_padding=packs))
        parts = worker.micro_batches(batch, batching)
        out = worker.infer(batch, batching)
    slots = []
    for part in parts:
        mask = trimmed_inputs(batch.select(part))[1]
        (padded, real), (packed, _) = padded_slots(mask), padded_slots(mask, packed=True)
        slots.append((padded, packed, real))
    return {"rows": rows, "log_probs": out["log_probs"], "recorded": batch[key],
            "response_mask": batch["response_mask"], "micro_batches": parts, "packed": bool(packs), "slots": slots}


def require_policy_loss(r: Run, loss_mode: str | None = None) -> None:
    """Refuse, in one line, a replay whose policy loss is not registered in this process: a run trained with a loss
    plugged in (``capstone_grade.plug_in``) opens anywhere, but its update replays only where that function is
    plugged in again — a run dir records the loss's name, never its code."""
    from ppolab.algos import POLICY_LOSS_REGISTRY

    mode = r.ppo_config().actor_rollout_ref.actor.policy_loss.loss_mode if loss_mode is None else loss_mode
    if mode in POLICY_LOSS_REGISTRY:
        return
    plug = f"ppolab.experiments.capstone_grade.plug_in(your_loss, {mode!r})"
    if loss_mode is None:
        raise ValueError(f"{r.path} was trained with the learner's policy loss {mode!r} "
                         f"(actor_rollout_ref.actor.policy_loss.loss_mode), which is not registered in this process "
                         f"(a plugged-in loss lives only in the process that plugged it in): plug it in again first "
                         f"— {plug} — then replay")
    raise ValueError(f"loss_mode={mode!r} is not registered in this process: plug your loss in first — {plug} — or "
                     f"choose one of {', '.join(POLICY_LOSS_REGISTRY)}")


_BATCHES: dict[tuple, tuple[list[int], Batch]] = {}


def _replay_batch(r: Run, step: int, mini_batch: int) -> tuple[list[int], Batch]:
    """The replayed rows and their batch (``row_id`` = local positions: the history is indexed by them), read
    once per run, step and mini-batch."""
    key = cache_slot(_BATCHES, r.identity(step), mini_batch)
    if key not in _BATCHES:
        rows = replay_rows(r, step, mini_batch)
        _BATCHES[key] = rows, _rows_batch(r, step, rows)
    return _BATCHES[key]


def _rows_batch(r: Run, step: int, rows: list[int]) -> Batch:
    """The recorded ``rows`` of ``step`` as a batch whose ``row_id`` are their positions (what a worker's plan and
    its outputs are indexed by)."""
    tensors = r.step(step).batch_tensors()
    tensors["is_pad"] = tensors["is_pad"].bool()
    batch = Batch(tensors).select(rows)
    batch["row_id"] = torch.arange(len(rows))
    return batch


def _replay_config(r: Run, n_rows: int, micro_batch_size, use_dynamic_bsz, max_token_len, loss_agg_mode,
                   loss_scale_factor, loss_mode=None, remove_padding=None):
    """(the replay's actor config: a changed copy of the recorded one, rollout.n)."""
    cfg = r.ppo_config()
    a, n = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.n
    if n_rows % n:
        raise ValueError(f"a mini-batch of {n_rows} rows is not a multiple of rollout.n={n}")
    changes: dict[str, Any] = {"ppo_epochs": 1, "shuffle": False, "ppo_mini_batch_size": n_rows // n,
                               "use_dynamic_bsz": bool(use_dynamic_bsz),
                               "optim": dataclasses.replace(a.optim, clip_grad=NO_CLIP)}  # one step, never clipped
    if micro_batch_size is not None:
        changes["ppo_micro_batch_size_per_gpu"] = int(micro_batch_size)
    if max_token_len is not None:
        changes["ppo_max_token_len_per_gpu"] = int(max_token_len)
    if loss_agg_mode is not None:
        changes["loss_agg_mode"] = loss_agg_mode
    if loss_scale_factor is not KEEP:
        changes["loss_scale_factor"] = loss_scale_factor
    if loss_mode is not None:
        changes["policy_loss"] = dataclasses.replace(a.policy_loss, loss_mode=loss_mode)
    if remove_padding is not None:
        changes["use_remove_padding"] = bool(remove_padding)
    return dataclasses.replace(a, **changes), n


def replay_partition(run: Run | str | os.PathLike | None = None, step: int = 1, *,
                     micro_batch_size: int | None = None, use_dynamic_bsz: bool = False,
                     max_token_len: int | None = None, mini_batch: int = 0) -> list[list[int]]:
    """The micro-batches (positions in the replayed rows, execution order) :func:`replay_actor_update` runs with
    these settings — the plan the worker would execute (:func:`ppolab.update_plan.plan_update`), without running
    the update."""
    r = resolve_run(run)
    rows, batch = _replay_batch(r, step, mini_batch)
    a, n = _replay_config(r, len(rows), micro_batch_size, use_dynamic_bsz, max_token_len, None, KEEP)
    return plan_update([RankRows.of(batch)], a, train_batching(a, "actor"), role="actor",
                       rollout_n=n).steps[0].micro_batches[0]


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """max over all parameters and entries of |a − b| (two ``grads`` or ``update`` lists)."""
    return max(float((x - y).abs().max()) for x, y in zip(a, b))
