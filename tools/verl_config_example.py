"""Write data/verl_jobs/ppo_fire_tiny/.hydra/: the config verl 0.9.1's own Hydra composes for a verl job with the
settings of the shipped run ppo_fire_tiny — the example labs 12 and 16 open as "your verl job" when the learner names
none (``PPOLAB_VERL_JOB``), and the folder ``ppolab doctor verl`` reads as a verl output folder.

    pip download verl==0.9.1 --no-deps -d /tmp/verl091 && python -m zipfile -e /tmp/verl091/verl-*.whl /tmp/verl091/src
    .venv/bin/pip install hydra-core
    PYTHONPATH=/tmp/verl091/src .venv/bin/python tools/verl_config_example.py

A verl job (``python -m verl.trainer.main_ppo k=v …``, a ``@hydra.main`` over ``trainer/config/ppo_trainer.yaml``)
writes to its output folder ``.hydra/config.yaml`` — the composed config with the command line's overrides applied,
interpolations left as written — and ``.hydra/overrides.yaml``, the overrides as given. This script composes
``ppo_trainer`` from verl's own config folder with Hydra's compose API and writes both files the way Hydra does
(``OmegaConf.save``); ``tests/parity/test_doctor_parity.py`` writes them again and compares the bytes.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "verl_jobs" / "ppo_fire_tiny"

#: ppo_fire_tiny's preset (ppolab/config/presets/ppo_fire_tiny.yaml) as a verl command line: every setting it
#: changes that verl has, under verl's name; 2 GPUs as the run's 2 ranks. ppolab-only settings (record_freq, the
#: run dir) have no verl key and are not here.
OVERRIDES = [
    "data.train_files=data/arith/train.parquet",
    "data.val_files=data/arith/test.parquet",
    "data.train_batch_size=60",
    "data.max_prompt_length=32",
    "data.max_response_length=16",
    "actor_rollout_ref.model.path=data/models/tiny-arith",
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.actor.clip_ratio=0.07",
    "actor_rollout_ref.actor.clip_ratio_low=0.07",  # verl's defaults set both to 0.2, and a set value wins over
    "actor_rollout_ref.actor.clip_ratio_high=0.07",  # clip_ratio (core_algos.py::compute_policy_loss_vanilla)
    "actor_rollout_ref.actor.clip_ratio_c=1.2",
    "actor_rollout_ref.actor.entropy_coeff=0.001",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.kl_loss_coef=0.01",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.ppo_epochs=4",
    "actor_rollout_ref.actor.optim.lr=5e-4",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.rollout.name=vllm",  # mandatory (`???`) in verl's rollout config: verl stops without it
    "actor_rollout_ref.rollout.dtype=bfloat16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64",
    "critic.enable=true",
    "critic.cliprange_value=0.1",
    "critic.ppo_micro_batch_size_per_gpu=8",
    "critic.optim.lr=1e-3",
    "critic.model.path=data/models/tiny-arith",
    "algorithm.adv_estimator=gae",
    "algorithm.lam=0.95",
    "algorithm.use_kl_in_reward=true",
    "algorithm.kl_ctrl.type=adaptive",
    "algorithm.kl_ctrl.kl_coef=0.02",
    "algorithm.kl_ctrl.target_kl=0.02",
    "algorithm.kl_ctrl.horizon=256",
    "algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2'",
    "algorithm.rollout_correction.rollout_rs_threshold='1.02,0.002'",
    "trainer.n_gpus_per_node=2",
    "trainer.nnodes=1",
    "trainer.total_training_steps=30",
    "trainer.test_freq=10",
    "trainer.save_freq=-1",
    "trainer.logger=[console,file]",
    "trainer.project_name=ppolab",
    "trainer.experiment_name=ppo_fire_tiny",
]


def verl_config_dir() -> Path:
    """verl's ``trainer/config`` folder, from the verl source on the path."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("verl's source is not on the path: see this script's docstring")
    return Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"


def compose(overrides: list[str] = OVERRIDES):
    """``ppo_trainer`` composed by Hydra from verl's config folder with ``overrides`` (what main_ppo.py receives)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return hydra_compose("ppo_trainer", overrides=list(overrides))


def write(out: Path = OUT, overrides: list[str] = OVERRIDES) -> Path:
    """``out/.hydra/config.yaml`` and ``out/.hydra/overrides.yaml``, as Hydra writes them at a job's start."""
    from omegaconf import OmegaConf

    hydra_dir = out / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(compose(overrides), hydra_dir / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(overrides)), hydra_dir / "overrides.yaml")
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
