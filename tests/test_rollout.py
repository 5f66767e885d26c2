"""Rollout engine selection: hf, the tool agent loop, and vllm's clear failure without vllm."""
import importlib.util

import pytest

from ppolab.config.schema import RolloutConfig
from ppolab.rollout import make_rollout_engine


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_without_vllm_fails_with_one_clear_sentence():
    with pytest.raises(ImportError) as e:
        make_rollout_engine(RolloutConfig(name="vllm"), models=None)
    message = str(e.value)
    assert "rollout.name=vllm" in message and "pip install 'ppolab[gpu]'" in message and "rollout.name=hf" in message


def test_unknown_engine_names_the_choices():
    with pytest.raises(ValueError, match="choose hf or vllm"):
        make_rollout_engine(RolloutConfig(name="sglang"), models=None)


def test_tool_agent_loop_needs_the_hf_engine():
    cfg = RolloutConfig(name="vllm")
    cfg.multi_turn.enable, cfg.multi_turn.max_assistant_turns = True, 2
    cfg.agent.default_agent_loop = "tool_agent"
    with pytest.raises(ValueError, match="tool agent loop runs on the hf engine"):
        make_rollout_engine(cfg, models=None)


def test_vllm_with_full_fine_tuning_is_a_config_error_before_any_model_loads():
    from ppolab.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="lora_rank > 0"):
        load_config("grpo_qwen_gpu", ["actor_rollout_ref.model.lora_rank=0"])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_vllm_is_reported_before_any_model_loads():
    from ppolab.train import resolve_config
    from ppolab.trainer import PPOTrainer

    cfg = resolve_config("grpo_tiny", ["actor_rollout_ref.rollout.name=vllm",
                                       "actor_rollout_ref.model.path=/nonexistent/model"])
    with pytest.raises(ImportError, match="needs the vllm package"):  # not the missing model directory
        PPOTrainer(cfg)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_cli_reports_missing_vllm_in_one_line_with_exit_code_2(capsys):
    from ppolab.train import main

    assert main(["actor_rollout_ref.rollout.name=vllm"]) == 2
    err = capsys.readouterr().err
    assert "needs the vllm package" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
