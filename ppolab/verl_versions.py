"""Which verl release wrote a job's config, read from its keys — and where that release's update differs from
0.9.1's, which ppolab follows.

A verl job's ``.hydra/config.yaml`` holds every key of the ``ppo_trainer.yaml`` its verl composed, and keys come and
go between releases: ``trainer.use_legacy_worker_impl`` exists in 0.5.0–0.7.1, ``data.continuous_token`` only in
0.9.0, ``trainer.checkpoint_callback_class`` from 0.9.1. ``verl_versions.json`` (built from each release's wheel by
``tools/verl_versions.py``) lists, for the groups a FSDP and a Megatron job share, every key that not all releases
from 0.4.0 to 0.9.1 have, with the releases that have it. A job's releases are those that hold all its listed keys;
a full composition names one release, a hand-written YAML a range.

The one update difference the doctor states: until 0.7.1 ``trainer.use_legacy_worker_impl=auto`` (the default) ran
the legacy ``workers/actor/dp_actor.py``, whose ``token-mean`` is each micro-batch's own token mean, scaled by
``1 / gradient_accumulation`` (rows / ``ppo_mini_batch_size`` with dynamic batching) — micro-batches weighted by their
rows, not their tokens. From 0.8.0 the engine workers divide every micro-batch's token sum by the mini-batch's global
token count (``workers/utils/losses.py``: ``batch_num_tokens``), as ppolab does (chapter §10.1, lab 13).
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, NamedTuple


@functools.cache
def table() -> dict[str, Any]:
    return json.loads((Path(__file__).with_name("verl_versions.json")).read_text(encoding="utf-8"))


def release_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def has_release(spans: str, release: str) -> bool:
    return any(release_key(a) <= release_key(release) <= release_key(b)
               for a, b in (s.split("-") for s in spans.split(",") if s))


class VerlVersion(NamedTuple):
    """``releases``: those from 0.4.0 to 0.9.1 whose composed config holds every versioned key the job has (oldest
    first; empty: none does); ``evidence``: the keys that bound the range, as ``(key, "from" | "until", release)``;
    ``unknown``: keys of the shared groups that no release up to 0.9.1 has (a newer verl, or keys added with ``+``);
    ``legacy_workers``: the job's update ran verl's legacy workers (see the module's docstring)."""
    releases: tuple[str, ...]
    evidence: tuple[tuple[str, str, str], ...]
    unknown: tuple[str, ...]
    legacy_workers: bool

    @property
    def span(self) -> str:
        if not self.releases:
            return ""
        first, last = self.releases[0], self.releases[-1]
        return first if first == last else f"{first}–{last}"


def _leaves(tree: Any, prefix: str = ""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            if isinstance(v, dict) and v:
                yield from _leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"


def _own_key(key: str, t: dict[str, Any], common: set[str]) -> str | None:
    """The key of the table ``key`` falls under: itself or its longest prefix that a release lists (a release's YAML
    may hold ``rollout.mtp`` as one interpolated value where a composed job holds ``rollout.mtp.enable``)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        k = ".".join(parts[:n])
        if k in t["keys"] or k in common:
            return k
    return None


def job_version(raw: dict[str, Any]) -> VerlVersion:
    """The releases whose config keys ``raw`` (a verl job's config as plain dicts) fits, as :class:`VerlVersion`."""
    t = table()
    common = set(t["common"])
    keys = [k for k in _leaves(raw) if k.startswith(tuple(t["groups"]))]
    own = {k: _own_key(k, t, common) for k in keys}
    versioned = sorted({o for o in own.values() if o in t["keys"]})
    releases = tuple(r for r in t["versions"] if all(has_release(t["keys"][k], r) for k in versioned))
    unknown = tuple(k for k, o in own.items() if o is None)
    evidence = []
    if versioned:
        spans = {k: [r for r in t["versions"] if has_release(t["keys"][k], r)] for k in versioned}
        newest_first = max(versioned, key=lambda k: (release_key(spans[k][0]), -len(k)))
        oldest_last = min(versioned, key=lambda k: (release_key(spans[k][-1]), len(k)))
        if spans[newest_first][0] != t["versions"][0]:
            evidence.append((newest_first, "from", spans[newest_first][0]))
        if spans[oldest_last][-1] != t["versions"][-1]:
            evidence.append((oldest_last, "until", spans[oldest_last][-1]))
    legacy_setting = str((raw.get("trainer") or {}).get("use_legacy_worker_impl", "auto"))
    legacy = bool(releases) and all(release_key(r) < (0, 8) for r in releases) and legacy_setting != "disable"
    return VerlVersion(releases, tuple(evidence), unknown, legacy)
