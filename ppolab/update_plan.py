"""The update plan: which rows each optimizer step, rank and micro-batch of a worker's update holds, and the global
counts each optimizer step's loss is normalised by — one value, computed once before the update runs (chapter §11–§13;
verl `TrainingWorker.train_mini_batch`, `prepare_micro_batches`, `rearrange_micro_batches`).

This is the only module that cuts a batch into mini-batches and micro-batches. The worker calls :func:`plan_update`
on every rank's rows (gathered once), executes exactly the plan it gets, and returns it; the recorder writes it into
the step record (``info["update_plans"][role]``); replay, the capstone, the numbers layer and the exercises read that
recorded value (:func:`recorded_plan`). A what-if (another budget, another micro-batch size) calls the same
:func:`plan_update` or :func:`micro_batches` on recorded rows.

    plan = recorded_plan(run.step(1), run.ppo_config(), "actor")
    plan.steps[k].micro_batches[rank]   # rank's micro-batches of optimizer step k, row ids of the recorded batch
    plan.steps[k].info()                # the GlobalBatchInfo its losses were normalised by
    plan.recorded                       # False: a run recorded before plans were kept, planned here from its batch

Row ids are positions in the step's balanced batch (``row_id``; rank r holds the r-th contiguous chunk, chapter §12.1).
Nothing here imports a model, the engine or a run: lengths and counts in, lists out.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ppolab.algos.aggregation import GlobalBatchInfo
from ppolab.batching import fixed_micro_batches, mini_batch_indices, plan_dynamic_micro_batches_dp

#: The key of the plans in a recorded step's info: ``info[PLANS_KEY][role]`` is :meth:`UpdatePlan.as_dict`.
PLANS_KEY = "update_plans"


@dataclass(frozen=True)
class InferBatching:
    """How a pass cuts its rows into micro-batches: a fixed micro-batch size, or token-budget packing with
    ``max_token_len`` when it is None (forward-only passes, and a worker's update: ``Worker.train_batching``)."""

    micro_batch_size: int | None
    max_token_len: int | None = None


@dataclass(frozen=True)
class RankRows:
    """What the planner needs of one data-parallel rank's rows: their ``row_id`` in the balanced batch, attended
    prompt and response lengths (``Batch.lengths``) and Σ loss_mask per row (the token-mean count)."""

    row_ids: list[int]
    prompt_lens: list[int]
    response_lens: list[int]
    loss_tokens: list[float]

    @staticmethod
    def of(batch: Any) -> RankRows:
        """The :class:`RankRows` of a ``ppolab.batch.Batch`` (its ``row_id`` when it has one, else 0 … N−1)."""
        n = len(batch)
        ids = batch["row_id"].tolist() if "row_id" in batch else list(range(n))
        prompt, response = batch.lengths()
        return RankRows([int(i) for i in ids], prompt, response, batch["loss_mask"].float().sum(-1).tolist())

    def select(self, positions: Sequence[int]) -> tuple[list[int], list[int]]:
        """(prompt lengths, response lengths) of the rows at ``positions``."""
        return [self.prompt_lens[i] for i in positions], [self.response_lens[i] for i in positions]


@dataclass(frozen=True)
class OptimizerStep:
    """One optimizer step of an update: its place (``epoch``, ``mini_batch`` within the epoch), every rank's share
    of the mini-batch in the order its data loader gave the rows (``shares[rank]`` = row ids), the micro-batches
    in execution order (``micro_batches[rank][m]`` = row ids), and the global counts its micro-batch losses are
    divided by (:class:`~ppolab.algos.GlobalBatchInfo`, computed before the micro-batch loop, §13)."""

    epoch: int
    mini_batch: int
    shares: list[list[int]]
    micro_batches: list[list[list[int]]]
    batch_num_tokens: float
    global_batch_size: int
    dp_size: int
    loss_scale_factor: float | None

    def info(self) -> GlobalBatchInfo:
        """The counts as the losses take them."""
        return GlobalBatchInfo(dp_size=self.dp_size, batch_num_tokens=self.batch_num_tokens,
                               global_batch_size=self.global_batch_size, loss_scale_factor=self.loss_scale_factor)

    def rows(self, rank: int | None = None) -> list[int]:
        """Row ids this step trained on — every rank's share (rank 0's first) or one rank's — in loader order."""
        return [i for share in (self.shares if rank is None else [self.shares[rank]]) for i in share]


@dataclass(frozen=True)
class UpdatePlan:
    """Everything one worker update executes: ``steps`` in order (``ppo_epochs`` × mini-batches per epoch), for the
    ``role`` ("actor" or "critic") on ``dp_size`` ranks of ``rows_per_rank`` rows each, with the batching that cut
    them. ``recorded``: read from the step record (True), or planned from a recorded batch by this module for a run
    recorded before plans were kept, or for a what-if (False)."""

    role: str
    dp_size: int
    rows_per_rank: int
    local_mini_batch: int
    ppo_epochs: int
    micro_batch_size: int | None
    max_token_len: int | None
    steps: list[OptimizerStep]
    recorded: bool = False

    @property
    def steps_per_epoch(self) -> int:
        return len(self.steps) // max(self.ppo_epochs, 1)

    def note(self) -> str:
        """One line saying where the plan comes from (a reader shows it when the plan was not recorded)."""
        if self.recorded:
            return "the update plan the worker recorded"
        return ("the update plan computed from the recorded batch by ppolab.update_plan.plan_update (this run was "
                "recorded before plans were kept, or the settings are a what-if)")

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: what the recorder writes into ``info["update_plans"][role]``."""
        return {"role": self.role, "dp_size": self.dp_size, "rows_per_rank": self.rows_per_rank,
                "local_mini_batch": self.local_mini_batch, "ppo_epochs": self.ppo_epochs,
                "micro_batch_size": self.micro_batch_size, "max_token_len": self.max_token_len,
                "steps": [{"epoch": s.epoch, "mini_batch": s.mini_batch, "shares": s.shares,
                           "micro_batches": s.micro_batches,
                           "batch_num_tokens": s.batch_num_tokens, "global_batch_size": s.global_batch_size,
                           "dp_size": s.dp_size, "loss_scale_factor": s.loss_scale_factor} for s in self.steps]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> UpdatePlan:
        """Inverse of :meth:`as_dict` (``recorded=True``)."""
        steps = [OptimizerStep(int(s["epoch"]), int(s["mini_batch"]), [[int(i) for i in sh] for sh in s["shares"]],
                               [[[int(i) for i in mb] for mb in micro] for micro in s["micro_batches"]],
                               float(s["batch_num_tokens"]), int(s["global_batch_size"]), int(s["dp_size"]),
                               s["loss_scale_factor"]) for s in d["steps"]]
        return UpdatePlan(d["role"], int(d["dp_size"]), int(d["rows_per_rank"]), int(d["local_mini_batch"]),
                          int(d["ppo_epochs"]), d["micro_batch_size"], d["max_token_len"], steps, recorded=True)


# ---------------------------------------------------------------------------------------------------- planning
def micro_batches(batch: Any, micro_batch_size: int | None, max_token_len: int | None, *,
                  dp_lengths: Sequence[tuple[list[int], list[int]]] | None = None, rank: int = 0) -> list[list[int]]:
    """Positions (0 … len(batch)−1) of each micro-batch of ``batch`` (anything with ``__len__`` and
    ``lengths()``, e.g. a ``ppolab.batch.Batch``): fixed chunks of ``micro_batch_size`` rows (verl
    `forward_backward_batch`), or token-budget partitions when it is None (§11.5, verl `rearrange_micro_batches`).

    ``dp_lengths``: every data-parallel rank's ``lengths()`` of its share of the same mini-batch (this rank's at
    ``rank``); then the dynamic count is agreed over the ranks as verl's engine does
    (:func:`~ppolab.batching.plan_dynamic_micro_batches_dp`). None: this batch alone (one rank)."""
    if micro_batch_size is not None:
        return fixed_micro_batches(len(batch), micro_batch_size)
    if dp_lengths is None:
        dp_lengths, rank = [batch.lengths()], 0
    return _dynamic(dp_lengths, max_token_len)[rank]


def _dynamic(dp_lengths: Sequence[tuple[list[int], list[int]]], max_token_len: int | None) -> list[list[list[int]]]:
    return plan_dynamic_micro_batches_dp([[p + r for p, r in zip(*lens)] for lens in dp_lengths], max_token_len)


def plan_update(ranks: Sequence[RankRows], config: Any, batching: InferBatching, *, role: str,
                rollout_n: int) -> UpdatePlan:
    """The plan of one worker update (verl `TrainingWorker.train_mini_batch`), for every rank at once.

    ``ranks[r]``: rank r's rows (:class:`RankRows`, equal counts); ``config``: the role's config slice
    (``ppo_mini_batch_size``, ``ppo_epochs``, ``shuffle``, ``data_loader_seed``, ``loss_scale_factor``);
    ``batching``: how a mini-batch is cut (``Worker.train_batching``); ``rollout_n``: responses per prompt.

    Rank r cuts its rows into local mini-batches of ``ppo_mini_batch_size × n / dp`` rows for ``ppo_epochs`` epochs
    (shuffled by a DataLoader seeded with ``data_loader_seed + r`` when ``shuffle``); optimizer step k takes every
    rank's k-th local mini-batch. Its ``batch_num_tokens`` is Σ loss_mask over those rows on all ranks (the worker's
    all-reduce), its ``global_batch_size`` ppo_mini_batch_size × n rows (padding rows counted), and each rank's share
    is cut into micro-batches — a fixed size, or the token budget with the count agreed over the ranks.
    """
    dp = len(ranks)
    if dp == 0 or len({len(r.row_ids) for r in ranks}) != 1:
        counts = [len(r.row_ids) for r in ranks]
        raise ValueError(f"every data-parallel rank needs the same number of rows; got {counts}")
    n_rows = len(ranks[0].row_ids)
    local = config.ppo_mini_batch_size * rollout_n // dp
    minis = [[m for epoch in mini_batch_indices(n_rows, local, config.ppo_epochs, config.shuffle,
                                                config.data_loader_seed + rank) for m in epoch]
             for rank in range(dp)]
    per_epoch = n_rows // local
    steps = []
    for k in range(len(minis[0])):
        shares = [minis[rank][k] for rank in range(dp)]  # positions in each rank's rows
        if batching.micro_batch_size is not None:
            cuts = [fixed_micro_batches(len(s), batching.micro_batch_size) for s in shares]
        else:
            cuts = _dynamic([ranks[rank].select(s) for rank, s in enumerate(shares)], batching.max_token_len)
        tokens = sum(ranks[rank].loss_tokens[i] for rank, s in enumerate(shares) for i in s)
        steps.append(OptimizerStep(
            epoch=k // per_epoch, mini_batch=k % per_epoch,
            shares=[[ranks[rank].row_ids[i] for i in shares[rank]] for rank in range(dp)],
            micro_batches=[[[ranks[rank].row_ids[shares[rank][i]] for i in mb] for mb in cuts[rank]]
                           for rank in range(dp)],
            batch_num_tokens=float(tokens), global_batch_size=config.ppo_mini_batch_size * rollout_n, dp_size=dp,
            loss_scale_factor=config.loss_scale_factor))
    return UpdatePlan(role, dp, n_rows, local, config.ppo_epochs, batching.micro_batch_size, batching.max_token_len,
                      steps)


# ---------------------------------------------------------------------------------------------------- recorded runs
def plan_problem(plan: UpdatePlan, n_rows: int) -> str | None:
    """Why ``plan`` cannot be the plan a worker executed on a batch of ``n_rows`` rows, or None: each optimizer step
    holds ``dp_size`` shares of ``local_mini_batch`` rows, every row id in range, none twice in one step or one
    epoch, and its micro-batches hold exactly its share's rows (none left out, none added) — what the planner
    guarantees, so a recorded plan that breaks it was edited or damaged."""
    if plan.dp_size < 1 or plan.local_mini_batch < 1:
        return f"has dp_size={plan.dp_size} and local_mini_batch={plan.local_mini_batch} (both at least 1)"
    seen: dict[int, set[int]] = {}
    for k, s in enumerate(plan.steps):
        where = f"optimizer step {k}"
        if len(s.shares) != plan.dp_size or len(s.micro_batches) != plan.dp_size:
            return (f"gives {where} {len(s.shares)} shares and {len(s.micro_batches)} ranks of micro-batches, not "
                    f"dp_size={plan.dp_size}")
        rows = s.rows()
        bad = [i for i in rows if not 0 <= i < n_rows]
        if bad:
            return f"lists row {bad[0]} in {where}, outside the step's {n_rows} rows (0 … {n_rows - 1})"
        twice = sorted(i for i, c in Counter(rows).items() if c > 1)
        if twice:
            return f"lists row {twice[0]} twice in {where}"
        for rank, (share, micro) in enumerate(zip(s.shares, s.micro_batches)):
            if len(share) != plan.local_mini_batch:
                return (f"gives rank {rank} {len(share)} rows in {where}, not local_mini_batch="
                        f"{plan.local_mini_batch}")
            cut = [i for mb in micro for i in mb]
            if sorted(cut) != sorted(share):
                missing = sorted(set(share) - set(cut))
                extra = sorted(set(cut) - set(share)) or sorted(i for i, c in Counter(cut).items() if c > 1)
                return (f"cuts rank {rank}'s share of {where} into micro-batches that "
                        + (f"leave out row {missing[0]}" if missing else f"hold row {extra[0]} again or instead"))
        epoch = seen.setdefault(s.epoch, set())
        again = sorted(epoch & set(rows))
        if again:
            return f"lists row {again[0]} in two optimizer steps of epoch {s.epoch}"
        epoch.update(rows)
    return None


def _checked(record: Any, role: str, recorded: Any) -> UpdatePlan:
    """The recorded plan of ``role``, checked against its own step (:func:`plan_problem`); a plan that does not
    parse or does not fit is a ``ppolab.errors.FileFormatError`` naming the step's file."""
    from ppolab.errors import FileFormatError

    where = getattr(record, "info_file", f"the record of step {getattr(record, 'step', '?')}")
    todo = "put back the step's own file, or re-record the run (python -m ppolab.train with a new trainer.run_dir)"
    try:
        plan = UpdatePlan.from_dict(recorded)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise FileFormatError(f"{where}: its {PLANS_KEY}.{role} does not parse as an update plan "
                              f"({type(e).__name__}: {e}); {todo}") from None
    rows = record.tensors["responses"].shape[0] if "responses" in record.tensors else None
    problem = plan_problem(plan, rows) if rows is not None else None
    if problem:
        raise FileFormatError(f"{where}: its {PLANS_KEY}.{role} {problem} — not the plan the worker executed; {todo}")
    return plan



def train_batching(config: Any, role: str) -> InferBatching:
    """How the ``role``'s update cuts a mini-batch, from the role's config slice ``config`` — the actor: its fixed
    ``ppo_micro_batch_size_per_gpu``, or its ``ppo_max_token_len_per_gpu`` budget when ``use_dynamic_bsz``; the
    critic: the engine's ``ppo_infer_max_token_len_per_gpu`` budget for its value forward and its update alike (verl
    V1 `trainer_base.py` writes that one key into the engine, which keeps ``use_dynamic_bsz=True``; the top-level
    ``critic.use_dynamic_bsz``, ``ppo_micro_batch_size_per_gpu`` and ``ppo_max_token_len_per_gpu`` never reach it:
    chapter §8, §11.6)."""
    if role == "actor":
        return InferBatching(None if config.use_dynamic_bsz else config.ppo_micro_batch_size_per_gpu,
                             config.ppo_max_token_len_per_gpu)
    if role == "critic":
        return InferBatching(None, config.ppo_infer_max_token_len_per_gpu)
    raise ValueError(f"role={role!r}: an update plan belongs to 'actor' or 'critic'")


def forward_batching(config: Any, n_rows: int) -> InferBatching:
    """How a forward-only pass cuts its ``n_rows`` rows, from its config slice — ``rollout`` for π_old (stage 4),
    ``ref`` for π_ref (stage 5): ``log_prob_micro_batch_size_per_gpu`` rows at a time (all of them when unset), or
    packed by ``log_prob_max_token_len_per_gpu`` when ``log_prob_use_dynamic_bsz`` (chapter §11.6)."""
    micro = None if config.log_prob_use_dynamic_bsz else config.log_prob_micro_batch_size_per_gpu or n_rows
    return InferBatching(micro, config.log_prob_max_token_len_per_gpu)


def role_config(cfg: Any, role: str) -> Any:
    """The role's config slice of the full config ``cfg``: ``actor_rollout_ref.actor`` or ``critic``."""
    if role not in ("actor", "critic"):
        raise ValueError(f"role={role!r}: an update plan belongs to 'actor' or 'critic'")
    return cfg.actor_rollout_ref.actor if role == "actor" else cfg.critic


def recorded_rank_rows(tensors: Any, dp_size: int) -> list[RankRows]:
    """Every rank's :class:`RankRows` of a recorded step's tensors: rank r held the r-th contiguous chunk of the
    balanced batch, whose ``row_id`` is its position (chapter §12.1)."""
    t = tensors
    attention = t["response_attention_mask"] if "response_attention_mask" in t else t["response_mask"]
    prompt = t["prompt_mask"].long().sum(-1).tolist()
    response = attention.long().sum(-1).tolist()
    loss = (t["loss_mask"] if "loss_mask" in t else t["response_mask"]).float().sum(-1).tolist()
    n = len(prompt)
    if n % dp_size:
        raise ValueError(f"a recorded batch of {n} rows does not split over dp_size={dp_size} ranks")
    chunk = n // dp_size
    return [RankRows(list(range(r * chunk, (r + 1) * chunk)), prompt[r * chunk:(r + 1) * chunk],
                     response[r * chunk:(r + 1) * chunk], loss[r * chunk:(r + 1) * chunk]) for r in range(dp_size)]


def recorded_plan(record: Any, cfg: Any, role: str = "actor", *, batching: InferBatching | None = None,
                  config: Any = None) -> UpdatePlan:
    """The plan the worker executed at a recorded step (``record``: a ``ppolab.run.step.StepRecord``; ``cfg``: the
    run's config), read from ``record.info["update_plans"][role]`` — or, for a run recorded before plans were kept,
    computed once from the recorded batch by :func:`plan_update` (``recorded=False``; :meth:`UpdatePlan.note`).

    ``batching`` / ``config`` (a changed role config): a what-if — the same planner on the recorded rows."""
    plans = record.info.get(PLANS_KEY) or {}
    if batching is None and config is None and role in plans:
        return _checked(record, role, plans[role])
    dp = int(record.info.get("dp_size") or (record.info.get("batch_plan") or {}).get("dp_size") or 1)
    config = config or role_config(cfg, role)
    return plan_update(recorded_rank_rows(record.tensors, dp), config, batching or train_batching(config, role),
                       role=role, rollout_n=cfg.actor_rollout_ref.rollout.n)
