"""Parity of ppolab's dynamic micro-batch planner with verl 0.9.1's own ``rearrange_micro_batches``
(``verl/utils/seqlen_balancing.py``): the count and the partitions of every rank, on 240 random cases of one to four
data-parallel ranks, with and without ``min_num_micro_batch`` and ``num_batches_divided_by``.

Skipped unless verl's source is found. verl's module is loaded from its file with its three verl imports stubbed
(``DataProto``, ``tensordict_utils``, ``get_device_name``: none of them touches the planning), so verl's heavy
``__init__`` never runs and an unpacked wheel is enough::

    pip download verl==0.9.1 --no-deps -d /tmp/verl091 && (cd /tmp/verl091 && unzip -q verl-0.9.1-py3-none-any.whl)
    PYTHONPATH=/tmp/verl091 .venv/bin/python -m pytest tests/parity/test_verl_parity_batching.py -q -n0

Several ranks run verl's function in threads of their own, with a ``torch.distributed`` stand-in whose
``all_reduce`` reduces over the threads (the MAX of the count, then the MIN of "every partition fits"), as the
DP group does.
"""
from __future__ import annotations

import importlib.util
import random
import sys
import threading
import types
from pathlib import Path

import pytest
import torch

from ppolab.batching import plan_dynamic_micro_batches_dp
from ppolab.update_plan import micro_batches

_SPEC = importlib.util.find_spec("verl")
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("verl's source is not on the path (see the module docstring)", allow_module_level=True)
SOURCE = Path(list(_SPEC.submodule_search_locations)[0]) / "utils" / "seqlen_balancing.py"


class _Group:
    """The ranks of one case: each all_reduce waits for every rank, reduces, and hands the result back."""

    def __init__(self, n: int):
        self.n, self.values = n, [None] * n
        self.barrier = threading.Barrier(n, timeout=20)
        self.local = threading.local()


class _Dist:
    """What verl's function calls of ``torch.distributed``, for the ranks of a :class:`_Group` (one per thread)."""

    ReduceOp = types.SimpleNamespace(MAX="max", MIN="min")

    def __init__(self):
        self.group: _Group | None = None

    def is_initialized(self) -> bool:
        return self.group is not None and self.group.n > 1

    def all_reduce(self, tensor, op, group=None):
        g = self.group
        rank = g.local.rank
        g.values[rank] = tensor.clone()
        g.barrier.wait()
        stacked = torch.stack(g.values)
        reduced = stacked.max(0).values if op == "max" else stacked.min(0).values
        g.barrier.wait()  # every rank has read before the next all_reduce writes
        tensor.copy_(reduced)


@pytest.fixture(scope="module")
def verl_seqlen():
    """verl's seqlen_balancing module, loaded from its file with its verl imports stubbed."""
    stubs = {"verl": types.ModuleType("verl"), "verl.utils": types.ModuleType("verl.utils"),
             "verl.protocol": types.ModuleType("verl.protocol"),
             "verl.utils.tensordict_utils": types.ModuleType("verl.utils.tensordict_utils"),
             "verl.utils.device": types.ModuleType("verl.utils.device")}
    stubs["verl.protocol"].DataProto = object
    stubs["verl.utils.tensordict_utils"].index_select_tensor_dict = lambda batch, idx: list(idx)
    stubs["verl.utils.device"].get_device_name = lambda: "cpu"
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location("verl_seqlen_balancing_091", SOURCE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    module.dist = _Dist()
    return module


def verl_plan(V, rank_lens, budget, min_num=None, divided_by=None):
    """verl's ``micro_bsz_idx`` of every rank, or the exception a rank raised."""
    group = _Group(len(rank_lens))
    V.dist.group = group
    out, errors = [None] * len(rank_lens), []

    def run(rank):
        group.local.rank = rank
        lens = rank_lens[rank]
        width = max(lens)
        mask = torch.zeros(len(lens), width, dtype=torch.long)
        for i, n in enumerate(lens):
            mask[i, :n] = 1
        batch = {"input_ids": torch.zeros(len(lens), width, dtype=torch.long), "attention_mask": mask}
        try:
            _, idx = V.rearrange_micro_batches(batch, budget, dp_group=object(), num_batches_divided_by=divided_by,
                                               min_num_micro_batch=min_num)
            out[rank] = idx
        except (ValueError, AssertionError, threading.BrokenBarrierError) as e:
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(rank_lens))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors[0] if errors else out


def cases(n: int = 240):
    rng = random.Random(91)
    for _ in range(n):
        dp = rng.choice([1, 1, 2, 2, 3, 4])
        rows = rng.randint(1, 24)
        longest = rng.randint(4, 300)
        rank_lens = [[rng.randint(1, longest) for _ in range(rows)] for _ in range(dp)]
        top = max(max(lens) for lens in rank_lens)
        total = max(sum(lens) for lens in rank_lens)
        budget = rng.randint(top, max(top, total // rng.choice([1, 2, 3, 5, 8])))
        min_num = rng.choice([None, None, None, 1, 2, 3])
        divided_by = rng.choice([None, None, None, 2, 3])
        yield rank_lens, budget, min_num, divided_by


class _Rows:
    """A rank's rows as the worker's planner sees them: ``lengths()`` = (prompt lengths, response lengths)."""

    def __init__(self, prompts, responses):
        self.prompts, self.responses = prompts, responses

    def __len__(self):
        return len(self.prompts)

    def lengths(self):
        return self.prompts, self.responses


def test_the_planner_cuts_what_verl_cuts(verl_seqlen):
    """Both the planner and the worker's path to it (``update_plan.micro_batches`` on prompt and response lengths,
    as every rank gathers them): verl's partitions, count and order, or an error where verl raises."""
    rng = random.Random(7)
    agreed = raised = via_worker = 0
    for rank_lens, budget, min_num, divided_by in cases():
        theirs = verl_plan(verl_seqlen, rank_lens, budget, min_num, divided_by)
        if isinstance(theirs, BaseException):
            with pytest.raises(ValueError):
                plan_dynamic_micro_batches_dp(rank_lens, budget, min_num, divided_by)
            raised += 1
            continue
        ours = plan_dynamic_micro_batches_dp(rank_lens, budget, min_num, divided_by)
        assert ours == theirs, (rank_lens, budget, min_num, divided_by)
        agreed += 1
        if min_num is None and divided_by is None:  # the worker's path: a row = a prompt and a response
            split = [[rng.randint(1, n - 1) if n > 1 else 1 for n in lens] for lens in rank_lens]
            dp_lengths = [([p for p in ps], [n - p if n > 1 else 0 for n, p in zip(lens, ps)])
                          for lens, ps in zip(rank_lens, split)]
            for rank, (ps, rs) in enumerate(dp_lengths):
                got = micro_batches(_Rows(ps, rs), None, budget, dp_lengths=dp_lengths, rank=rank)
                assert got == theirs[rank], (dp_lengths, budget, rank)
            via_worker += 1
    assert agreed >= 200 and agreed + raised == 240 and via_worker >= 60, (agreed, raised, via_worker)


def test_the_stand_in_reduces_over_the_ranks(verl_seqlen):
    """The threads really agree a count: a rank of short rows alone would cut one micro-batch; with a peer of long
    rows it cuts as many as the peer (verl's all_reduce MAX)."""
    short, long_ = [3, 3, 3, 3], [40, 40, 40, 40]
    alone = verl_plan(verl_seqlen, [short], 50)
    together = verl_plan(verl_seqlen, [short, long_], 50)
    assert len(alone[0]) == 1 and len(together[0]) == len(together[1]) == 4
