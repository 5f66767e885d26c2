"""Rollout engines: turn prompts into sampled trajectories with the engine's own log-probs.

The interface is small on purpose (``generate`` and ``sync_weights``) so a vLLM engine can slot in
beside the Hugging Face one.
"""
from ppolab.rollout.base import RolloutEngine, RolloutOutput, SamplingParams, left_pad, response_mask_from_ids
from ppolab.rollout.hf import HFRollout


def require_engine(name: str) -> None:
    """Fail with one sentence, before any model loads, when the chosen engine's package is missing."""
    import importlib.util

    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "actor_rollout_ref.rollout.name=vllm needs the vllm package, which is not installed: install the GPU "
            "extra with pip install 'ppolab[gpu]' on a CUDA machine, or use rollout.name=hf."
        )


def make_rollout_engine(rollout, models, **kwargs) -> RolloutEngine:
    """The engine ``actor_rollout_ref.rollout`` asks for (a RolloutConfig, or just its ``name``): ``hf`` generate,
    the multi-turn tool agent loop on top of it (``multi_turn.enable`` + ``agent.default_agent_loop=tool_agent``),
    or ``vllm``."""
    name = rollout if isinstance(rollout, str) else rollout.name
    multi_turn = getattr(rollout, "multi_turn", None)
    if multi_turn is not None and multi_turn.enable and rollout.agent.default_agent_loop == "tool_agent":
        if name != "hf":
            raise ValueError(f"actor_rollout_ref.rollout.name={name!r}: the tool agent loop runs on the hf engine")
        from ppolab.rollout.agent import ToolAgentRollout

        return ToolAgentRollout(models, rollout.multi_turn, **kwargs)
    if name == "hf":
        return HFRollout(models, dtype=getattr(rollout, "dtype", None), **kwargs)
    if name == "vllm":
        require_engine(name)
        from ppolab.rollout.vllm import VLLMRollout

        if isinstance(rollout, str):
            raise ValueError("the vllm engine needs the whole actor_rollout_ref.rollout config, not just its name")
        return VLLMRollout(models, rollout, **kwargs)
    raise ValueError(f"actor_rollout_ref.rollout.name={name!r} is unknown; choose hf or vllm")


__all__ = ["RolloutEngine", "RolloutOutput", "SamplingParams", "HFRollout", "left_pad", "response_mask_from_ids",
           "make_rollout_engine", "require_engine"]
