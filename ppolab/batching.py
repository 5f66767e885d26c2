"""Batch arithmetic of the PPO update: batch → mini-batch → micro-batch (chapter §11–§12, verl V1 `trainer_base.py`).

Everything here is pure index bookkeeping (no model, no transformers), so the trainer and the lab widgets can
share it:

* :func:`plan_batches` / :class:`BatchPlan` — the derived sizes of chapter §11.4 as one readable table.
* :func:`karmarkar_karp`, :func:`get_seqlen_balanced_partitions`, :func:`calculate_workload` — verl's
  largest-differencing partitioner (verl `karmarkar_karp`), tie-breaks included, so partitions match verl's.
* :func:`balance_partitions`, :func:`balance_metrics` — the trainer's DP balance stage (verl V1
  `trainer_base.py`, stage 3).
* :func:`plan_dynamic_micro_batches`, :func:`plan_dynamic_micro_batches_dp`, :func:`restore_order` —
  ``use_dynamic_bsz`` micro-batches (verl `rearrange_micro_batches`, 0.9.1), on one rank or agreed over the ranks.
* :func:`mini_batch_indices`, :func:`fixed_micro_batches` — the worker's mini-batch iterator (verl
  `TrainingWorker.train_mini_batch`) and the fixed micro-batch split (verl `forward_backward_batch`).
"""
from __future__ import annotations

import heapq
import html
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

IntSeq = Sequence[int] | np.ndarray | torch.Tensor  # any 1-D integer sequence

# ----------------------------------------------------------------------------------------------------------------
# 1. The plan (chapter §11.1–§11.4, §12.2)
# ----------------------------------------------------------------------------------------------------------------


def _check_positive(name: str, value: object) -> None:
    # bool is an int subclass; True as a batch size is always a bug.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class NotDivisible(ValueError):
    """A plan's division that does not come out even: ``str()`` is the English line; the fields let a report say it
    in another language (the doctor's ``--zh``)."""

    def __init__(self, num_label: str, num: int, den_label: str, den: int):
        super().__init__(f"{num_label} = {num} is not divisible by {den_label} = {den}")
        self.num_label, self.num, self.den_label, self.den = num_label, num, den_label, den


def _check_divides(num_label: str, num: int, den_label: str, den: int) -> None:
    if num % den != 0:
        raise NotDivisible(num_label, num, den_label, den)


@dataclass(frozen=True)
class BatchPlan:
    """Every size derived from the batching config of one training step (chapter §11.4; verl
    `TrainingWorker.train_mini_batch`, `forward_backward_batch`).

    Counts are trajectories (rows) unless the name says prompts. Micro fields are ``None`` under dynamic
    batching (``ppo_micro_batch_size_per_gpu=None``), where the token budget decides the micro-batches (§11.5).
    """

    train_batch_size: int  # prompts per training step (data.train_batch_size)
    rollout_n: int  # trajectories per prompt (rollout.n)
    ppo_mini_batch_size: int  # prompt-equivalents per optimizer step (the trainer multiplies by n)
    dp_size: int  # data-parallel ranks
    ppo_micro_batch_size_per_gpu: int | None  # rows per micro-batch per rank; None = dynamic
    ppo_epochs: int  # passes over the batch per training step
    n_trajectories: int  # train_batch_size × n
    global_mini_batch: int  # ppo_mini_batch_size × n: rows per optimizer step, all ranks together
    local_mini_batch: int  # global_mini_batch / dp_size: rows per optimizer step on one rank
    micro_batch_wave: int | None  # micro × dp_size: rows in one forward/backward wave over all ranks
    micro_batches_per_mini: int | None  # local_mini / micro: gradient-accumulation waves per step
    optimizer_steps_per_epoch: int  # n_trajectories / global_mini_batch
    optimizer_steps: int  # per training step = steps_per_epoch × ppo_epochs
    rows_per_rank: int  # (n_trajectories + padding_rows) / dp_size: rows each rank holds after the balance stage
    padding_rows: int = 0  # synthetic rows the balance stage adds so the step divides (verl `padding_utils.py`)

    @property
    def dynamic(self) -> bool:
        """True when micro-batches come from the token budget (``use_dynamic_bsz``) rather than a fixed size."""
        return self.ppo_micro_batch_size_per_gpu is None

    def as_dict(self) -> dict:
        """All inputs and derived numbers as a plain dict (JSON-friendly)."""
        return asdict(self)

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, formula with numbers, value) rows shared by ``__str__`` and ``_repr_html_``."""
        p, n, m, d, e = (self.train_batch_size, self.rollout_n, self.ppo_mini_batch_size, self.dp_size,
                         self.ppo_epochs)
        b = self.ppo_micro_batch_size_per_gpu
        out = [
            ("prompts per step", "data.train_batch_size", str(p)),
            ("trajectories", f"train_batch_size × n = {p} × {n}", str(self.n_trajectories)),
            ("global mini-batch", f"ppo_mini_batch_size × n = {m} × {n}", str(self.global_mini_batch)),
            ("local mini-batch (per rank)", f"global mini-batch / dp_size = {self.global_mini_batch} / {d}",
             str(self.local_mini_batch)),
        ]
        rows = self.n_trajectories + self.padding_rows
        if self.padding_rows:
            out.append(("synthetic padding rows", f"up to a multiple of lcm(dp_size, global mini-batch): "
                        f"{self.n_trajectories} → {rows}", str(self.padding_rows)))
        rows_text = f"({self.n_trajectories} + {self.padding_rows})" if self.padding_rows else str(rows)
        out.append(("rows per rank", f"trajectories / dp_size = {rows_text} / {d}", str(self.rows_per_rank)))
        if b is None:
            out += [
                ("global micro-batch wave", "dynamic: ppo_max_token_len_per_gpu decides", "—"),
                ("accumulation waves per mini-batch", "dynamic: ceil(tokens / max_token_len) or more", "—"),
            ]
        else:
            out += [
                ("global micro-batch wave", f"ppo_micro_batch_size_per_gpu × dp_size = {b} × {d}",
                 str(self.micro_batch_wave)),
                ("accumulation waves per mini-batch",
                 f"local mini-batch / micro = {self.local_mini_batch} / {b} (= {self.global_mini_batch} / "
                 + f"{self.micro_batch_wave})", str(self.micro_batches_per_mini)),
            ]
        out += [
            ("optimizer steps per epoch",
             f"trajectories / global mini-batch = {rows_text} / {self.global_mini_batch}",
             str(self.optimizer_steps_per_epoch)),
            ("optimizer steps per training step",
             f"steps per epoch × ppo_epochs = {self.optimizer_steps_per_epoch} × {e}", str(self.optimizer_steps)),
        ]
        return out

    def __str__(self) -> str:
        rows = [("quantity", "formula", "value")] + self.rows()
        w0, w1, w2 = (max(len(r[i]) for r in rows) for i in range(3))
        lines = [f"{a:<{w0}} | {f:<{w1}} | {v:>{w2}}" for a, f, v in rows]
        lines.insert(1, f"{'-' * w0}-+-{'-' * w1}-+-{'-' * w2}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        body = "".join(
            f"<tr><td>{esc(a)}</td><td><code>{esc(f)}</code></td><td style='text-align:right'><b>{esc(v)}</b>"
            "</td></tr>" for a, f, v in self.rows())
        return ("<table class='ppolab-batchplan'><thead><tr><th>quantity</th><th>formula</th><th>value</th>"
                f"</tr></thead><tbody>{body}</tbody></table>")


def plan_batches(train_batch_size: int, rollout_n: int, ppo_mini_batch_size: int, dp_size: int,
                 ppo_micro_batch_size_per_gpu: int | None, ppo_epochs: int, *, pad_to: int | None = None) -> BatchPlan:
    """Derive every batch size of one training step (chapter §11.1–§11.4, §12.2; verl `TrainingWorker.train_mini_batch`,
    `forward_backward_batch`).

    N = train_batch_size·n trajectories; global mini = ppo_mini_batch_size·n (the trainer multiplies by n,
    §11.2); local mini = global mini / dp; micro wave = micro·dp; accumulation waves = local mini / micro;
    optimizer steps = (N / global mini)·ppo_epochs. ``ppo_micro_batch_size_per_gpu=None`` means dynamic
    batching (micro fields are ``None``). Example (§11.4): ``plan_batches(128, 8, 32, 8, 2, 2)`` gives
    1024 / 256 / 32 / 16 / 16 / 4 / 8.

    Raises ``ValueError`` naming the field for non-positive values, and naming both quantities and their
    numbers when a division is not exact. ``pad_to`` (the trainer passes :func:`padding_multiple`) plans what
    verl's V1 trainer does instead: N is padded with ``padding_rows`` = (−N) mod pad_to synthetic rows (verl
    `padding_utils.py::upsample_batch_to_divisible_size`) and the padded batch is split; without it the planner
    reports the mismatch so a lab or config check can show it.
    """
    for name, value in (("train_batch_size", train_batch_size), ("rollout.n", rollout_n),
                        ("ppo_mini_batch_size", ppo_mini_batch_size), ("dp_size", dp_size),
                        ("ppo_epochs", ppo_epochs)):
        _check_positive(name, value)
    if ppo_micro_batch_size_per_gpu is not None:
        _check_positive("ppo_micro_batch_size_per_gpu", ppo_micro_batch_size_per_gpu)
    n_traj = train_batch_size * rollout_n
    global_mini = ppo_mini_batch_size * rollout_n
    padding = 0
    if pad_to is None:
        _check_divides("train_batch_size × rollout.n", n_traj, "ppo_mini_batch_size × rollout.n", global_mini)
    else:
        _check_positive("pad_to", pad_to)
        _check_divides("pad_to", pad_to, "ppo_mini_batch_size × rollout.n", global_mini)
        padding = (-n_traj) % pad_to
    # TrainingWorker asserts this one (verl `TrainingWorker.train_mini_batch`): every rank must get the same local
    # mini-batch.
    _check_divides("ppo_mini_batch_size × rollout.n", global_mini, "dp_size", dp_size)
    local_mini = global_mini // dp_size
    wave = per_mini = None
    if ppo_micro_batch_size_per_gpu is not None:
        _check_divides("local mini-batch (ppo_mini_batch_size × rollout.n / dp_size)", local_mini,
                       "ppo_micro_batch_size_per_gpu", ppo_micro_batch_size_per_gpu)
        wave = ppo_micro_batch_size_per_gpu * dp_size
        per_mini = local_mini // ppo_micro_batch_size_per_gpu
    steps_per_epoch = (n_traj + padding) // global_mini
    return BatchPlan(
        train_batch_size=train_batch_size, rollout_n=rollout_n, ppo_mini_batch_size=ppo_mini_batch_size,
        dp_size=dp_size, ppo_micro_batch_size_per_gpu=ppo_micro_batch_size_per_gpu, ppo_epochs=ppo_epochs,
        n_trajectories=n_traj, global_mini_batch=global_mini, local_mini_batch=local_mini,
        micro_batch_wave=wave, micro_batches_per_mini=per_mini, optimizer_steps_per_epoch=steps_per_epoch,
        optimizer_steps=steps_per_epoch * ppo_epochs, rows_per_rank=(n_traj + padding) // dp_size,
        padding_rows=padding)


def padding_multiple(dp_size: int, *global_mini_batches: int) -> int:
    """What the balance stage pads a step's rows to: lcm(dp_size, actor mini×n, critic mini×n when there is a
    critic) (verl V1 `trainer_base.py::_balance_batch`, chapter §9)."""
    return math.lcm(dp_size, *global_mini_batches)


# ----------------------------------------------------------------------------------------------------------------
# 2. Karmarkar–Karp (verl `karmarkar_karp`)
# ----------------------------------------------------------------------------------------------------------------


def _as_list(values: IntSeq) -> list:
    return values.tolist() if isinstance(values, (torch.Tensor, np.ndarray)) else list(values)


def calculate_workload(seq_lens: IntSeq) -> torch.Tensor:
    """Relative compute cost of each sequence: ``24576·L + L²`` as int64, shape (B,) (verl V1 `trainer_base.py`,
    `rearrange_micro_batches`).

    The linear term is the dense-layer FLOPs of a 7B model (12·4096²·L scaled), the quadratic one attention;
    int64 because L² overflows int32 for long contexts.
    """
    lens = torch.as_tensor(seq_lens if isinstance(seq_lens, torch.Tensor) else _as_list(seq_lens))
    lens = lens.to(torch.int64)
    return 24576 * lens + lens * lens


class _Bin:
    """One growing partition: running total plus (index, value) items in insertion order."""

    __slots__ = ("items", "total")

    def __init__(self) -> None:
        self.total = 0
        self.items: list[tuple[int, int]] = []

    def absorb(self, other: _Bin) -> None:
        self.items.extend(other.items)
        self.total += other.total

    def key(self) -> tuple:
        # verl's order: by sum, then by item count, then by the item list itself. Items hold distinct indices,
        # so two non-empty bins never tie — this makes every heap pop (and hence the result) deterministic.
        return self.total, len(self.items), self.items

    def __lt__(self, other: _Bin) -> bool:
        return self.key() < other.key()


#: One shared, never-mutated empty bin: a seed state holds k bins of which at most one (or k with equal_size) is
#: non-empty, and allocating the empty ones dominated the run time for many partitions.
_EMPTY = _Bin()


class _State:
    """A k-way partial partition. Bins are kept in descending order (largest first)."""

    __slots__ = ("bins",)

    def __init__(self, bins: list[_Bin]) -> None:
        self.bins = sorted(bins, key=_Bin.key, reverse=True)  # a key sort compares in C: k = 64 bins stay fast

    @property
    def spread(self) -> int:
        return self.bins[0].total - self.bins[-1].total

    def merge(self, other: _State) -> None:
        # Pair our largest bin with their smallest, and so on: this is the "differencing" step of LDM.
        k = len(self.bins)
        for i in range(k):
            src = other.bins[k - 1 - i]
            if not src.items:  # absorbing an empty bin changes nothing
                continue
            if self.bins[i] is _EMPTY:  # the shared empty bin is never mutated: give this slot its own
                self.bins[i] = _Bin()
            self.bins[i].absorb(src)
        self.bins.sort(key=_Bin.key, reverse=True)

    def __lt__(self, other: _State) -> bool:
        # heapq is a min-heap, so "smaller" = popped first: largest spread first, ties → largest top bin.
        if self.spread != other.spread:
            return self.spread > other.spread
        return other.bins[0] < self.bins[0]


def karmarkar_karp(seqlen_list: IntSeq, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Largest-differencing (Karmarkar–Karp) k-way partition of item indices (verl `karmarkar_karp`).

    Items are sorted ascending by (value, index). With ``equal_size`` each consecutive block of k sorted items
    seeds one state (one item per bin), so every partition ends with len/k items; otherwise every item seeds
    its own state. The heap repeatedly pops the two states with the largest spread (ties: larger top bin),
    merges them largest-with-smallest and pushes the result back. Returns k index lists in the final state's
    bin order (largest sum first), indices in insertion order — use :func:`get_seqlen_balanced_partitions`
    for sorted, checked partitions.
    """
    _check_positive("k_partitions", k_partitions)
    values = _as_list(seqlen_list)
    if equal_size and len(values) % k_partitions != 0:
        raise ValueError(f"equal_size needs len(seqlen_list) = {len(values)} divisible by "
                         f"k_partitions = {k_partitions}")
    order = sorted((v, i) for i, v in enumerate(values))
    heap: list[_State] = []
    step = k_partitions if equal_size else 1
    for start in range(0, len(order), step):
        seeds = order[start:start + step]
        bins = [_Bin() for _ in seeds] + [_EMPTY] * (k_partitions - len(seeds))
        for b, (v, i) in zip(bins, seeds):
            b.items.append((i, v))
            b.total += v
        heapq.heappush(heap, _State(bins))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    return [[i for i, _ in b.items] for b in heap[0].bins] if heap else [[] for _ in range(k_partitions)]


def get_seqlen_balanced_partitions(seqlen_list: IntSeq, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Karmarkar–Karp partitions with each partition's indices sorted ascending (verl `karmarkar_karp`).

    Needs ``len(seqlen_list) ≥ k_partitions``; asserts (as verl does) that no partition is empty and that every
    index 0..len-1 appears exactly once.
    """
    _check_positive("k_partitions", k_partitions)
    n = len(_as_list(seqlen_list))
    if n < k_partitions:
        raise ValueError(f"number of items {n} < k_partitions {k_partitions}")
    parts = karmarkar_karp(seqlen_list, k_partitions, equal_size)
    assert len(parts) == k_partitions, f"{len(parts)} partitions != {k_partitions}"
    assert all(len(p) > 0 for p in parts), "a partition is empty"
    flat = sorted(i for p in parts for i in p)
    assert flat == list(range(n)), "partitions do not cover every index exactly once"
    return [sorted(p) for p in parts]


# ----------------------------------------------------------------------------------------------------------------
# 3. DP balance stage of the trainer (verl V1 `trainer_base.py` stage 3)
# ----------------------------------------------------------------------------------------------------------------


def balance_partitions(seq_lens: IntSeq, dp_size: int) -> list[list[int]]:
    """Split a step batch of B rows into ``dp_size`` equal-count partitions balanced on workload (verl V1
    `trainer_base.py`).

    KK with ``equal_size=True`` on ``calculate_workload(L)`` (L = prompt+response length, shape (B,)); each
    partition is index-sorted. The trainer reorders the batch as ``partition0 ‖ partition1 ‖ …`` and rank k gets
    the k-th contiguous chunk. B must be a multiple of dp_size (V1 pads with synthetic rows first, chapter §9; verl
    `padding_utils.py`).
    """
    _check_positive("dp_size", dp_size)
    lens = _as_list(seq_lens)
    _check_divides("number of rows", len(lens), "dp_size", dp_size)
    return get_seqlen_balanced_partitions(calculate_workload(lens).tolist(), dp_size, equal_size=True)


def balance_metrics(seq_lens: IntSeq, partitions: list[list[int]], prefix: str = "global_seqlen") -> dict:
    """verl's ``global_seqlen/{min,max,minmax_diff,balanced_min,balanced_max,mean}`` (verl V1 `trainer_base.py` stage
    3).

    Interpretation (verl's ``log_seqlen_unbalance``, as the V1 trainer calls it): the metrics use TOKEN counts
    L, not workloads, although the partitions were balanced on workload. ``min``/``max``/``minmax_diff`` are
    over the per-rank token sums of the *unbalanced* split — contiguous chunks of B // k rows in the incoming
    order, i.e. what each rank would have got without balancing; ``balanced_min``/``balanced_max`` are over the
    given partitions; ``mean`` = ΣL / k (k = number of partitions). As in verl, if B is not a multiple of k the
    short trailing chunk counts as one more unbalanced "rank".
    """
    lens = [int(x) for x in _as_list(seq_lens)]
    k = len(partitions)
    chunk = len(lens) // k
    raw = [sum(lens[o:o + chunk]) for o in range(0, len(lens), chunk)]
    balanced = [sum(lens[i] for i in p) for p in partitions]
    return {
        f"{prefix}/min": min(raw),
        f"{prefix}/max": max(raw),
        f"{prefix}/minmax_diff": max(raw) - min(raw),
        f"{prefix}/balanced_min": min(balanced),
        f"{prefix}/balanced_max": max(balanced),
        f"{prefix}/mean": sum(raw) / k,
    }


# ----------------------------------------------------------------------------------------------------------------
# 4. Dynamic micro-batches (chapter §11.5; verl `rearrange_micro_batches`, verl 0.9.1)
# ----------------------------------------------------------------------------------------------------------------


def plan_dynamic_micro_batches(seq_lens: IntSeq, max_token_len: int, min_num_micro_batch: int | None = None,
                               num_batches_divided_by: int | None = None) -> list[list[int]]:
    """Index lists of the ``use_dynamic_bsz`` micro-batches of one local mini-batch (verl `rearrange_micro_batches`,
    0.9.1), on one data-parallel rank; several ranks: :func:`plan_dynamic_micro_batches_dp`.

    ``seq_lens`` (B,) are effective lengths; ``max_token_len`` = ppo_max_token_len_per_gpu × sp_size.
    num_micro = min(B, ceil(ΣL / max_token_len)), then max(·, min_num_micro_batch), then rounded up to a
    multiple of num_batches_divided_by. Rows are split by KK (equal_size=False) on workload; 0.9.1's loop then adds
    micro-batches (one, or num_batches_divided_by, at a time) until every micro-batch's token sum ≤ max_token_len.
    Micro-batches are sorted by descending workload sum (ties: first index), then reordered evens-reversed + odds so
    the smallest sit at both ends (pipeline warm-up and cool-down). Indices inside a micro-batch are ascending. Undo
    the order with :func:`restore_order`.

    The budget bounds the *token sum*, as in verl, which removes padding. ppolab pads a micro-batch to its own
    longest prompt and response, so it may hold more token slots than the budget; it does not cut more
    micro-batches for that (the count, the partitions and every per-micro-batch metric stay verl's); the forward
    bounds its memory inside the micro-batch instead, where a large vocabulary makes it matter
    (``ppolab.models.forward_response``: log-probs and entropy a slice of positions at a time, inference passes a few
    rows at a time).
    """
    lens = [int(x) for x in _as_list(seq_lens)]
    if not lens:
        raise ValueError("seq_lens is empty")
    return plan_dynamic_micro_batches_dp([lens], max_token_len, min_num_micro_batch, num_batches_divided_by)[0]


def plan_dynamic_micro_batches_dp(rank_seq_lens: Sequence[IntSeq], max_token_len: int,
                                  min_num_micro_batch: int | None = None,
                                  num_batches_divided_by: int | None = None) -> list[list[list[int]]]:
    """Every data-parallel rank's ``use_dynamic_bsz`` micro-batches, ``[rank][micro-batch] → row indices``, with the
    count agreed over the ranks as verl's engine does (`rearrange_micro_batches` with a dp_group and
    ``same_micro_num_in_dp=True``, 0.9.1): the first count is the MAX over the ranks (all_reduce MAX), and the fit
    loop adds micro-batches on every rank until every rank's partitions fit (all_reduce MIN of "within the budget").
    So every rank runs as many micro-batches, and a rank with short rows may cut finer than it would alone.

    ``rank_seq_lens[r]`` are rank r's effective lengths; the rest as :func:`plan_dynamic_micro_batches` (which is
    this with one rank). The worker all-gathers its peers' lengths and takes its own rank's plan.
    """
    ranks = [[int(x) for x in _as_list(lens)] for lens in rank_seq_lens]
    if not ranks or not all(ranks):
        raise ValueError("seq_lens is empty")
    _check_positive("ppo_max_token_len_per_gpu", max_token_len)
    longest = max(max(lens) for lens in ranks)
    if max_token_len < longest:
        raise ValueError(f"ppo_max_token_len_per_gpu (× sp) = {max_token_len} is smaller than the longest "
                         f"sequence, {longest} tokens")
    rows = min(len(lens) for lens in ranks)  # verl: the fewest rows (groups) of any rank bound the count
    counts = []
    for lens in ranks:
        n = min(len(lens), math.ceil(sum(lens) / max_token_len))
        counts.append(n if min_num_micro_batch is None else max(n, min_num_micro_batch))
    num_micro = max(counts)  # all_reduce MAX over the DP group
    if num_batches_divided_by is not None:
        _check_positive("num_batches_divided_by", num_batches_divided_by)
        num_micro = -(-num_micro // num_batches_divided_by) * num_batches_divided_by
    if num_micro > rows:
        raise ValueError(f"{num_micro} micro-batches requested (min_num_micro_batch / num_batches_divided_by"
                         f"{' / another rank' if len(ranks) > 1 else ''}) but only {rows} rows")

    def fits(k: int, part: list[int]) -> bool:
        return sum(ranks[k][i] for i in part) <= max_token_len

    workloads = [calculate_workload(lens).tolist() for lens in ranks]
    step = num_batches_divided_by or 1  # verl keeps the count a multiple of the VPP size while it retries
    while True:
        plans = [get_seqlen_balanced_partitions(w, num_micro, equal_size=False) for w in workloads]
        # KK balances workload, not tokens, so a partition can overshoot the token budget; 0.9.1 retries with
        # more micro-batches — on every rank while any rank overshoots. It always ends: at num_micro = B every
        # partition is one row, whose length is ≤ max_token_len.
        if all(fits(k, part) for k, parts in enumerate(plans) for part in parts):
            break
        if num_micro + step > rows:
            raise ValueError(f"cannot keep every micro-batch within ppo_max_token_len_per_gpu = {max_token_len} "
                             f"with {rows} rows in steps of {step}")
        num_micro += step
    out = []
    for k, parts in enumerate(plans):
        parts.sort(key=lambda p: (sum(workloads[k][i] for i in p), p[0]), reverse=True)
        out.append(parts[::2][::-1] + parts[1::2])
    return out


def restore_order(micro_indices: list[list[int]]) -> list[int]:
    """Inverse permutation of the concatenated micro-batch indices (verl `rearrange_micro_batches`, verl
    ``restore_dynamic_batch``).

    If ``y = cat([x[idx] for idx in micro_indices])`` then ``y[restore_order(micro_indices)] == x``.
    """
    flat = [i for part in micro_indices for i in part]
    inverse = [0] * len(flat)
    for pos, i in enumerate(flat):
        inverse[i] = pos
    return inverse


# ----------------------------------------------------------------------------------------------------------------
# 5. Mini-batches and fixed micro-batches inside a worker (chapter §12.2–§12.3; verl `TrainingWorker.train_mini_batch`,
# `forward_backward_batch`)
# ----------------------------------------------------------------------------------------------------------------


def mini_batch_indices(n_rows: int, mini_batch_size: int, epochs: int, shuffle: bool = False,
                       seed: int | None = None) -> list[list[list[int]]]:
    """Row indices of every mini-batch, per epoch: result[e][j] is mini-batch j of epoch e (verl
    `TrainingWorker.train_mini_batch`).

    ``n_rows`` = rows on this rank, ``mini_batch_size`` = local mini-batch (global mini / dp). Without shuffle:
    contiguous slices in order, the same every epoch. With shuffle: the same torch ``DataLoader`` over
    ``arange(n_rows)`` that verl's ``make_iterator`` builds (RandomSampler with ``torch.Generator`` seeded with
    ``seed`` — verl passes data_loader_seed + dp_rank — afresh on every call). Epoch e uses the e-th permutation
    that loader draws from the one generator, so the same permutations recur every training step. (The loader
    also draws a base seed from the generator each epoch, which is why we iterate a real DataLoader rather than
    calling ``randperm`` ourselves.)
    """
    from torch.utils.data import DataLoader  # local import: only this function needs it

    _check_positive("n_rows", n_rows)
    _check_positive("mini_batch_size", mini_batch_size)
    _check_positive("epochs", epochs)
    _check_divides("n_rows", n_rows, "mini_batch_size", mini_batch_size)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    loader = DataLoader(torch.arange(n_rows), batch_size=mini_batch_size, shuffle=shuffle, generator=generator,
                        collate_fn=lambda rows: [int(r) for r in rows])
    # Re-iterating the one loader each epoch advances the shared generator, as verl's epoch loop does.
    return [[batch for batch in loader] for _ in range(epochs)]


def fixed_micro_batches(n_rows: int, micro_batch_size: int) -> list[list[int]]:
    """Contiguous micro-batches of ``micro_batch_size`` rows, in order (verl `forward_backward_batch`,
    ``use_dynamic_bsz=False``).

    ``n_rows`` = local mini-batch rows. If it is not a multiple, the last micro-batch is shorter
    (:func:`plan_batches` rejects such configs up front).
    """
    _check_positive("n_rows", n_rows)
    _check_positive("ppo_micro_batch_size_per_gpu", micro_batch_size)
    return [list(range(s, min(s + micro_batch_size, n_rows))) for s in range(0, n_rows, micro_batch_size)]


def total_steps(trainer_cfg, steps_per_epoch: int) -> int:
    """When the run stops: ``total_training_steps`` or ``total_epochs`` passes over the data (``steps_per_epoch`` =
    ⌊prompts / train_batch_size⌋), whichever comes first — verl's outer loop over epochs returning at the step
    limit."""
    limits = [trainer_cfg.total_training_steps] if trainer_cfg.total_training_steps is not None else []
    if trainer_cfg.total_epochs is not None:
        limits.append(trainer_cfg.total_epochs * steps_per_epoch)
    return min(limits)
