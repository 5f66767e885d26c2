"""Every config field has an effect or is refused (issue 16): a walk over the whole schema, and the four fields
that once did nothing — trainer.total_epochs, nnodes, n_gpus_per_node, project_name — shown to act."""
import dataclasses
import re
from pathlib import Path

import pytest

from ppolab.config import ConfigError, PPOConfig, load_config
from ppolab.train import resolve_config, tensorboard_dir
from ppolab.batching import total_steps

REPO = Path(__file__).resolve().parents[1]


def leaf_fields(obj, prefix=""):
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from leaf_fields(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f.name


#: Fields whose whole effect is a check at load time (ppolab's ranks come from the launcher): each is shown to refuse
#: a mismatching launch in test_nnodes_and_n_gpus_per_node_must_match_the_launch.
CHECKS_ONLY = {"trainer.nnodes", "trainer.n_gpus_per_node"}


def test_every_schema_field_is_read_outside_the_config_package():
    """A field only the config package mentions (its schema, loader, validation) changes nothing at run time.
    This walk reads every runtime module of ppolab for an attribute access ``.name`` or a string key ``"name"``."""
    runtime = "\n".join(p.read_text() for p in (REPO / "ppolab").rglob("*.py") if "config" not in p.parts)
    unread = [key for key, name in leaf_fields(PPOConfig())
              if not re.search(rf"\.{name}\b|[\"']{name}[\"']", runtime) and key not in CHECKS_ONLY]
    assert len(list(leaf_fields(PPOConfig()))) > 100
    assert unread == [], f"config fields nothing outside ppolab/config reads: {unread} — wire them or refuse them"


def test_the_walk_would_catch_an_unread_field(monkeypatch):
    """The walk is not vacuous: a field nobody reads is reported."""
    @dataclasses.dataclass
    class WithDeadField:
        nobody_reads_this_field_xyz: int = 1

    runtime = "\n".join(p.read_text() for p in (REPO / "ppolab").rglob("*.py") if "config" not in p.parts)
    name = next(n for _, n in leaf_fields(WithDeadField()))
    assert not re.search(rf"\.{name}\b|[\"']{name}[\"']", runtime)


@pytest.mark.parametrize("steps, epochs, per_epoch, expected", [
    (100, None, 7, 100),   # no epoch limit
    (100, 2, 7, 14),       # two passes end first
    (5, 2, 7, 5),          # the step limit ends first
    (None, 3, 7, 21),      # verl: total_training_steps null → epochs × len(dataloader)
])
def test_total_epochs_and_total_training_steps_whichever_ends_first(steps, epochs, per_epoch, expected):
    cfg = resolve_config("grpo_tiny", [f"trainer.total_training_steps={'null' if steps is None else steps}",
                                       f"trainer.total_epochs={'null' if epochs is None else epochs}"])
    assert total_steps(cfg.trainer, per_epoch) == expected


def test_total_epochs_reaches_the_trainer():
    from ppolab.trainer import PPOTrainer

    t = PPOTrainer(resolve_config("grpo_tiny", ["trainer.total_epochs=1", "trainer.total_training_steps=null",
                                                "trainer.val_before_train=false"]))
    per_epoch = len(t.train_data) // t.config.data.train_batch_size
    assert t.total_steps == per_epoch and per_epoch > 1
    for _ in range(per_epoch):  # one pass: the data epoch counter turns over only after total_steps batches
        t.next_prompts()
    assert t.data_epoch == 0
    t.next_prompts()
    assert t.data_epoch == 1


def test_no_stop_condition_is_refused():
    with pytest.raises(ConfigError, match="total_training_steps and trainer.total_epochs are both null"):
        load_config("grpo_tiny", ["trainer.total_training_steps=null"])


@pytest.mark.parametrize("nnodes, per_node, world, ok", [
    (None, None, 2, True), (1, 2, 2, True), (2, 4, 8, True), (None, 8, 1, False), (2, 1, 1, False)])
def test_nnodes_and_n_gpus_per_node_must_match_the_launch(nnodes, per_node, world, ok):
    overrides = [f"trainer.nnodes={'null' if nnodes is None else nnodes}",
                 f"trainer.n_gpus_per_node={'null' if per_node is None else per_node}",
                 "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]
    if ok:
        load_config("grpo_tiny", overrides, world_size=world)
    else:
        with pytest.raises(ConfigError, match=r"trainer.nnodes × trainer.n_gpus_per_node"):
            load_config("grpo_tiny", overrides, world_size=world)


def test_project_name_groups_the_tensorboard_logs(tmp_path):
    cfg = resolve_config("grpo_tiny", ["trainer.project_name=arith", "trainer.experiment_name=eps0.1"])
    assert tensorboard_dir(cfg, tmp_path) == tmp_path / "tensorboard" / "arith" / "eps0.1"
    other = resolve_config("grpo_tiny", ["trainer.project_name=other", "trainer.experiment_name=eps0.1"])
    assert tensorboard_dir(other, tmp_path) != tensorboard_dir(cfg, tmp_path)


def test_global_batch_info_is_not_a_config_key():
    with pytest.raises(ConfigError, match="global_batch_info is set per mini-batch by the worker"):
        load_config("grpo_tiny", ['actor_rollout_ref.actor.global_batch_info={"dp_size": 2}'])
