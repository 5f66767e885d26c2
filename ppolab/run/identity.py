"""Whether a resume continues the same run: the fields that define a run, and fingerprints of its files.

A resume continues *the same* run: :func:`resume_changes` compares the new config with the recorded one. Fields
that change what the run is (:data:`IDENTITY_FIELDS`: model, data, batch arithmetic, estimator, loss, LoRA
shape, seeds, …) stop before any model loads, listing each as ``key: old → new``; the fields of
:data:`RESUMABLE_FIELDS` (how long, how often to log / save / record, the device, memory-only batching) may change,
and each resume is recorded in ``config.json`` (``resumes``: the step and the changed fields), so the run dir
says what produced every step. Model and data files are fingerprinted too: the same path with other weights is a
change, the same weights at a new path is not.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ppolab.run.files import read_json

#: Fields that may differ on a resume: how long and where the run goes on, what it logs, saves and records, and
#: knobs that only change memory use (micro-batching and inference batching: the update is the same, chapter §13,
#: up to float rounding; gradient checkpointing recomputes the same activations; packed rows compute the same
#: outputs). Validation-only settings too.
RESUMABLE_FIELDS = frozenset({
    "data.val_files", "data.val_max_samples",
    "actor_rollout_ref.model.enable_gradient_checkpointing", "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.actor.use_remove_padding",
    "critic.model.use_remove_padding",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.rollout.free_cache_engine", "actor_rollout_ref.rollout.max_model_len",
    "actor_rollout_ref.rollout.val_kwargs.top_k", "actor_rollout_ref.rollout.val_kwargs.top_p",
    "actor_rollout_ref.rollout.val_kwargs.temperature", "actor_rollout_ref.rollout.val_kwargs.n",
    "actor_rollout_ref.rollout.val_kwargs.do_sample",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    "critic.ppo_micro_batch_size_per_gpu", "critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu",
    "critic.ppo_infer_max_token_len_per_gpu",
    "custom_reward_function.timeout_s",
    "trainer.total_training_steps", "trainer.total_epochs", "trainer.run_dir", "trainer.project_name",
    "trainer.experiment_name", "trainer.logger", "trainer.save_freq", "trainer.test_freq", "trainer.record_freq",
    "trainer.record_update_state",
    "trainer.device", "trainer.resume", "trainer.val_before_train", "trainer.n_gpus_per_node", "trainer.nnodes",
})

#: Fields that define the run: a resume with any of these changed would train a different run on top of the
#: first one's checkpoint, so it stops before any model loads.
IDENTITY_FIELDS = frozenset({
    "data.train_files", "data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
    "data.shuffle", "data.seed",
    "actor_rollout_ref.model.path", "actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.model.target_modules", "actor_rollout_ref.model.dtype",
    "actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high", "actor_rollout_ref.actor.clip_ratio_c",
    "actor_rollout_ref.actor.tau_pos",
    "actor_rollout_ref.actor.tau_neg", "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.calculate_entropy", "actor_rollout_ref.actor.calculate_sum_pi_squared",
    "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.actor.kl_loss_type", "actor_rollout_ref.actor.loss_agg_mode",
    "actor_rollout_ref.actor.loss_scale_factor", "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio", "actor_rollout_ref.actor.policy_loss.clip_cov_lb",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub", "actor_rollout_ref.actor.policy_loss.kl_cov_ratio",
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef", "actor_rollout_ref.actor.policy_loss.dro_beta",
    "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is",
    "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is_threshold",
    "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is_batch_normalize",
    "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_rs",
    "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_rs_threshold",
    "actor_rollout_ref.actor.policy_loss.rollout_correction.bypass_mode",
    "actor_rollout_ref.actor.policy_loss.rollout_correction.loss_type",
    "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_epochs",
    "actor_rollout_ref.actor.shuffle", "actor_rollout_ref.actor.data_loader_seed",
    "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.actor.optim.betas",
    "actor_rollout_ref.actor.optim.weight_decay", "actor_rollout_ref.actor.optim.clip_grad",
    "actor_rollout_ref.actor.optim.lr_warmup_steps", "actor_rollout_ref.actor.global_batch_info",
    "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.temperature",
    "actor_rollout_ref.rollout.top_p", "actor_rollout_ref.rollout.top_k", "actor_rollout_ref.rollout.dtype",
    "actor_rollout_ref.rollout.calculate_log_probs",
    "actor_rollout_ref.rollout.multi_turn.enable", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
    "actor_rollout_ref.rollout.agent.default_agent_loop",
    "critic.enable", "critic.model.path", "critic.model.lora_rank", "critic.model.lora_alpha",
    "critic.model.target_modules", "critic.ppo_mini_batch_size", "critic.ppo_epochs", "critic.shuffle",
    "critic.data_loader_seed", "critic.cliprange_value", "critic.loss_agg_mode", "critic.loss_scale_factor",
    "critic.optim.lr", "critic.optim.betas", "critic.optim.weight_decay", "critic.optim.clip_grad",
    "critic.optim.lr_warmup_steps",
    "algorithm.adv_estimator", "algorithm.gamma", "algorithm.lam", "algorithm.norm_adv_by_std_in_grpo",
    "algorithm.use_kl_in_reward", "algorithm.kl_penalty", "algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef",
    "algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.target_kl",
    "algorithm.rollout_correction.rollout_is", "algorithm.rollout_correction.rollout_is_threshold",
    "algorithm.rollout_correction.rollout_is_batch_normalize", "algorithm.rollout_correction.rollout_rs",
    "algorithm.rollout_correction.rollout_rs_threshold", "algorithm.rollout_correction.bypass_mode",
    "algorithm.rollout_correction.loss_type", "algorithm.gdpo_reward_keys", "algorithm.gdpo_reward_weights",
    "custom_reward_function.path", "custom_reward_function.name",
    "trainer.seed", "trainer.critic_warmup",
})

#: Path-valued identity fields whose *contents* are fingerprinted (a model retrained in place is another model).
FINGERPRINTED_FIELDS = ("actor_rollout_ref.model.path", "critic.model.path", "data.train_files",
                        "custom_reward_function.path")


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (an empty dict is a leaf)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ====================================================================== fingerprints of model and data files
_HEAD = 4 << 20  # bytes hashed at each end of a large file: enough to tell two trainings apart, cheap at 10 GB


def _file_digest(path: Path, h) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}:{size}:".encode())
    with open(path, "rb") as f:
        if size <= 4 * _HEAD:
            h.update(f.read())
        else:
            h.update(f.read(_HEAD))
            f.seek(size // 2)
            h.update(f.read(_HEAD))
            f.seek(size - _HEAD)
            h.update(f.read(_HEAD))


def fingerprint(value: Any) -> str | None:
    """A short digest of what a path-valued field points at (a file, a model folder's config, weights and
    tokenizer files, or a list of files); None when it is empty or does not exist."""
    paths = [value] if isinstance(value, (str, os.PathLike)) else list(value or [])
    files: list[Path] = []
    for p in (Path(str(v)).expanduser() for v in paths if v):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files += sorted(f for f in p.iterdir() if f.is_file() and (
                f.suffix in (".safetensors", ".bin", ".json", ".model", ".txt") and not f.name.startswith(".")))
    return files_digest(files)


def files_digest(files: list[Path]) -> str | None:
    """16 hex digits of sha256 over the files (name, size, contents); None for no file."""
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        _file_digest(f, h)
    return h.hexdigest()[:16]


def folder_fingerprint(folder: Path) -> str | None:
    """A short digest of every file of ``folder`` (names and contents, dot-files aside): a run's ``tokenizer/``,
    whose chat template (``chat_template.jinja``) counts as much as its vocabulary. None for a missing or empty
    folder."""
    return files_digest(folder_files(folder))


def folder_files(folder: Path) -> list[Path]:
    """The files :func:`folder_fingerprint` covers: every file of ``folder`` but its dot-files, sorted."""
    return sorted(f for f in Path(folder).iterdir() if f.is_file() and not f.name.startswith(".")) \
        if Path(folder).is_dir() else []


def fingerprints(flat_config: dict[str, Any]) -> dict[str, str | None]:
    """The fingerprint of every field of :data:`FINGERPRINTED_FIELDS` in a flattened config."""
    return {key: fingerprint(flat_config.get(key)) for key in FINGERPRINTED_FIELDS}


# ====================================================================== comparing a resume with its run
def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value


def resume_changes(recorded: dict[str, Any], new: dict[str, Any], recorded_prints: dict[str, Any] | None = None,
                   new_prints: dict[str, Any] | None = None) -> tuple[list[str], dict[str, list[Any]]]:
    """Compare a run's recorded config with the config it is resumed with (both nested dicts, as ``to_dict``).

    Returns ``(refused, allowed)``: ``refused`` lines ``key: old → new`` for :data:`IDENTITY_FIELDS` that differ
    (a fingerprinted path whose contents changed counts, a path moved with the same contents does not); ``allowed``
    ``{key: [old, new]}`` for the rest that differ. A field in neither list (a config key newer than this module)
    is refused: when in doubt, a resume does not mix."""
    old_flat, new_flat = flatten(recorded), flatten(new)
    recorded_prints, new_prints = recorded_prints or {}, new_prints or {}
    refused, allowed = [], {}
    for key in sorted(set(old_flat) | set(new_flat)):
        old, value = old_flat.get(key), new_flat.get(key)
        if key in FINGERPRINTED_FIELDS and key in recorded_prints and recorded_prints[key] is not None:
            before, after = recorded_prints[key], new_prints.get(key)
            if before != after:
                what = "its files changed" if old == value else "other files"
                refused.append(f"{key}: {_shown(old)} → {_shown(value)} ({what}: fingerprint {before} → {after})")
            elif old != value:
                allowed[key] = [old, value]  # the same files at a new path
            continue
        if old == value:
            continue
        if key in RESUMABLE_FIELDS:
            allowed[key] = [old, value]
        else:
            refused.append(f"{key}: {_shown(old)} → {_shown(value)}")
    return refused, allowed


def check_resume(run_dir: Path, new_config: dict[str, Any]) -> dict[str, list[Any]]:
    """Refuse (:class:`ppolab.errors.RunDirError`) a resume of ``run_dir`` whose config changes what the run is;
    return the allowed changes. Reads ``config.json`` only (before any model loads)."""
    from ppolab.errors import RunDirError

    meta = read_json(run_dir / "config.json")
    recorded = meta.get("config", {}) if isinstance(meta, dict) else {}
    refused, allowed = resume_changes(recorded, new_config, meta.get("fingerprints"),
                                      fingerprints(flatten(new_config)))
    if refused:
        lines = "\n  ".join(refused)
        raise RunDirError(f"trainer.resume=true but this config is not the one {run_dir} was trained with "
                          f"({run_dir / 'config.json'}):\n  {lines}\nresume with the recorded values, or give a "
                          "new trainer.run_dir to train the changed config — nothing in the run was changed")
    return allowed

