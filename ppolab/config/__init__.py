"""Typed config tree with verl's names and defaults: dataclasses, YAML presets, dotted overrides, validation.

``import ppolab.config`` pulls in no torch: a config loads and validates before any model does. The loader
functions (and OmegaConf behind them) are imported on first use, so ``ppolab.algos``, which needs only
``ppolab.config.actor``, stays light.
"""
from typing import Any

from ppolab.config.actor import (
    BYPASS_LOSS_TYPES,
    LOSS_AGG_MODES,
    ActorConfig,
    OptimConfig,
    PolicyLossConfig,
    check_loss_agg_mode,
)
from ppolab.config.schema import (
    ActorRolloutRefConfig,
    AgentConfig,
    AlgorithmConfig,
    ConfigError,
    ConfigNotice,
    CriticConfig,
    CriticModelConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    KLCtrlConfig,
    ModelConfig,
    MultiTurnConfig,
    PPOConfig,
    RefConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    TrainerConfig,
    ValKwargsConfig,
)

_LOADER_NAMES = ("from_dict", "list_presets", "load_config", "registry_names", "to_dict", "to_yaml",
                 "valid_keys", "validate")


def __getattr__(name: str) -> Any:
    # PEP 562: ``from ppolab.config import load_config`` imports the loader (and OmegaConf) only when asked.
    if name in _LOADER_NAMES:
        from ppolab.config import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'ppolab.config' has no attribute {name!r}")


__all__ = [
    "LOSS_AGG_MODES",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "BYPASS_LOSS_TYPES",
    "AgentConfig",
    "AlgorithmConfig",
    "ConfigError",
    "ConfigNotice",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "KLCtrlConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "PPOConfig",
    "PolicyLossConfig",
    "RefConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "check_loss_agg_mode",
    "from_dict",
    "list_presets",
    "load_config",
    "registry_names",
    "to_dict",
    "to_yaml",
    "valid_keys",
    "validate",
]
