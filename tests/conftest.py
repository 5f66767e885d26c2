import shutil
from pathlib import Path

import pytest
import torch


@pytest.fixture
def float64_by_default():
    """Exact comparisons in float64 for one test; restored so later tests see float32 again."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """``trained_run(preset, overrides)``: the run dir of ``ppolab.train(preset, overrides)``, trained once for every
    test file and xdist worker that asks for the same one (``tests/trained.py``). Tests only read it."""
    from trained import shared_root, train_once

    root = shared_root(tmp_path_factory)
    return lambda preset, overrides=(): train_once(root, preset, list(overrides))


@pytest.fixture(scope="session")
def fresh_llama_run(trained_run, tmp_path_factory) -> str:
    """grpo_tiny at :data:`helpers.FRESH` on a random Llama (``tests/trained.py::build_random_llama``) instead of the
    shipped model: a learner's own model of another family, trained once per session (or kept in
    ``PPOLAB_TEST_RUNS``); the lab and exercise matrices read the same run."""
    from helpers import FRESH
    from trained import random_llama, shared_root

    model = random_llama(shared_root(tmp_path_factory))
    return trained_run("grpo_tiny", [*FRESH, f"actor_rollout_ref.model.path={model}"])


@pytest.fixture(scope="session")
def finished(trained_run) -> Path:
    """A finished 2-step run with a checkpoint after each step (never modified: tests copy it, ``copy_of``)."""
    from helpers import NO_VAL, TINY

    return Path(trained_run("grpo_tiny", [*TINY, *NO_VAL, "trainer.total_training_steps=2", "trainer.save_freq=1"]))


@pytest.fixture
def copy_of(finished, tmp_path) -> Path:
    """A copy of ``finished`` a test may change."""
    dst = tmp_path / "copy"
    shutil.copytree(finished, dst)
    return dst


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory) -> Path:
    """A fresh venv with ppolab installed from a wheel of this checkout, built once a session (``tests/wheel_env.py``;
    used by ``tests/test_wheel.py`` and ``tests/browser/test_labs_command.py``). Tests only run it."""
    from wheel_env import wheel_venv as build

    return build(tmp_path_factory)
