"""``ppolab doctor verl``'s stops against verl 0.9.1's own ``utils/config.py::validate_config``, run on the same
configs: on random batch settings (batch, n, GPUs, mini- and micro-batches fixed or dynamic, with and without a
critic or a reference) the doctor stops wherever verl's ``validate_config`` raises, and quotes verl's own words;
where ``validate_config`` passes, the doctor stops only on what verl's workers assert at their first update, and
cites the file.

verl's ``validate_config`` instantiates the workers' config dataclasses through Hydra and loads the critic's model
config, so this needs verl installed with its dependencies (``pip install -e ".[verl]"``: ``.ci/run``'s verl phase)
and points the models at the shipped tiny model. Skipped otherwise."""
from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import pytest

from ppolab.course import DATA
from ppolab.doctor import diagnose, read_verl_config, verl_verdict

_SPEC = importlib.util.find_spec("verl")
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("verl's source is not on the path (see .ci/run's verl phase)", allow_module_level=True)
try:
    import ray  # noqa: F401 — verl/__init__.py imports protocol.py, which imports ray and tensordict
    import tensordict  # noqa: F401
except ImportError as e:
    pytest.skip(f"verl's validate_config needs {e.name} to import (pip install -e '.[verl]')",
                allow_module_level=True)

DEFAULT = Path(next(iter(_SPEC.submodule_search_locations))) / "trainer" / "config" / "_generated_ppo_trainer.yaml"
TINY = str(DATA / "models" / "tiny-arith")
MODELS = [f"actor_rollout_ref.model.path={TINY}", f"critic.model.path={TINY}", f"critic.model.tokenizer_path={TINY}"]
N_CASES = 150
#: Where verl 0.9.1 asserts what ``validate_config`` leaves out: the local mini-batch (mini × n / dp) and its cut
#: into micro-batches, both at a worker's first update — the doctor's stop cites the file and function.
WORKER_ASSERTS = ("workers/engine_workers.py::TrainingWorker.train_mini_batch",
                  "workers/engine/utils.py::prepare_micro_batches")


def case(rng: random.Random) -> list[str]:
    """One random verl command line's batch settings: about half of them break one of verl's checks."""
    pick = rng.choice
    actor, critic = "actor_rollout_ref.actor", "critic"
    out = [f"data.train_batch_size={pick([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 60, 64])}",
           f"actor_rollout_ref.rollout.n={pick([1, 2, 3, 4, 8])}",
           f"trainer.n_gpus_per_node={pick([1, 2, 3, 4, 8])}", f"trainer.nnodes={pick([1, 1, 1, 2])}",
           f"{actor}.ppo_mini_batch_size={pick([1, 2, 4, 8, 16, 32, 64])}",
           f"{critic}.ppo_mini_batch_size={pick([1, 2, 4, 8, 16, 32, 64])}",
           f"algorithm.adv_estimator={pick(['gae', 'grpo'])}",
           f"{actor}.use_kl_loss={pick([True, False])}", f"algorithm.use_kl_in_reward={pick([True, False])}"]
    dynamic = rng.random() < 0.2
    out += [f"{actor}.use_dynamic_bsz={dynamic}", f"{critic}.use_dynamic_bsz={dynamic}"]
    for key in (f"{actor}.ppo_micro_batch_size_per_gpu", f"{critic}.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
        out.append(f"{key}={pick(['null', 1, 2, 4, 4, 8, 8, 16])}")
    if rng.random() < 0.1:
        out.append(f"{actor}.loss_agg_mode={pick(['token-mean', 'seq-mean-token-sum-norm', 'seq-mean'])}")
    return out


def test_the_doctor_stops_exactly_where_verls_validate_config_does():
    rng = random.Random(20261204)
    stopped = worker_only = 0
    for i in range(N_CASES):
        overrides = MODELS + case(rng)
        lines = diagnose(DEFAULT, overrides, parts=("checks",))  # runs verl's validate_config (verl_verdict)
        said = next(ln for ln in lines if "validate_config, run here" in ln)
        assert said.startswith("  verl 0.9.1's"), said
        assert "could not run" not in said, (said, overrides)
        verls = None if said.endswith(": passes") else said.split(": stops: ", 1)[1]
        stops = [ln for ln in lines if ln.startswith("  STOP:")]
        where = f"case {i}: verl's validate_config says {verls!r}, the doctor {stops}\n{overrides}"
        if verls is not None:
            assert stops, where
        else:  # what validate_config does not check, verl's workers assert at their first update: said so
            assert all(any(w in s for w in WORKER_ASSERTS) for s in stops), where
            worker_only += bool(stops)
        stopped += verls is not None
    assert 0.25 * N_CASES < stopped < 0.85 * N_CASES, stopped  # both verdicts well represented
    assert worker_only > 0.05 * N_CASES, worker_only


def test_verls_words_are_quoted_where_it_stops():
    """On a batch verl cannot split over its GPUs the quoted stop is verl's own assertion message."""
    raw, _ = read_verl_config(DEFAULT, MODELS + ["data.train_batch_size=6", "trainer.n_gpus_per_node=4",
                                                 "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                                                 "critic.ppo_micro_batch_size_per_gpu=1",
                                                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
                                                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1"])
    version, stop = verl_verdict(raw)
    assert (version, stop) == ("0.9.1", "AssertionError: real_train_batch_size (6) must be divisible by minimal "
                                        "possible batch size (4)"), stop


def test_a_target_that_writes_a_file_is_never_handed_to_verls_checks(tmp_path):
    """verl's validate_config builds the actor's config through Hydra's instantiate, which would call
    ``builtins.open(victim, "w")`` and truncate it: the doctor refuses the config before verl sees it."""
    import yaml

    victim = tmp_path / "notes.txt"
    victim.write_bytes(b"the user's work")
    cfg = yaml.safe_load(DEFAULT.read_text())
    cfg["actor_rollout_ref"]["actor"]["policy_loss"] = {"_target_": "builtins.open", "file": str(victim), "mode": "w"}
    job = tmp_path / "job" / "config.yaml"
    job.parent.mkdir()
    job.write_text(yaml.safe_dump(cfg))
    overrides = MODELS + ["data.train_batch_size=8", "trainer.n_gpus_per_node=1",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                          "critic.ppo_micro_batch_size_per_gpu=2",
                          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2"]
    lines = diagnose(job, overrides, parts=("checks",))
    raw, _ = read_verl_config(job, overrides)
    assert verl_verdict(raw)[1].startswith("not run: actor_rollout_ref.actor.policy_loss._target_ = 'builtins.open'")
    assert victim.read_bytes() == b"the user's work"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["config.yaml", "job", "notes.txt"]
    assert any("actor_rollout_ref.actor.policy_loss._target_ = 'builtins.open'" in ln for ln in lines), lines
    assert not any("validate_config, run here" in ln for ln in lines), lines


def test_a_critic_named_by_a_hub_id_is_never_fetched(monkeypatch):
    """A job someone sent names its critic by a hub id: verl's check would download that model's config. The doctor
    says the check could not run here, in one line naming the key, and nothing touches the network."""
    import socket

    from huggingface_hub import constants

    from ppolab.verl_config import OFFLINE_ENV

    hub_flag, env = constants.HF_HUB_OFFLINE, {k: os.environ.get(k) for k in OFFLINE_ENV}
    tried = []

    def refuse(*args, **kwargs):
        tried.append(args)
        raise OSError("the network is off in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    batch = ["data.train_batch_size=8", "trainer.n_gpus_per_node=1", "algorithm.adv_estimator=gae",
             "actor_rollout_ref.actor.ppo_mini_batch_size=8", "critic.ppo_mini_batch_size=8",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2"]
    raw, _ = read_verl_config(DEFAULT, [f"actor_rollout_ref.model.path={TINY}", "critic.model.path=someorg/some-model",
                                        f"critic.model.tokenizer_path={TINY}", *batch])
    version, stop = verl_verdict(raw)
    assert version == "0.9.1" and stop.startswith("could not run: critic.model.path = 'someorg/some-model' is not a "
                                                  "folder on this machine"), stop
    # the same job with the critic here: verl's check runs, offline, and passes
    raw, _ = read_verl_config(DEFAULT, MODELS + batch)
    assert verl_verdict(raw) == ("0.9.1", None)
    assert not tried, tried
    # and the hub is on again for the rest of the process, as it was
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE == hub_flag and {k: os.environ.get(k) for k in OFFLINE_ENV} == env
