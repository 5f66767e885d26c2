"""The random state a run depends on — Python's, NumPy's and torch's — seeded once, saved and restored whole, so a
resumed run continues exactly (checkpoints: ``PPOTrainer.state_dict``)."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """{"torch": uint8 tensor, "python": JSON-able list, "numpy": JSON-able list} of the current process."""
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]}


def load_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state` (also from its JSON round trip, where tuples became lists)."""
    torch.set_rng_state(state["torch"])
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in state["python"]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
