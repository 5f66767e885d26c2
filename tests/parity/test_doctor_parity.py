"""``ppolab doctor verl`` on verl 0.9.1's own default config (``trainer/config/_generated_ppo_trainer.yaml``, the
composed ``ppo_trainer.yaml`` that ``trainer/main_ppo.py`` starts from): the stops verl's ``utils/config.py::
validate_config`` would raise on it (no micro-batch size set for the actor, the critic and the two log-prob passes),
its arithmetic as verl computes it (``real_train_batch_size = train_batch_size × n`` over
``trainer.n_gpus_per_node × nnodes`` GPUs; ``ppo_mini_batch_size × n`` trajectories a mini-batch), and of §16's nine
points only the one every config trips (the aggregation's weighting).

Skipped unless verl is importable (``pip install -e ".[verl]"``: ``.ci/run``'s verl phase)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from ppolab.doctor import diagnose

_SPEC = importlib.util.find_spec("verl")
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("verl's source is not on the path (see tests/parity/test_verl_logs_parity.py)", allow_module_level=True)
DEFAULT = Path(next(iter(_SPEC.submodule_search_locations))) / "trainer" / "config" / "_generated_ppo_trainer.yaml"
MICRO = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8", "critic.ppo_micro_batch_size_per_gpu=4"]


def value(lines, quantity):
    return int(re.search(rf"{re.escape(quantity)}\s+(\d+)", "\n".join(lines)).group(1))


def test_verls_default_config_stops_where_verl_would_and_trips_no_point():
    lines = diagnose(DEFAULT)
    stops = [ln for ln in lines if ln.startswith("  STOP:")]
    for key in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"):
        assert any(key in s for s in stops), (key, stops)
    assert not {m for ln in lines for m in re.findall(r"§16 mistake (\d):", ln)}, lines


def test_with_micro_batches_set_the_arithmetic_is_verls():
    lines = diagnose(DEFAULT, MICRO + ["actor_rollout_ref.rollout.n=4"])
    assert not [ln for ln in lines if ln.startswith("  STOP:")], lines
    import yaml

    raw = yaml.safe_load(DEFAULT.read_text())
    n_gpus = raw["trainer"]["n_gpus_per_node"] * raw["trainer"]["nnodes"]
    real_train_batch_size = raw["data"]["train_batch_size"] * 4
    mini = raw["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] * 4
    assert value(lines, "trajectories") == real_train_batch_size
    assert value(lines, "global mini-batch") == mini
    assert value(lines, "local mini-batch (per rank)") == mini // n_gpus
    assert value(lines, "optimizer steps per training step") == real_train_batch_size // mini


def test_a_batch_verl_cannot_split_over_its_gpus_is_stopped():
    # verl: real_train_batch_size % n_gpus == 0 (utils/config.py::validate_config) — 1024 × 1 over 3 × 1 GPUs
    lines = diagnose(DEFAULT, MICRO + ["trainer.n_gpus_per_node=3"])
    assert any(ln.startswith("  STOP:") and "3 GPUs" in ln for ln in lines), lines


def test_the_shipped_example_job_is_what_verls_hydra_composes(tmp_path):
    """data/verl_jobs/ppo_fire_tiny/.hydra/{config,overrides}.yaml (labs 12 and 16's "your verl job") byte for byte:
    ppo_trainer composed by Hydra from verl 0.9.1's own config folder with the example's overrides."""
    pytest.importorskip("hydra", reason="hydra-core is not installed (.ci/run's verl phase installs it)")
    tool = Path(__file__).resolve().parents[2] / "tools" / "verl_config_example.py"
    spec = importlib.util.spec_from_file_location("verl_config_example", tool)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = example.write(tmp_path / "job")
    for name in ("config.yaml", "overrides.yaml"):
        assert (out / ".hydra" / name).read_bytes() == (example.OUT / ".hydra" / name).read_bytes(), \
            f"re-run tools/verl_config_example.py ({name} differs)"
    lines = diagnose(out)
    assert not [ln for ln in lines if ln.startswith("  STOP:")], lines


@pytest.mark.parametrize("trainer, overrides", [
    ("_generated_ppo_trainer.yaml", ["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2"]),
    ("_generated_ppo_trainer.yaml", ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=4"]),  # deprecated
    ("_generated_ppo_trainer.yaml", []),
    ("_generated_ppo_megatron_trainer.yaml", ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                              "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"]),
    ("_generated_ppo_megatron_trainer.yaml", ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                              "actor_rollout_ref.actor.megatron.context_parallel_size=2",
                                              "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4"]),
])
def test_the_data_parallel_size_divides_by_the_sizes_verls_engine_config_holds(trainer, overrides):
    """The sizes the doctor divides the GPUs by are those verl's own config classes hold after their
    ``__post_init__`` (``FSDPActorConfig`` copies the deprecated ``ulysses_sequence_parallel_size`` into its engine);
    dp as ``workers/engine/fsdp/transformer_impl.py::get_data_parallel_size`` (world // SP) and Megatron's
    data-parallel group (world // (TP × PP × CP), ``utils/config.py::validate_config``'s ``megatron_dp``)."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    from ppolab.verl_config import data_parallel, read_verl_config

    raw, _ = read_verl_config(DEFAULT.parent / trainer, MICRO[:1] + overrides + ["trainer.n_gpus_per_node=8",
                                                                                 "trainer.nnodes=2"])
    engine = omega_conf_to_dataclass(OmegaConf.create(raw).actor_rollout_ref.actor).engine
    if "megatron" in trainer:
        group = engine.tensor_model_parallel_size * engine.pipeline_model_parallel_size * engine.context_parallel_size
    else:
        group = engine.ulysses_sequence_parallel_size
    assert data_parallel(raw)[:2] == (16, 16 // group)
    assert f"data-parallel size {16 // group}" in diagnose(DEFAULT.parent / trainer, MICRO + overrides + [
        "trainer.n_gpus_per_node=8", "trainer.nnodes=2"])[1]
