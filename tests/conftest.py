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
def finished(tmp_path_factory) -> Path:
    """A finished 2-step run with a checkpoint after each step (never modified: tests copy it, ``copy_of``)."""
    import ppolab
    from helpers import NO_VAL, TINY

    run_dir = tmp_path_factory.mktemp("finished") / "run"
    ppolab.train("grpo_tiny", [*TINY, *NO_VAL, "trainer.total_training_steps=2", "trainer.save_freq=1",
                               f"trainer.run_dir={run_dir}"], progress=False)
    return run_dir


@pytest.fixture
def copy_of(finished, tmp_path) -> Path:
    """A copy of ``finished`` a test may change."""
    dst = tmp_path / "copy"
    shutil.copytree(finished, dst)
    return dst
