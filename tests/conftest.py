import pytest
import torch


@pytest.fixture
def float64_by_default():
    """Exact comparisons in float64 for one test; restored so later tests see float32 again."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
