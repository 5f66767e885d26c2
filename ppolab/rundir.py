"""Which folder a run may write, and whether a resume continues the same run.

A run directory is a folder ppolab made: before any model loads, :func:`claim_run_dir` refuses a non-empty
folder that is not a ppolab run (a model directory given as ``trainer.run_dir`` would be overwritten), then takes
an OS lock on ``.ppolab-run`` that it holds for the run's lifetime, so a second writer stops at once, naming the
process that holds the folder. The lock is the kernel's (``fcntl.flock``): it goes away with its process, so a
claim left by a killed process is recognised as stale (the pid it names is gone) and reported when it is taken
over, never taken silently.

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
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterable

#: The claim file: its presence marks a folder ppolab made; its ``flock`` marks the process writing it now.
CLAIM_FILE = ".ppolab-run"

# ====================================================================== the resume policy, field by field
#: Fields that may differ on a resume: how long and where the run goes on, what it logs, saves and records, and
#: knobs that only change memory use (micro-batching and inference batching: the update is the same, chapter §13,
#: up to float rounding; gradient checkpointing recomputes the same activations). Validation-only settings too.
RESUMABLE_FIELDS = frozenset({
    "data.val_files", "data.val_max_samples",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
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


#: What a reader advises for a run dir's file that is damaged (the recorder wrote it whole; something else broke it).
REDO = "re-record the run (python -m ppolab.train with a new trainer.run_dir)"


#: The largest JSON file a reader opens whole (a step's texts and plan are a few MB at a real batch).
MAX_JSON_BYTES = 256 * 2**20
#: The longest line a JSON-lines reader takes (characters): a step's metrics are a few kB on one line.
MAX_LINE_CHARS = 16 * 2**20


def regular_file(path: str | os.PathLike, limit: int | None = None,
                 todo: str = "a run's files are plain files; put the file the recorder wrote there") -> Path:
    """``path`` when it is a regular file (after links) of at most ``limit`` bytes, else
    :class:`ppolab.errors.FileFormatError` naming it: a link to ``/dev/zero``, a FIFO or a folder would be read until
    memory runs out, or block, before anything could say why."""
    import stat

    from ppolab.errors import FileFormatError, MissingFileError

    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise MissingFileError(f"{path} is missing") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a device, pipe or socket, not a file"
        raise FileFormatError(f"{path} is {kind}{' (through a link)' if path.is_symlink() else ''}: {todo}") from None
    if limit is not None and st.st_size > limit:
        raise FileFormatError(f"{path} is {st.st_size / 2**20:.0f} MB, more than the {limit / 2**20:.0f} MB a "
                              f"reader opens whole: not a file the recorder wrote") from None
    return path


def json_lines(path: str | os.PathLike, todo: str) -> Iterable[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of a JSON-lines file, read line by line from a regular file
    (:func:`regular_file`), so memory stays bounded whatever its size; a line that does not parse (a torn write, an
    edit) is :class:`ppolab.errors.FileFormatError` naming the file, the line and ``todo``. The one reader of
    metrics.jsonl and of a verl job's FileLogger file; each checks what its lines must hold."""
    from ppolab.errors import FileFormatError

    # utf-8-sig: a byte-order mark an editor put at the start is not a torn line
    with open(regular_file(path), encoding="utf-8-sig", errors="replace") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_CHARS + 1), ""), 1):
            if len(line) > MAX_LINE_CHARS:
                raise FileFormatError(f"{path}, line {number}: longer than {MAX_LINE_CHARS // 2**20} MB (a step's "
                                      f"line is a few kB), read no further: not a line ppolab or verl wrote; {todo}")
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as e:
                raise FileFormatError(f"{path}, line {number}: not valid JSON ({e.msg}), a torn or edited line; "
                                      f"{todo}") from None
            except RecursionError:  # json's C parser stops at Python's recursion limit
                raise FileFormatError(f"{path}, line {number}: JSON nested deeper than {sys.getrecursionlimit()} "
                                      f"levels (a step's line is a flat object): not a line ppolab or verl wrote; "
                                      f"{todo}") from None


def read_json(path: str | os.PathLike, todo: str = REDO) -> Any:
    """A JSON file (a regular file of at most :data:`MAX_JSON_BYTES`), or :class:`ppolab.errors.FileFormatError`
    naming it and ``todo``."""
    from ppolab.errors import FileFormatError

    path = regular_file(path, MAX_JSON_BYTES)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FileFormatError(f"{path} does not parse as JSON ({e}); {todo}") from None


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


# ====================================================================== claiming a folder
def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def is_ppolab_dir(folder: Path) -> bool:
    """Whether ``folder`` was made by ppolab: it carries the claim file, or (a run recorded before claims existed)
    its ``config.json`` is the recorder's (``{"config": …, "batch_plan": …}``)."""
    if (folder / CLAIM_FILE).is_file():
        return True
    try:
        meta = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "config" in meta and "batch_plan" in meta


def _describe(entries: list[str]) -> str:
    shown = ", ".join(entries[:6]) + (f", … ({len(entries)} entries)" if len(entries) > 6 else "")
    looks = ""
    if "config.json" in entries and any(e.endswith((".safetensors", ".bin")) or e.startswith("tokenizer")
                                        for e in entries):
        looks = ": it looks like a model directory"
    elif any(e.endswith(".parquet") for e in entries):
        looks = ": it looks like a data folder"
    return shown + looks


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def read_claim(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):  # being written by its holder this very moment, or damaged
        return {}


def claim_holder(info: dict[str, Any]) -> str:
    if not info.get("pid"):
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"])) if info.get("started") else "?"
    return f"process {info['pid']} on {info.get('host', '?')} (started {started}: {info.get('command', '?')})"


class RunDirClaim:
    """The lock a training process holds on its run directory (see the module docstring). ``stale`` is the
    description of a dead process's claim that was taken over, or None."""

    def __init__(self, folder: Path, fd: int, stale: str | None, info: dict[str, Any], previous: bytes,
                 made: list[Path]):
        self.folder, self._fd, self.stale, self.info, self._previous = folder, fd, stale, info, previous
        self._made = made  # the folders the claim created (removed again when the start is refused)
        self.used = False  # set once the run wrote into the folder (the recorder exists)

    def release(self) -> None:
        """Mark the claim released and drop the lock (the file stays: it marks a folder ppolab made; removing it
        would let a waiting process lock a file nobody else sees). A claim that was never ``used`` (the start was
        refused, e.g. a resume with another config) puts back what the file said before: nothing changed."""
        if self._fd < 0:
            return
        try:
            if self.used:
                _write_claim(self._fd, {**self.info, "released": time.time()})
            elif self._made:  # a start refused in a folder it made: leave no trace
                (self.folder / CLAIM_FILE).unlink(missing_ok=True)
            else:
                os.ftruncate(self._fd, 0)
                os.pwrite(self._fd, self._previous, 0)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1
        if not self.used:
            for made in self._made:  # innermost first; a folder someone else wrote into stays
                try:
                    made.rmdir()
                except OSError:
                    break

    def __enter__(self) -> RunDirClaim:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200] if sys.argv else "python"}


def _write_claim(fd: int, info: dict[str, Any]) -> None:
    data = json.dumps(info).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def claim_run_dir(folder: str | os.PathLike) -> RunDirClaim:
    """Claim ``folder`` for one training process, before any model loads (see the module docstring).

    Creates it when missing; refuses (:class:`ppolab.errors.RunDirError`) a non-empty folder ppolab did not make,
    naming what is in it, and a folder another live process holds, naming that process. Whether the folder
    already holds a run (resume or refuse) is :func:`ppolab.record.resume_checkpoint`'s decision, made after."""
    import fcntl

    from ppolab.errors import RunDirError

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise RunDirError(f"trainer.run_dir={str(folder)!r} is a file, not a folder; give a new folder")
    entries = [e for e in _entries(folder) if e != CLAIM_FILE]
    if entries and not is_ppolab_dir(folder):
        raise RunDirError(f"trainer.run_dir={str(folder)!r} is not empty and is not a ppolab run "
                          f"({_describe(entries)}); ppolab writes runs only into a new or empty folder, or one of its "
                          "own runs — give a new trainer.run_dir; nothing in it was changed")
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / CLAIM_FILE, os.O_RDWR | os.O_CREAT, 0o666)  # the umask decides, as for every file
    except OSError as e:  # read-only, no permission, a file where a parent folder should be
        raise RunDirError(f"trainer.run_dir={str(folder)!r} cannot be written ({e.strerror or e}); give a folder "
                          "this user can write") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = read_claim(folder / CLAIM_FILE)
        os.close(fd)
        raise RunDirError(f"trainer.run_dir={str(folder)!r} is in use by {claim_holder(holder)}: two trainings never "
                          "write one run dir; wait for it to finish (then resume with trainer.resume=true) or give "
                          "another trainer.run_dir") from None
    raw = (folder / CLAIM_FILE).read_bytes()
    previous = read_claim(folder / CLAIM_FILE)
    stale = None
    if previous.get("pid") and "released" not in previous:  # its holder ended without releasing: killed
        alive = previous.get("host") == socket.gethostname() and pid_alive(int(previous["pid"]))
        stale = (f"{folder} was claimed by {claim_holder(previous)}, which ended without finishing"
                 + (" (that pid is now another process)" if alive else "") + "; taking the claim over")
    info = _me()
    _write_claim(fd, info)
    return RunDirClaim(folder, fd, stale, info, raw, made)


def new_run_dir(base: str | os.PathLike) -> Path:
    """Make and return ``base``, or ``base-2``, ``base-3``, … — the first name not taken (``mkdir`` without
    ``exist_ok`` is atomic, so two trainings started in the same second get different folders)."""
    base, k = Path(base), 1
    base.parent.mkdir(parents=True, exist_ok=True)
    while True:
        path = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            k += 1


# ====================================================================== leftovers of a killed writer
def leftover_temp_files(folder: Path) -> list[Path]:
    """The recorder's temporary files (``.<name>.<random>.tmp``) under ``folder``, and the ``.tokenizer.*.tmp/``
    folder of a tokenizer being saved: a process killed while writing leaves them; nothing reads them."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob(".*.tmp") if p.is_file() or p.is_dir() and not p.is_symlink()
                  and p.parent == folder and p.name.startswith(".tokenizer."))


def remove_leftovers(folder: Path) -> int:
    """Delete :func:`leftover_temp_files`; returns how many."""
    import shutil

    found = leftover_temp_files(folder)
    for p in found:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return len(found)


def describe_leftovers(paths: Iterable[Path]) -> str:
    paths = list(paths)
    return ", ".join(str(p) for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
