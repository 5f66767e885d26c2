"""ppolab.config: verl defaults, presets, dotted overrides, error messages, validation rules, round trips."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import yaml

import ppolab
from ppolab.config import (
    ConfigError,
    ConfigNotice,
    PPOConfig,
    from_dict,
    list_presets,
    load_config,
    loader,
    to_dict,
    to_yaml,
    valid_keys,
    validate,
)

REPO = Path(ppolab.__file__).resolve().parent.parent
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"


def load_quiet(*args, **kwargs) -> PPOConfig:
    """load_config that fails the test on any ConfigNotice (presets should be notice-free)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigNotice)
        return load_config(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ defaults


def test_defaults_match_verl_facts_sheet_section_14():
    c = PPOConfig()
    a, crit, alg, ro = c.actor_rollout_ref.actor, c.critic, c.algorithm, c.actor_rollout_ref.rollout
    # verl 0.9.1's actor.yaml and ActorConfig set all three clip ratios: clip_ratio is the window only where the
    # other two are null (algos.policy_loss.clip_bounds)
    assert (a.clip_ratio, a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c) == (0.2, 0.2, 0.2, 3.0)
    assert (a.entropy_coeff, a.calculate_entropy) == (0.0, False)
    assert (a.use_kl_loss, a.kl_loss_coef, a.kl_loss_type) == (False, 0.001, "low_var_kl")
    assert (a.loss_agg_mode, a.loss_scale_factor, a.policy_loss.loss_mode) == ("token-mean", None, "vanilla")
    assert (a.ppo_mini_batch_size, a.ppo_micro_batch_size_per_gpu) == (256, None)
    assert (a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, a.ppo_epochs, a.shuffle) == (
        False, 16384, 1, False)
    assert (a.optim.lr, tuple(a.optim.betas), a.optim.weight_decay, a.optim.clip_grad) == (
        1e-6, (0.9, 0.999), 0.01, 1.0)
    assert (crit.cliprange_value, crit.ppo_max_token_len_per_gpu, crit.optim.lr, crit.data_loader_seed) == (
        0.5, 32768, 1e-5, 42)
    assert (crit.loss_agg_mode, crit.ppo_mini_batch_size, crit.ppo_epochs, crit.shuffle, crit.enable) == (
        None, None, None, None, None)
    assert (alg.adv_estimator, alg.gamma, alg.lam, alg.norm_adv_by_std_in_grpo) == ("gae", 1.0, 1.0, True)
    assert (alg.use_kl_in_reward, alg.kl_penalty) == (False, "kl")
    assert (alg.kl_ctrl.type, alg.kl_ctrl.kl_coef, alg.kl_ctrl.horizon, alg.kl_ctrl.target_kl) == (
        "fixed", 0.001, 10000, 0.1)
    assert (alg.rollout_correction.rollout_is, alg.rollout_correction.rollout_is_threshold,
            alg.rollout_correction.bypass_mode) == (None, 2.0, False)
    assert (alg.rollout_correction.rollout_rs, alg.rollout_correction.rollout_rs_threshold) == (None, None)
    assert (ro.temperature, ro.top_p, ro.top_k, ro.n, ro.calculate_log_probs) == (1.0, 1.0, -1, 1, True)
    assert (ro.val_kwargs.temperature, ro.val_kwargs.n, ro.val_kwargs.do_sample) == (0.0, 1, False)
    assert (c.data.train_batch_size, c.data.max_response_length, c.data.max_prompt_length) == (1024, 512, 512)
    assert (c.trainer.critic_warmup, c.trainer.seed, c.trainer.logger, c.trainer.save_freq) == (
        0, 1, ["console"], -1)
    assert c.actor_rollout_ref.model.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"]
    assert (c.custom_reward_function.path, c.custom_reward_function.name) == (None, "compute_score")


def test_use_critic_and_reference_policy_follow_verl():
    c = PPOConfig()
    assert c.use_critic and not c.use_reference_policy  # gae → critic; no KL path → no ref
    c.algorithm.adv_estimator = "grpo"
    assert not c.use_critic
    c.critic.enable = True
    assert c.use_critic
    c.actor_rollout_ref.actor.use_kl_loss = True
    assert c.use_reference_policy
    c.actor_rollout_ref.actor.use_kl_loss, c.algorithm.use_kl_in_reward = False, True
    assert c.use_reference_policy


# ------------------------------------------------------------------------------------------------ presets


@pytest.mark.parametrize("name", ["grpo_tiny", "ppo_gae_tiny", "grpo_qwen_gpu"])
def test_presets_load_and_validate_on_cpu_without_notices(name):
    assert name in list_presets()
    cfg = load_quiet(name)
    assert validate(cfg) == []


def test_grpo_qwen_gpu_validates_for_eight_ranks():
    cfg = load_quiet("grpo_qwen_gpu", world_size=8)
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.actor_rollout_ref.model.dtype == "bfloat16"
    assert validate(cfg, world_size=8) == []


def test_preset_contents():
    g = load_quiet("grpo_tiny")
    assert (g.algorithm.adv_estimator, g.actor_rollout_ref.rollout.n, g.data.train_batch_size) == (
        "grpo", 8, 16)
    assert (g.actor_rollout_ref.model.lora_rank, g.actor_rollout_ref.actor.kl_loss_type) == (8, "low_var_kl")
    assert g.actor_rollout_ref.actor.use_kl_loss and not g.algorithm.use_kl_in_reward and not g.use_critic
    assert (g.trainer.total_training_steps, g.trainer.device, g.trainer.experiment_name) == (
        100, "cpu", "grpo_tiny")
    p = load_quiet("ppo_gae_tiny")
    assert (p.algorithm.adv_estimator, p.algorithm.lam, p.actor_rollout_ref.rollout.n) == ("gae", 0.95, 1)
    assert p.algorithm.use_kl_in_reward and not p.actor_rollout_ref.actor.use_kl_loss and p.use_critic
    q = load_quiet("grpo_qwen_gpu")
    assert q.actor_rollout_ref.actor.use_dynamic_bsz and q.actor_rollout_ref.actor.kl_loss_type == "k3"


def test_shipped_paths_resolve_against_repo_root_from_any_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_quiet("grpo_tiny")
    assert cfg.actor_rollout_ref.model.path == str(REPO / "data" / "models" / "tiny-arith")
    assert cfg.data.train_files == [str(REPO / "data" / "arith" / "train.parquet")]
    assert cfg.data.val_files == [str(REPO / "data" / "arith" / "test.parquet")]


def test_user_yaml_file_and_unknown_preset(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("data:\n  train_batch_size: 32\ntrainer:\n  experiment_name: mine\n")
    cfg = load_quiet(f, ["data.train_files=[a.parquet]", "data.val_files=[b.parquet]",
                         "actor_rollout_ref.model.path=m", f"{A}.ppo_micro_batch_size_per_gpu=8",
                         f"{A}.ppo_mini_batch_size=32", f"{R}.log_prob_micro_batch_size_per_gpu=8",
                         "critic.use_dynamic_bsz=true"])  # chapter §14.1: no fixed critic micro-batch
    assert (cfg.data.train_batch_size, cfg.trainer.experiment_name) == (32, "mine")
    with pytest.raises(ConfigError, match="did you mean grpo_tiny"):
        load_config("grpo_tiyn")
    broken = tmp_path / "broken.yaml"
    broken.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor_rollout_ref:\n  actor:\n    clip_ration: 0.1\n")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.clip_ration.*did you mean "
                                          r"actor_rollout_ref\.actor\.clip_ratio"):
        load_config(bad)


# ------------------------------------------------------------------------------------------------ overrides


def test_dotted_overrides_scalar_nested_list_null():
    cfg = load_quiet("grpo_tiny", [f"{A}.clip_ratio_low=0.1", f"{A}.optim.lr=1e-4",
                                   f"{A}.clip_ratio_high=null",
                                   "trainer.logger=[console,tensorboard]", "data.train_files=/x/a.parquet",
                                   f"{R}.val_kwargs.temperature=0.5"])
    a = cfg.actor_rollout_ref.actor
    assert (a.clip_ratio_low, a.optim.lr, a.clip_ratio_high) == (0.1, 1e-4, None)
    assert isinstance(a.optim.lr, float)
    assert cfg.trainer.logger == ["console", "tensorboard"]
    assert cfg.data.train_files == ["/x/a.parquet"]  # a bare string means a one-element list
    assert cfg.actor_rollout_ref.rollout.val_kwargs.temperature == 0.5


def test_overrides_may_use_the_repo_root_resolver_and_interpolations():
    cfg = load_quiet("grpo_tiny", ["data.train_files=[${ppolab_root:}/a.parquet, ${ppolab_root:}/b.parquet]",
                                   "trainer.experiment_name=${trainer.project_name}-x"])
    assert cfg.data.train_files == [str(REPO / "a.parquet"), str(REPO / "b.parquet")]
    assert cfg.trainer.experiment_name == "ppolab-x"


@pytest.mark.parametrize("overrides", [
    {"actor_rollout_ref": {"actor": {"optim": {"lr": 3e-4}}}},
    {"actor_rollout_ref.actor.optim.lr": 3e-4},
    {"actor_rollout_ref.actor": {"optim.lr": 3e-4}},
])
def test_dict_overrides_nested_or_dotted(overrides):
    assert load_quiet("grpo_tiny", overrides).actor_rollout_ref.actor.optim.lr == 3e-4


@pytest.mark.parametrize("override, suggestion", [
    (f"{A}.clip_ration=0.1", f"did you mean {A}.clip_ratio"),
    (f"{R}.ppo_epochs=2", f"{A}.ppo_epochs"),  # right name, wrong group
    ("actr.clip_ratio=0.1", f"{A}.clip_ratio"),
    ("trainer.experiment=x", "trainer.experiment_name"),
])
def test_unknown_key_names_full_key_and_suggests(override, suggestion):
    with pytest.raises(ConfigError, match="unknown config key") as e:
        load_config("grpo_tiny", [override])
    assert override.split("=")[0] in str(e.value) and suggestion in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("override, key, expected", [
    ("data.train_batch_size=abc", "data.train_batch_size", "expected int"),
    (f"{A}.optim.lr=fast", f"{A}.optim.lr", "expected float"),
    (f"{A}.use_kl_loss=maybe", f"{A}.use_kl_loss", "expected bool"),
    ("data.val_max_samples=lots", "data.val_max_samples", "expected int or null"),
    (f"{A}.optim.betas=[0.9]", f"{A}.optim.betas", "expected tuple[float, float]"),
    ("critic=3", "critic", "is a group of fields"),
])
def test_wrong_type_names_field_and_type(override, key, expected):
    with pytest.raises(ConfigError) as e:
        load_config("grpo_tiny", [override])
    assert key in str(e.value) and expected in str(e.value)


def test_malformed_override():
    with pytest.raises(ConfigError, match="key=value"):
        load_config("grpo_tiny", ["trainer.device"])
    with pytest.raises(ConfigError, match="not supported"):
        load_config("grpo_tiny", ["~trainer.device"])


def test_valid_keys_lists_dotted_leaves():
    keys = valid_keys()
    for k in (f"{A}.clip_ratio", f"{A}.optim.lr", "critic.model.lora_rank", "algorithm.kl_ctrl.target_kl",
              f"{R}.val_kwargs.do_sample", "algorithm.rollout_correction.bypass_mode", "trainer.record_freq"):
        assert k in keys
    assert "critic" not in keys and f"{A}.optim" not in keys and keys == sorted(keys)


# ------------------------------------------------------------------------------------------------ validation

G, P = "grpo_tiny", "ppo_gae_tiny"
VALIDATION_CASES = [  # (preset, overrides, world_size, substring the error must contain)
    # names
    (G, [f"{A}.loss_agg_mode=token_mean"], 1, f"{A}.loss_agg_mode='token_mean' is not valid"),
    (P, ["critic.loss_agg_mode=token_mean"], 1, "critic.loss_agg_mode='token_mean' is not valid"),
    (G, [f"{A}.kl_loss_type=k4"], 1, f"{A}.kl_loss_type='k4' is not valid"),
    (G, [f"{A}.kl_loss_type=full"], 1, "verl does not implement"),
    (G, ["algorithm.kl_penalty=full+"], 1, "algorithm.kl_penalty='full' is not allowed"),
    (G, ["algorithm.kl_penalty=kl2"], 1, "algorithm.kl_penalty='kl2' is not valid"),
    (G, ["algorithm.adv_estimator=grp0"], 1,
     "algorithm.adv_estimator='grp0' is not valid (did you mean grpo?)"),
    (G, [f"{A}.policy_loss.loss_mode=clip"], 1, f"{A}.policy_loss.loss_mode='clip' is not valid"),
    (G, ["algorithm.kl_ctrl.type=pid"], 1, "algorithm.kl_ctrl.type='pid' is not valid"),
    (G, [f"{R}.name=sglang"], 1, f"{R}.name='sglang' is not valid"),
    (G, ["actor_rollout_ref.model.dtype=fp8"], 1, "actor_rollout_ref.model.dtype='fp8' is not valid"),
    (G, ["trainer.logger=[console,wandb]"], 1, "trainer.logger='wandb' is not valid"),
    (G, ["algorithm.rollout_correction.rollout_is=tokens"], 1, "rollout_is='tokens' is not valid"),
    (G, ["trainer.device=tpu"], 1, "trainer.device='tpu' is not valid"),
    # batch arithmetic (grpo_tiny: 16 prompts × 8, mini 8 × 8 = 64 rows, micro 32)
    # (a step that does not fill whole mini-batches is padded, as verl V1 does: a notice, below)
    (G, ["data.train_batch_size=4"], 1, f"data.train_batch_size=4 must be ≥ {A}.ppo_mini_batch_size=8"),
    (G, [], 3, f"{A}.ppo_mini_batch_size × {R}.n = 8×8 is not divisible by world_size=3"),
    (G, [f"{A}.ppo_micro_batch_size_per_gpu=24"], 1, f"{A}.ppo_micro_batch_size_per_gpu=24 does not divide"),
    (G, [], 4, f"{A}.ppo_micro_batch_size_per_gpu=32 does not divide the local mini-batch"),
    (P, ["critic.ppo_mini_batch_size=128"], 1, "data.train_batch_size=64 must be ≥ critic.ppo_mini_batch_size=128"),
    # (critic.ppo_micro_batch_size_per_gpu=5 is no error: the V1 critic ignores it, a notice — tests/test_critic_v1.py)
    (G, [f"{A}.ppo_micro_batch_size_per_gpu=null"], 1, f"{A}.ppo_micro_batch_size_per_gpu is unset"),
    (P, ["critic.ppo_micro_batch_size_per_gpu=null"], 1, "critic.ppo_micro_batch_size_per_gpu is unset"),
    (G, [f"{R}.log_prob_micro_batch_size_per_gpu=null"], 1,
     f"{R}.log_prob_micro_batch_size_per_gpu is unset"),
    (G, ["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null"], 1,
     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu is unset"),
    # group estimators need a group
    # (a group of one is legal in verl — mean 0, std 1 — and a notice: test_a_group_of_one_is_a_notice; only
    # grpo_passk raises on it)
    (G, [f"{R}.n=1", "algorithm.adv_estimator=grpo_passk"], 1, "verl raises at the first step"),
    # dynamic token budgets (max_prompt_length + max_response_length = 48)
    (G, [f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=40"], 1,
     (f"{A}.ppo_max_token_len_per_gpu=40 is smaller than data.max_prompt_length + "
      "data.max_response_length = 48")),
    (P, ["critic.ppo_infer_max_token_len_per_gpu=40"], 1,  # the critic engine's budget, whatever use_dynamic_bsz
     "critic.ppo_infer_max_token_len_per_gpu=40 is smaller"),
    (G, [f"{R}.log_prob_use_dynamic_bsz=true", f"{R}.log_prob_max_token_len_per_gpu=10"], 1,
     f"{R}.log_prob_max_token_len_per_gpu=10 is smaller"),
    # ranges
    (G, [f"{A}.clip_ratio_c=1.0"], 1, f"{A}.clip_ratio_c=1.0 must be > 1"),
    (G, [f"{A}.clip_ratio_low=-0.1"], 1, f"{A}.clip_ratio_low=-0.1 must be ≥ 0"),
    (G, [f"{A}.clip_ratio=-0.5", f"{A}.clip_ratio_low=null"], 1, f"{A}.clip_ratio=-0.5 must be ≥ 0"),
    (G, [f"{A}.clip_ratio_high=-0.2"], 1, f"{A}.clip_ratio_high=-0.2 must be ≥ 0"),
    (P, ["critic.cliprange_value=0"], 1, "critic.cliprange_value=0.0 must be > 0"),
    (G, [f"{R}.temperature=0"], 1, f"{R}.temperature=0.0 must be > 0"),
    (G, [f"{R}.top_p=0"], 1, f"{R}.top_p=0.0 must be in (0, 1]"),
    (G, [f"{R}.top_p=1.5"], 1, f"{R}.top_p=1.5 must be in (0, 1]"),
    (G, [f"{R}.top_k=0"], 1, f"{R}.top_k=0 must be -1 (off) or ≥ 1"),
    (P, ["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=0"], 1,
     "algorithm.kl_ctrl.horizon=0 must be > 0"),
    (P, ["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0"], 1,
     "algorithm.kl_ctrl.target_kl=0.0 must be > 0"),
    (G, ["algorithm.gamma=1.5"], 1, "algorithm.gamma=1.5 must be in [0, 1]"),
    (G, [f"{A}.optim.lr=0"], 1, f"{A}.optim.lr=0.0 must be > 0"),
    (G, [f"{A}.loss_scale_factor=0"], 1, f"{A}.loss_scale_factor=0.0 must be > 0"),
    # combinations
    (P, ["critic.enable=false"], 1, "critic.enable=false but algorithm.adv_estimator=gae needs a critic"),
    (G, ["algorithm.rollout_correction.bypass_mode=true", f"{R}.calculate_log_probs=false"], 1,
     "bypass_mode=true needs actor_rollout_ref.rollout.calculate_log_probs=true"),
    (G, ["algorithm.rollout_correction.rollout_is=token", f"{R}.calculate_log_probs=false"], 1,
     "rollout_is='token' needs actor_rollout_ref.rollout.calculate_log_probs=true"),
    (G, [f"{R}.multi_turn.enable=true"], 1, f"{R}.multi_turn.max_assistant_turns=None"),
    (G, [f"{R}.multi_turn.enable=true", f"{R}.multi_turn.max_assistant_turns=0"], 1,
     "needs a turn limit ≥ 1"),
    (G, [f"{R}.max_model_len=40"], 1,
     f"{R}.max_model_len=40 is shorter than data.max_prompt_length + data.max_response_length = 48"),
    (G, [f"{R}.max_model_len=0"], 1, f"{R}.max_model_len=0 must be a positive integer (or null)"),
    (G, [f"{R}.name=vllm", f"{R}.multi_turn.enable=true", f"{R}.multi_turn.max_assistant_turns=2",
         f"{R}.agent.default_agent_loop=tool_agent"], 1, "tool agent runs on the hf engine"),
    (G, ["actor_rollout_ref.model.lora_rank=-1"], 1, "actor_rollout_ref.model.lora_rank=-1 must be ≥ 0"),
    (P, ["critic.model.lora_rank=-1"], 1, "critic.model.lora_rank=-1 must be ≥ 0"),
    (G, ["actor_rollout_ref.model.target_modules=[]"], 1,
     "actor_rollout_ref.model.target_modules=[] must be"),
    (G, ["data.train_files=[]"], 1, "data.train_files is empty"),
    (G, ["data.val_files=[]"], 1, "data.val_files is empty"),
    (G, ["actor_rollout_ref.model.path=''"], 1, "actor_rollout_ref.model.path is empty"),
    # trainer
    (G, ["trainer.total_training_steps=0"], 1, "trainer.total_training_steps=0 must be a positive integer"),
    (G, ["trainer.record_freq=0"], 1, "trainer.record_freq=0 is not valid"),
    (G, ["trainer.save_freq=0"], 1, "trainer.save_freq=0 is not valid"),
    (G, ["trainer.test_freq=-2"], 1, "trainer.test_freq=-2 is not valid"),
    (G, ["trainer.critic_warmup=-1"], 1, "trainer.critic_warmup=-1 must be ≥ 0"),
    (G, [], 0, "world_size=0 must be a positive int"),
] + [  # every positive-int field rejects 0
    (preset, [f"{key}=0"], 1, f"{key}=0 must be a positive integer") for preset, key in [
        (G, "data.train_batch_size"), (G, "data.max_prompt_length"), (G, "data.max_response_length"),
        (G, "data.val_max_samples"), (G, f"{R}.n"), (G, f"{A}.ppo_mini_batch_size"), (G, f"{A}.ppo_epochs"),
        (G, f"{A}.ppo_micro_batch_size_per_gpu"), (G, f"{A}.ppo_max_token_len_per_gpu"),
        (G, f"{R}.log_prob_micro_batch_size_per_gpu"), (G, f"{R}.log_prob_max_token_len_per_gpu"),
        (G, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"), (G, f"{R}.val_kwargs.n"),
        (G, f"{R}.multi_turn.max_tool_response_length"), (G, "trainer.total_epochs"), (G, "trainer.nnodes"),
        (G, "trainer.n_gpus_per_node"), (G, "actor_rollout_ref.model.lora_alpha"), (P, "critic.ppo_epochs"),
        (P, "critic.ppo_mini_batch_size"), (P, "critic.ppo_micro_batch_size_per_gpu"),
    ]
]


@pytest.mark.parametrize("preset, overrides, world_size, message", VALIDATION_CASES,
                         ids=[f"{p}:{' '.join(o) or 'ws=' + str(w)}" for p, o, w, _ in VALIDATION_CASES])
def test_validation_errors_name_the_field(preset, overrides, world_size, message):
    with pytest.raises(ConfigError) as e:
        load_config(preset, overrides, world_size=world_size)
    assert message in str(e.value)
    assert any(message in err for err in e.value.errors)


def test_all_errors_reported_at_once():
    with pytest.raises(ConfigError) as e:
        load_config(G, ["trainer.save_freq=0", f"{R}.temperature=0", f"{A}.clip_ratio_c=0.5"])
    assert len(e.value.errors) == 3 and str(e.value).startswith("3 config errors")


def test_validate_on_hand_built_config_does_not_mutate_it():
    cfg = load_quiet(P)
    cfg.critic.ppo_mini_batch_size = None
    before = to_dict(cfg)
    assert validate(cfg) == []
    assert to_dict(cfg) == before


# ------------------------------------------------------------------------------------------------ notices


def test_both_kl_paths_emit_a_notice_once():
    with pytest.warns(ConfigNotice, match=r"both KL paths are on.*§7\.4") as record:
        load_config(G, ["algorithm.use_kl_in_reward=true"])
    assert sum("both KL paths" in str(w.message) for w in record) == 1
    cfg = load_quiet(G)
    cfg.algorithm.use_kl_in_reward = True
    assert any("both KL paths" in n for n in validate(cfg))


def test_clip_ratio_set_alone_is_not_the_window_and_says_so():
    """verl 0.9.1: clip_ratio_low/high default to 0.2 and win; clip_ratio is only their fallback (chapter §4.4)."""
    from ppolab.algos.policy_loss import clip_bounds

    with pytest.warns(ConfigNotice, match=rf"{A}\.clip_ratio=0\.1 is not the clip window.*0\.2/0\.2"):
        cfg = load_config(G, [f"{A}.clip_ratio=0.1"])
    assert clip_bounds(cfg.actor_rollout_ref.actor) == (0.2, 0.2)
    both = load_quiet(G, [f"{A}.clip_ratio_low=0.1", f"{A}.clip_ratio_high=0.1"])
    assert clip_bounds(both.actor_rollout_ref.actor) == (0.1, 0.1)  # verl's 0.2 clip_ratio unread: no notice…
    fallback = load_quiet(G, [f"{A}.clip_ratio=0.1", f"{A}.clip_ratio_low=null", f"{A}.clip_ratio_high=null"])
    assert clip_bounds(fallback.actor_rollout_ref.actor) == (0.1, 0.1)  # …read only where both are null


def test_sum_norm_without_scale_factor_is_a_notice():
    with pytest.warns(ConfigNotice, match=f"{A}.loss_scale_factor=null"):
        load_config(G, [f"{A}.loss_agg_mode=seq-mean-token-sum-norm"])
    load_quiet(G, [f"{A}.loss_agg_mode=seq-mean-token-sum-norm", f"{A}.loss_scale_factor=16"])


def test_a_batch_that_does_not_divide_is_padded_with_a_notice():
    # grpo_tiny: 12 prompts × 8 = 96 rows, mini 8 × 8 = 64: verl V1 pads to 128 (padding_utils, chapter §9).
    with pytest.warns(ConfigNotice, match=r"12×8 = 96 rows is not a multiple of .* = 64: every step adds 32 "):
        cfg = load_config(G, ["data.train_batch_size=12"])
    from ppolab.batching import plan_batches
    plan = plan_batches(12, 8, 8, 1, 32, 2, pad_to=64)
    assert (plan.padding_rows, plan.optimizer_steps_per_epoch, plan.rows_per_rank) == (32, 2, 128)
    # ppo_gae_tiny with a critic mini-batch of 24: lcm(16, 24) = 48, so 64 rows get 32 padding rows
    with pytest.warns(ConfigNotice, match="= 48: every step adds 32 synthetic padding rows"):
        load_config(P, ["critic.ppo_mini_batch_size=24", "critic.ppo_micro_batch_size_per_gpu=8"])
    assert cfg.data.train_batch_size == 12


def test_ppo_fire_tiny_emits_exactly_its_two_deliberate_notices():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", ConfigNotice)
        cfg = load_config("ppo_fire_tiny", world_size=2)
    notices = sorted(str(w.message)[:20] for w in record if issubclass(w.category, ConfigNotice))
    assert notices == ["both KL paths are on", "data.train_batch_siz"]
    assert "every step adds 4 synthetic padding rows" in " ".join(str(w.message) for w in record)
    assert cfg.actor_rollout_ref.actor.entropy_coeff > 0 and cfg.algorithm.kl_ctrl.type == "adaptive"


def test_grpo_with_vanilla_loss_is_not_a_notice():
    cfg = load_quiet(G)  # grpo advantages + the default vanilla clipped loss is normal (chapter §5.1)
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla" and validate(cfg) == []


# ------------------------------------------------------------------------------------------------ resolve


def test_critic_inherits_from_actor():
    cfg = load_quiet(P, [f"{A}.ppo_epochs=2", f"{A}.shuffle=true", f"{A}.loss_agg_mode=seq-mean-token-mean",
                         f"{A}.loss_scale_factor=16"])
    a, m, c = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.model, cfg.critic
    assert (c.ppo_mini_batch_size, c.ppo_epochs, c.shuffle) == (a.ppo_mini_batch_size, 2, True)
    assert (c.loss_agg_mode, c.loss_scale_factor) == ("seq-mean-token-mean", 16.0)
    assert (c.model.path, c.model.lora_rank, c.model.lora_alpha) == (m.path, m.lora_rank, m.lora_alpha)
    assert c.model.target_modules == m.target_modules and c.model.target_modules is not m.target_modules
    assert cfg.data.seed == cfg.trainer.seed
    own = load_quiet(P, ["critic.ppo_epochs=3", "critic.model.lora_rank=4", "critic.loss_agg_mode=token-sum"])
    assert (own.critic.ppo_epochs, own.critic.model.lora_rank, own.critic.loss_agg_mode) == (
        3, 4, "token-sum")
    assert PPOConfig().resolve().resolve().critic.ppo_mini_batch_size == 256  # idempotent


# ------------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("name", ["grpo_tiny", "ppo_gae_tiny", "grpo_qwen_gpu"])
def test_to_dict_from_dict_round_trip(name):
    cfg = load_quiet(name)
    d = to_dict(cfg)
    assert json.loads(json.dumps(d)) == d
    again = from_dict(json.loads(json.dumps(d)))
    assert again == cfg and isinstance(again.actor_rollout_ref.actor.optim.betas, tuple)
    assert from_dict(yaml.safe_load(to_yaml(cfg))) == cfg
    with pytest.raises(ConfigError, match="unknown config key trainer.bogus"):
        from_dict({**d, "trainer": {**d["trainer"], "bogus": 1}})


# ------------------------------------------------------------------------------------------ speed / imports


def test_validation_is_fast():
    cfg = load_quiet(P)
    validate(cfg)  # first call may import the formula core (torch); the checks themselves must be cheap
    t0 = time.perf_counter()
    for _ in range(10):
        validate(cfg)
    assert (time.perf_counter() - t0) / 10 < 0.05


def test_import_and_compose_do_not_import_torch():
    code = ("import sys, ppolab.config as c; cfg = c.from_dict(c.to_dict(c.PPOConfig())); c.to_yaml(cfg); "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_registries_hold_exactly_the_vocabulary_and_algos_never_imports_config():
    """One list of names (ppolab.vocab): the registries match it, validation uses it, and the formula core does not
    import ppolab.config (config → vocab ← algos, never algos → config)."""
    from ppolab import algos, vocab

    assert sorted(algos.POLICY_LOSS_REGISTRY) == sorted(vocab.POLICY_LOSS_MODES)
    assert sorted(algos.ADV_ESTIMATOR_REGISTRY) == sorted(vocab.ADV_ESTIMATORS)
    names = loader.registry_names()
    assert names["loss_mode"] == vocab.POLICY_LOSS_MODES and names["adv_estimator"] == vocab.ADV_ESTIMATORS
    assert "full" not in names["kl"]
    code = ("import sys, ppolab.algos; bad = [m for m in sys.modules if m.startswith('ppolab.config')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)

def test_verls_real_train_batch_size_check():
    """verl 0.9.1 validate_config: without the actor's use_dynamic_bsz, train_batch_size × n must divide over the GPUs
    (real_train_batch_size % n_gpus == 0) — a check beside train_batch_size ≥ ppo_mini_batch_size."""
    odd = ["data.train_batch_size=3", "actor_rollout_ref.rollout.n=3", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"]
    with pytest.raises(ConfigError, match=r"3×3 = 9 trajectories is not divisible by the 2 GPUs"):
        load_config("grpo_tiny", odd, world_size=2)
    load_config("grpo_tiny", odd, world_size=1)
    load_config("grpo_tiny", [*odd, "actor_rollout_ref.actor.use_dynamic_bsz=true"], world_size=3)


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_a_group_of_one_is_a_notice_not_a_stop(estimator):
    # verl 0.9.1 core_algos.py: `if len(id2score[idx]) == 1: mean, std = 0, 1` — the raw score is the advantage
    with pytest.warns(ConfigNotice, match=rf"{R}\.n=1 with algorithm\.adv_estimator={estimator}: .*the raw score"):
        load_config(G, [f"{R}.n=1", f"algorithm.adv_estimator={estimator}", f"{A}.ppo_micro_batch_size_per_gpu=8"])


def test_a_lower_clip_bound_below_zero_is_a_notice_not_a_stop():
    # verl's CISPO example sets clip_ratio_low=10 on purpose, and verl's validate_config passes it (issue 53)
    with pytest.warns(ConfigNotice, match="clip_ratio_low=10.0 ≥ 1"):
        cfg = load_config(G, [f"{A}.policy_loss.loss_mode=cispo", f"{A}.clip_ratio_low=10",
                              f"{A}.clip_ratio_high=0.28"])
    notices = validate(cfg)
    assert [n for n in notices if "clip_ratio_low=10" in n] == [
        f"{A}.clip_ratio_low=10.0 ≥ 1: the ratio's lower bound 1 − ε_low = -9 is never reached, so no token is "
        "clipped from below (verl runs it; its CISPO example sets clip_ratio_low=10 for exactly this)"], notices


def in_both_languages(make):
    """``make()`` in English, then under set_language("zh") (English again afterwards); every string it asked ``tr``
    for has a table entry."""
    from ppolab import i18n

    before = i18n.missing()
    en = make()
    i18n.set_language("zh")
    try:
        zh = make()
    finally:
        i18n.set_language("en")
    assert i18n.missing() == before, i18n.missing() - before
    return en, zh


def test_config_notices_speak_chinese():
    """Issue 55: validate()'s notices are whole i18n templates — Chinese under set_language("zh") (config keys,
    numbers and the glossary's English terms stay), and word for word as before in English."""
    from test_i18n import english_words
    from test_zh_terms import punct_problems

    cases = [(G, [f"{A}.clip_ratio=0.1"]),
             (G, [f"{R}.n=1", "algorithm.adv_estimator=rloo", f"{A}.ppo_micro_batch_size_per_gpu=8"]),
             (G, ["data.train_batch_size=12", "algorithm.use_kl_in_reward=true"]),
             (P, ["critic.ppo_micro_batch_size_per_gpu=2"]),
             (G, [f"{A}.policy_loss.loss_mode=dppo_tv", "algorithm.kl_ctrl.type=adaptive"])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigNotice)
        cfgs = [load_config(preset, overrides) for preset, overrides in cases]
    en, zh = in_both_languages(lambda: [validate(cfg) for cfg in cfgs])
    assert [len(n) for n in en] == [len(n) for n in zh] == [1, 1, 2, 1, 2], en
    assert en == [validate(cfg) for cfg in cfgs]  # the language is English again
    assert en[0] == [f"{A}.clip_ratio=0.1 is not the clip window: clip_ratio_low and clip_ratio_high are set "
                     "(0.2/0.2; verl's defaults are 0.2/0.2) and clip_ratio is read only where they are null "
                     "(chapter §4.4); set those two for the window you mean"]
    assert en[2] == [
        "both KL paths are on (algorithm.use_kl_in_reward and actor_rollout_ref.actor.use_kl_loss): the reference KL "
        "shapes the rewards AND is added to the loss, so it is applied twice (chapter §7.4); turn one off unless this "
        "is intended",
        f"data.train_batch_size × {R}.n = 12×8 = 96 rows is not a multiple of lcm(world_size, mini-batch × n) = 64: "
        "every step adds 32 synthetic padding rows (response_mask 0, is_pad; verl V1 padding_utils, chapter §9) that "
        "count in seq-mean denominators"]
    assert en[3] == [
        "critic.ppo_micro_batch_size_per_gpu=2 (with critic.use_dynamic_bsz=false) is ignored: verl V1 does not pass "
        "it to the critic engine, which cuts both the value forward (stage 6) and the critic update (stage 8) by the "
        "token budget critic.ppo_infer_max_token_len_per_gpu=32768 (on verl's command line "
        "+critic.ppo_infer_max_token_len_per_gpu=…; chapter §11.6); the critic's mini-batches of 16 rows are not cut "
        "into 2-row micro-batches"]
    assert en[4][1] == ("algorithm.kl_ctrl.type=adaptive has no effect: the controller only drives the reward-side KL "
                        "and algorithm.use_kl_in_reward=false")
    assert zh[4][1] == ("algorithm.kl_ctrl.type=adaptive 不起作用：controller 只驱动 reward-side KL，而 "
                        "algorithm.use_kl_in_reward=false")
    assert "本章 §11.6" in zh[3][0] and "第 6 阶段" in zh[3][0] and "96 行" in zh[2][1], zh
    for e, z in zip(sum(en, []), sum(zh, [])):
        assert re.search(r"[\u4e00-\u9fff]", z) and not english_words(z), (z, english_words(z))
        assert not punct_problems(z, en=e), (z, punct_problems(z, en=e))
        assert z.split("=")[0] == e.split("=")[0] or z.startswith("两条 KL"), (e, z)  # the dotted key leads


#: Settings verl's threshold parsers refuse (ppolab.algos.correction), one per refusal a config can reach.
REFUSED_THRESHOLDS = [
    ["algorithm.rollout_correction.rollout_rs_threshold='1.02,0.002,3'"],
    ["algorithm.rollout_correction.rollout_rs_threshold='1.02,2x'"],
    ["algorithm.rollout_correction.rollout_rs_threshold='1.02,0.5_2'"],
    ["algorithm.rollout_correction.rollout_rs_threshold='1.02,-1'"],
    ["algorithm.rollout_correction.rollout_rs_threshold='2_1.5,0.002'"],
    ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold='3_2'"],
    ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold='x_2'"],
    ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold='-1_2'"],
]


def test_verls_threshold_refusals_speak_chinese():
    """Issue 55: a rollout-correction threshold verl's parser refuses is quoted in verl's words in English and
    wholly in Chinese under set_language("zh") — the parser's message was English inside the Chinese line."""
    from test_i18n import english_words

    from ppolab.algos.correction import SpecError, parse_is_threshold, parse_rollout_rs

    def refusal(overrides):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigNotice)
            with pytest.raises(ConfigError) as e:
                load_config("ppo_fire_tiny", overrides)
        return str(e.value)

    en, zh = in_both_languages(lambda: [refusal(o) for o in REFUSED_THRESHOLDS])
    assert len(set(en)) == len(REFUSED_THRESHOLDS)
    for e_line, z_line in zip(en, zh):
        assert not english_words(z_line), (z_line, english_words(z_line))
        assert english_words(e_line)  # the English line is prose, so the check above can fail
    # the English is verl's wording, as the parsers raise it
    with pytest.raises(SpecError) as e:
        parse_rollout_rs("token_k1,seq_max_k2", "1.02,2x")
    assert str(e.value) == "Invalid numeric threshold '2x' for option 'seq_max_k2'." and str(e.value) in en[1]
    with pytest.raises(ValueError, match=re.escape("rollout_is_threshold lower bound must be <= upper bound.")):
        parse_is_threshold("3_2")
