"""Build ``ppolab/verl_versions.json``: which verl release's trainer config holds which key — what ``ppolab doctor
verl`` reads a job's verl version from (:mod:`ppolab.verl_versions`).

A job's ``.hydra/config.yaml`` holds every key of the composed ``ppo_trainer.yaml`` of the verl that wrote it; keys
come and go between releases (``trainer.use_legacy_worker_impl`` until 0.7.1, ``trainer.checkpoint_callback_class``
from 0.9.1). This reads each release's own composed configs from its wheel on PyPI — ``_generated_ppo_trainer.yaml``
and ``_generated_ppo_megatron_trainer.yaml`` (before 0.5: ``ppo_trainer.yaml`` and ``ppo_megatron_trainer.yaml``, which
were written out in full) — and keeps, for the groups both engines share (``trainer``, ``data``, ``algorithm``,
``actor_rollout_ref.rollout``, the reward groups), every key that is not in all of them, with the releases that have it
(runs of consecutive releases), and the keys all of them have (``common``).

    pip download --no-deps -d /tmp/verl-wheels verl==0.4.0 verl==0.4.1 … verl==0.9.1   # one command per version
    python tools/verl_versions.py /tmp/verl-wheels
"""
from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "ppolab" / "verl_versions.json"
#: The groups a FSDP job and a Megatron job share: the engine sections (actor, critic, ref) differ by strategy.
GROUPS = ("trainer.", "data.", "algorithm.", "actor_rollout_ref.rollout.", "reward_model.", "reward.",
          "custom_reward_function.")
CONFIGS = ("_generated_ppo_trainer.yaml", "_generated_ppo_megatron_trainer.yaml")
FULL_BEFORE_0_5 = ("ppo_trainer.yaml", "ppo_megatron_trainer.yaml")


def leaves(tree, prefix: str = ""):
    """Dotted keys of every leaf (a value that is not a non-empty mapping); Hydra's ``defaults`` list is not a key."""
    for k, v in tree.items():
        if k == "defaults":
            continue
        if isinstance(v, dict) and v:
            yield from leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def release_keys(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        files = [f"verl/trainer/config/{c}" for c in CONFIGS]
        if files[0] not in names:
            files = [f"verl/trainer/config/{c}" for c in FULL_BEFORE_0_5]
        keys = set()
        for f in files:
            if f in names:
                keys |= set(leaves(yaml.safe_load(z.read(f))))
    return {k for k in keys if k.startswith(GROUPS)}


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def spans(present: list[bool], versions: list[str]) -> str:
    """The releases a key is in, as runs of consecutive releases: ``"0.4.0-0.7.1"``, ``"0.5.0-0.6.1,0.9.0-0.9.1"``."""
    out, start = [], None
    for i, here in enumerate(present + [False]):
        if here and start is None:
            start = i
        elif not here and start is not None:
            out.append(f"{versions[start]}-{versions[i - 1]}")
            start = None
    return ",".join(out)


def main(folder: str) -> None:
    wheels = {re.match(r"verl-([\d.]+?)-py", w.name).group(1): w for w in Path(folder).glob("verl-*.whl")}
    versions = sorted(wheels, key=version_key)
    keys = {v: release_keys(wheels[v]) for v in versions}
    every = set.intersection(*keys.values())
    table = {k: spans([k in keys[v] for v in versions], versions)
             for k in sorted(set.union(*keys.values()) - every)}
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items()]
    OUT.write_text(f'{{"versions": {json.dumps(versions)},\n"groups": {json.dumps(list(GROUPS))},\n'
                   f'"common": {json.dumps(sorted(every))},\n"keys": {{\n' + ",\n".join(lines) + "\n}}\n")
    print(f"{OUT.relative_to(ROOT)}: {len(versions)} releases ({versions[0]} … {versions[-1]}), {len(table)} keys "
          f"that not every release has ({len(every)} that all have: common)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/verl-wheels")
