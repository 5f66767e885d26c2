"""Chapter §13's numbers: replays of the actor update, cached for the whole process.

A replay is a deterministic function of what the worker runs: the loss_agg_mode, the loss_scale_factor where
that mode reads it (``algos.SCALED_MODES``) and the micro-batches in execution order. So the cache is keyed on
exactly that (:func:`replay_key`): two token budgets that pack the rows the same way, or two factors under a mode
that ignores the factor, share one replay — the update they would run is the same one.
"""
from __future__ import annotations

from typing import Any

from ppolab.algos import SCALED_MODES
from ppolab.config import LOSS_AGG_MODES
from ppolab.run.reader import cache_slot, resolve_run
from ppolab.replay import REPLAY_LOCK, replay_actor_update, replay_partition, replay_rows  # noqa: F401

#: Replays shared by every explorer of this process: :func:`replay_key` → replay.
_CACHE: dict[tuple, dict[str, Any]] = {}

DYNAMIC = "dynamic"


def replay_key(run=None, step: int = 1, *, loss_agg_mode: str, loss_scale_factor: float | None,
               micro_batch_size: int | None = None, max_token_len: int | None = None) -> tuple:
    """What decides a replay's result: (run dir, step, mode, the factor if the mode reads it, dynamic or fixed, the
    micro-batches in execution order)."""
    r = resolve_run(run)
    dyn = micro_batch_size is None
    if dyn == (max_token_len is None):
        raise ValueError("give either micro_batch_size (fixed micro-batches) or max_token_len (dynamic), not both")
    parts = replay_partition(r, step, micro_batch_size=micro_batch_size, use_dynamic_bsz=dyn,
                             max_token_len=max_token_len)
    factor = loss_scale_factor if loss_agg_mode in SCALED_MODES else None
    # the run's identity (its path and the stamps of the files read): a run replaced at that path is another key
    return cache_slot(_CACHE, r.identity(step), loss_agg_mode, factor, dyn, tuple(tuple(p) for p in parts))


def cached_replay(run=None, step: int = 1, *, loss_agg_mode: str, loss_scale_factor: float | None,
                  micro_batch_size: int | None = None, max_token_len: int | None = None,
                  compute: bool = True) -> dict[str, Any] | None:
    """``replay_actor_update`` of step ``step`` with a fixed micro-batch size, or dynamic packing with the token
    budget ``max_token_len`` (``micro_batch_size=None``), cached for the whole process under :func:`replay_key`:
    the explorer, its background precompute, the lab's cells and the exercise checks share every replay.
    ``compute=False``: the cached replay or None, without computing one. A large run replays the first rows of the
    mini-batch only (:func:`ppolab.replay.replay_rows`; ``out["rows"]`` against ``out["mini_batch_rows"]``).
    Thread-safe: one replay runs at a time (``REPLAY_LOCK``) and none is computed twice."""
    r = resolve_run(run)
    key = replay_key(r, step, loss_agg_mode=loss_agg_mode, loss_scale_factor=loss_scale_factor,
                     micro_batch_size=micro_batch_size, max_token_len=max_token_len)
    if key in _CACHE or not compute:
        return _CACHE.get(key)
    with REPLAY_LOCK:
        if key not in _CACHE:  # another thread may have computed it while this one waited
            dyn = micro_batch_size is None
            _CACHE[key] = replay_actor_update(r, step, micro_batch_size=micro_batch_size, use_dynamic_bsz=dyn,
                                              max_token_len=max_token_len, loss_agg_mode=loss_agg_mode,
                                              loss_scale_factor=loss_scale_factor)
    return _CACHE[key]


def divisors(n: int) -> list[int]:
    """The micro-batch sizes that cut ``n`` rows into equal micro-batches."""
    return [d for d in range(1, n + 1) if n % d == 0]


def distinct_budgets(run=None, step: int = 1, budgets: range | list[int] = ()) -> list[int]:
    """One token budget per distinct dynamic packing among ``budgets`` (the first budget of each): the budgets a
    precompute must replay so that every budget of the range is cached."""
    seen, out = set(), []
    for b in budgets:
        parts = tuple(tuple(p) for p in replay_partition(run, step, use_dynamic_bsz=True, max_token_len=b))
        if parts not in seen:
            seen.add(parts)
            out.append(b)
    return out


def every_setting(run=None, step: int = 1, *, sizes: list[int], budgets: list[int],
                  factors: list[float | None], first: tuple[str, float | None] | None = None) -> list[dict]:
    """Every (mode, factor, micro-batching) an explorer can be set to, as ``cached_replay`` keyword dicts, one per
    distinct replay: the factors only under the modes that read them, one budget per distinct packing. ``first``:
    the (mode, factor) to put first (the explorer's current one), then the other modes at that factor, then the
    rest."""
    combos: list[tuple[str, float | None]] = []
    for mode in LOSS_AGG_MODES:
        for f in (factors if mode in SCALED_MODES else [None]):
            combos.append((mode, f))
    if first is not None:
        mode, f = first
        head = (mode, f if mode in SCALED_MODES else None)
        combos.sort(key=lambda c: (c != head, c[0] in SCALED_MODES and c[1] != f))  # stable: mode order kept
    out = []
    for mode, f in combos:
        out += [{"loss_agg_mode": mode, "loss_scale_factor": f, "micro_batch_size": s} for s in sizes]
        out += [{"loss_agg_mode": mode, "loss_scale_factor": f, "max_token_len": b} for b in budgets]
    return out
