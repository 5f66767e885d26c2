"""Chapter §13's numbers: replays of the actor update, cached for the whole process."""
from __future__ import annotations

from typing import Any

from ppolab.record import resolve_run
from ppolab.replay import replay_actor_update, replay_rows  # noqa: F401 (replay_rows: the rows replayed)


#: Replays shared by every explorer of this process: (run dir, step, mode, factor, micro label, budget) → replay.
_CACHE: dict[tuple, dict[str, Any]] = {}


def cached_replay(run=None, step: int = 1, *, loss_agg_mode: str, loss_scale_factor: float | None,
                  micro_batch_size: int | None = None, max_token_len: int | None = None,
                  compute: bool = True) -> dict[str, Any] | None:
    """``replay_actor_update`` of step ``step`` with a fixed micro-batch size, or dynamic packing with the token
    budget ``max_token_len`` (``micro_batch_size=None``), cached for the whole process: the explorer, the lab's
    cells and the exercise checks share every replay (the update is deterministic). ``compute=False``: the cached
    replay or None, without computing one. A large run replays the first rows of the mini-batch only
    (:func:`ppolab.replay.replay_rows`; ``out["rows"]`` against ``out["mini_batch_rows"]``)."""
    r = resolve_run(run)
    dyn = micro_batch_size is None
    if dyn == (max_token_len is None):
        raise ValueError("give either micro_batch_size (fixed micro-batches) or max_token_len (dynamic), not both")
    label = DYNAMIC if dyn else int(micro_batch_size)
    key = (str(r.path.resolve()), step, loss_agg_mode, loss_scale_factor, label, max_token_len if dyn else None)
    if key not in _CACHE:
        if not compute:
            return None
        _CACHE[key] = replay_actor_update(r, step, micro_batch_size=None if dyn else label, use_dynamic_bsz=dyn,
                                          max_token_len=max_token_len, loss_agg_mode=loss_agg_mode,
                                          loss_scale_factor=loss_scale_factor)
    return _CACHE[key]


def divisors(n: int) -> list[int]:
    """The micro-batch sizes that cut ``n`` rows into equal micro-batches."""
    return [d for d in range(1, n + 1) if n % d == 0]


DYNAMIC = "dynamic"
