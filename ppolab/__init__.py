"""ppolab: learn how PPO/GRPO post-training really updates parameters.

The public face: ``ppolab.train(...)`` runs the verl-semantics trainer and returns a :class:`Run`;
``ppolab.train_in_background(...)`` the same in a thread, so a lab can follow the run while it trains;
``ppolab.load_run(path)`` opens a run directory; ``ppolab.algos`` holds every formula. Heavy modules
(transformers, the trainer) load on first use, so ``import ppolab.algos`` stays fast.
"""
from typing import Any

__version__ = "0.1.0"
__all__ = ["train", "train_in_background", "load_run", "Run", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from ppolab.train import train

        globals()["train"] = train  # importing the submodule bound the module here; bind the function instead
        return train
    if name == "train_in_background":
        from ppolab.background import train_in_background

        return train_in_background
    if name in ("load_run", "Run"):
        from ppolab.run import reader

        return getattr(reader, name)
    raise AttributeError(f"module 'ppolab' has no attribute {name!r}")
