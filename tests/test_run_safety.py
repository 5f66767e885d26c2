"""Issue 22: a run belongs to one run, a resume to one config, a reward call to itself — each class of mistake a
new user makes (the wrong folder as run dir, two trainings at once, a resume with other settings, a sloppy reward,
no learning signal, unencodable prompts, device and module typos, bad ``train()`` arguments, a critic of another
vocabulary, a killed writer's leftovers), tried the way that user would trip on it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import ppolab
from ppolab.config import ConfigError, PPOConfig, to_dict
from ppolab.data import load_rl_dataset, make_row
from ppolab.errors import DataError, RewardError, RewardWarning, RunDirError, RunWarning
from ppolab.models import SHIPPED_MODEL, load_tokenizer
from ppolab.run.claim import CLAIM_FILE, claim_run_dir, new_run_dir
from ppolab.run.identity import IDENTITY_FIELDS, RESUMABLE_FIELDS, flatten, resume_changes
from ppolab.train import main, resolve_config
from helpers import NO_VAL, TINY, tree_hash, write_parquet

REPO = Path(__file__).resolve().parents[1]


def leaf_keys(cfg: PPOConfig) -> set[str]:
    return set(flatten(to_dict(cfg)))


def run(tmp_path: Path, *extra: str, name: str = "run", steps: int = 1, **kwargs):
    return ppolab.train("grpo_tiny", [*TINY, *NO_VAL, f"trainer.total_training_steps={steps}",
                                      f"trainer.run_dir={tmp_path / name}", *extra], progress=False, **kwargs)


def resume(run_dir: Path, *extra: str, steps: int = 3):
    return ppolab.train("grpo_tiny", [*TINY, *NO_VAL, f"trainer.total_training_steps={steps}",
                                      f"trainer.run_dir={run_dir}", "trainer.resume=true", *extra], progress=False)


# ====================================================================== a folder that is not a run
@pytest.mark.parametrize("kind", ["model", "data", "notes"])
def test_a_folder_that_is_not_a_run_is_refused_and_left_as_it_was(tmp_path, capsys, kind):
    folder = tmp_path / kind
    if kind == "model":  # the shipped model, copied: it must still load as a model afterwards
        shutil.copytree(SHIPPED_MODEL, folder)
    elif kind == "data":
        folder.mkdir()
        write_parquet(folder / "train.parquet", [make_row("What is 1+1?", 2, "train", 0)])
    else:
        folder.mkdir()
        (folder / "notes.txt").write_text("my notes")
    before = tree_hash(folder)
    with pytest.raises(RunDirError) as e:
        ppolab.train("grpo_tiny", [*TINY, f"trainer.run_dir={folder}"], progress=False)
    message = str(e.value)
    assert str(folder) in message and "not a ppolab run" in message and "new trainer.run_dir" in message
    if kind == "model":
        assert "config.json" in message and "model directory" in message
    assert main([*TINY, f"trainer.run_dir={folder}"]) == 2  # the CLI: one line
    assert "Traceback" not in capsys.readouterr().err
    assert tree_hash(folder) == before and not (folder / CLAIM_FILE).exists()
    if kind == "model":
        load_tokenizer(folder)


def test_an_empty_folder_and_a_new_one_are_claimed(tmp_path):
    (tmp_path / "empty").mkdir()
    with claim_run_dir(tmp_path / "empty") as claim:
        assert json.loads((tmp_path / "empty" / CLAIM_FILE).read_text())["pid"] == os.getpid()
        assert claim.stale is None
        claim.used = True  # the run wrote into it
    assert "released" in json.loads((tmp_path / "empty" / CLAIM_FILE).read_text())
    with claim_run_dir(tmp_path / "a" / "b"):
        assert (tmp_path / "a" / "b" / CLAIM_FILE).is_file()
    assert not (tmp_path / "a").exists()  # a start refused after the claim leaves no folder behind
    assert new_run_dir(tmp_path / "x") == tmp_path / "x" and new_run_dir(tmp_path / "x") == tmp_path / "x-2"


# ====================================================================== two writers
def test_a_second_writer_stops_before_loading_a_model_naming_the_holder(tmp_path):
    folder = tmp_path / "run"
    with claim_run_dir(folder):
        with pytest.raises(RunDirError) as e:  # a model path that does not exist: the check ran before any load
            ppolab.train("grpo_tiny", [*TINY, f"trainer.run_dir={folder}",
                                       f"actor_rollout_ref.model.path={tmp_path / 'no-model'}"], progress=False)
    assert "in use by process" in str(e.value) and str(os.getpid()) in str(e.value)


@pytest.mark.slow  # two trainings at once (10 s)
def test_two_trainings_started_together_on_one_new_run_dir(tmp_path):
    folder = tmp_path / "shared"
    command = [sys.executable, "-m", "ppolab.train", *TINY, *NO_VAL, "trainer.total_training_steps=1",
               f"trainer.run_dir={folder}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([*command, f"trainer.seed={seed}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "in use by process" in loser and "Traceback" not in loser
    winner_seed = 1 + [code for code, _ in results].index(0)
    run = ppolab.load_run(folder)  # one run's files only: config and steps of the winner
    assert run.config["trainer"]["seed"] == winner_seed
    assert run.step(1).info["config"]["trainer"]["seed"] == winner_seed


def test_a_stale_claim_of_a_dead_process_is_reported_not_silently_taken(copy_of):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    (copy_of / CLAIM_FILE).write_text(json.dumps({"pid": pid, "host": os.uname().nodename, "started": time.time(),
                                                  "command": "ppolab.train (killed)"}))
    with pytest.warns(RunWarning, match=f"claimed by process {pid}.*ended without finishing"):
        run = resume(copy_of)
    assert run.summary["steps"] == 3


# ====================================================================== resume = the same run
def test_the_resume_policy_decides_every_field_of_the_schema():
    leaves = leaf_keys(PPOConfig())
    assert not RESUMABLE_FIELDS & IDENTITY_FIELDS
    assert leaves == RESUMABLE_FIELDS | IDENTITY_FIELDS, (leaves ^ (RESUMABLE_FIELDS | IDENTITY_FIELDS))


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, list):
        return [*value, "x"]
    return f"{value}-other"


@pytest.fixture(scope="module")
def fire_config() -> dict:
    """ppo_fire_tiny resolved once (not once per field): the config every field's change starts from."""
    with warnings.catch_warnings():  # the preset's ConfigNotices
        warnings.simplefilter("ignore")
        return to_dict(resolve_config("ppo_fire_tiny"))


@pytest.mark.parametrize("key", sorted(leaf_keys(PPOConfig())))
def test_each_field_is_refused_or_recorded_on_resume(key, fire_config):
    old = fire_config
    new = json.loads(json.dumps(old))
    node = new
    *parents, last = key.split(".")
    for p in parents:
        node = node[p]
    node[last] = _changed(node[last])
    refused, allowed = resume_changes(old, new)
    if key in IDENTITY_FIELDS:
        assert len(refused) == 1 and refused[0].startswith(f"{key}: ") and " → " in refused[0] and not allowed
    else:
        assert refused == [] and allowed == {key: [flatten(old)[key], flatten(new)[key]]}


def _other_model(tmp_path: Path, name: str = "other-model") -> Path:
    """The shipped model with other weights (same shapes): a user's retrained copy."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / name
    shutil.copytree(SHIPPED_MODEL, folder)
    weights = load_file(str(folder / "model.safetensors"))
    save_file({k: v + 0.01 for k, v in weights.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("change, shown", [
    ("data.train_batch_size=4", "data.train_batch_size: 2 → 4"),
    ("algorithm.adv_estimator=rloo", "algorithm.adv_estimator: grpo → rloo"),
    ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_rank: 8 → 4"),
    ("actor_rollout_ref.actor.clip_ratio=0.3", "actor_rollout_ref.actor.clip_ratio: 0.2 → 0.3"),
    ("trainer.seed=7", "trainer.seed: 1 → 7"),
    ("model", "actor_rollout_ref.model.path:"),
])
def test_a_resume_that_changes_what_the_run_is_stops_before_any_model_loads(copy_of, tmp_path, change, shown,
                                                                            monkeypatch):
    import ppolab.trainer

    extra = [change] if change != "model" else [f"actor_rollout_ref.model.path={_other_model(tmp_path)}"]
    if change == "data.train_batch_size=4":
        extra += ["actor_rollout_ref.actor.ppo_mini_batch_size=4",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]
    monkeypatch.setattr(ppolab.trainer.PPOTrainer, "__init__", lambda *a, **k: pytest.fail("a model loaded"))
    before = tree_hash(copy_of)
    with pytest.raises(RunDirError) as e:
        resume(copy_of, *extra)
    assert shown in str(e.value) and str(copy_of / "config.json") in str(e.value)
    assert tree_hash(copy_of) == before


def test_the_same_model_path_with_other_weights_is_another_model(tmp_path):
    model = tmp_path / "my-model"
    shutil.copytree(SHIPPED_MODEL, model)
    first = run(tmp_path, f"actor_rollout_ref.model.path={model}", "trainer.save_freq=1")
    shutil.rmtree(model)
    _other_model(tmp_path, "my-model")  # retrained in place
    with pytest.raises(RunDirError, match=r"actor_rollout_ref.model.path: .*\(its files changed"):
        resume(first.path, f"actor_rollout_ref.model.path={model}")


def test_allowed_changes_are_recorded_with_the_step_they_start_at(copy_of, tmp_path):
    moved = tmp_path / "moved-model"
    shutil.copytree(SHIPPED_MODEL, moved)  # the same weights at a new path: not another model
    run_ = resume(copy_of, "trainer.record_freq=2", f"actor_rollout_ref.model.path={moved}")
    resumes = run_.resumes
    assert len(resumes) == 1 and resumes[0]["at_step"] == 2
    changed = resumes[0]["changed"]
    assert changed["trainer.total_training_steps"] == [2, 3] and changed["trainer.record_freq"][1] == 2
    assert changed["actor_rollout_ref.model.path"][1] == str(moved)
    assert run_.config["trainer"]["total_training_steps"] == 3 and run_.summary["steps"] == 3


# ====================================================================== rewards
def _reward_file(tmp_path: Path, body: str, name: str = "my_reward.py") -> Path:
    f = tmp_path / name
    f.write_text("import os, sys, time, json\n\ndef my_score(data_source, solution_str, ground_truth, "
                 f"extra_info=None):\n{body}\n")
    return f


def _with_reward(f: Path) -> list[str]:
    return [f"custom_reward_function.path={f}", "custom_reward_function.name=my_score"]


@pytest.mark.slow
def test_a_reward_that_changes_extra_info_changes_nothing_else(tmp_path):
    seen = tmp_path / "seen.jsonl"
    f = _reward_file(tmp_path, f"    with open({str(seen)!r}, 'a') as out:\n"
                               "        out.write(json.dumps(extra_info) + '\\n')\n"
                               "    extra_info['index'] = -1\n    extra_info['touched'] = True\n"
                               "    return float(solution_str.strip().endswith(ground_truth))")
    run(tmp_path, *_with_reward(f), "trainer.test_freq=1", "trainer.val_before_train=true")
    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(calls) >= 8 and all("touched" not in c and c.get("index") != -1 for c in calls)


@pytest.mark.parametrize("body, shown", [("    sys.exit(0)", "sys.exit(0)"),
                                         pytest.param("    raise KeyboardInterrupt", "KeyboardInterrupt itself",
                                                      marks=pytest.mark.slow),
                                         pytest.param("    raise SystemExit('done')", "sys.exit('done')",
                                                      marks=pytest.mark.slow)])
def test_a_reward_that_exits_is_a_reward_error_never_a_clean_exit(tmp_path, capsys, body, shown):
    f = _reward_file(tmp_path, body)
    with pytest.raises(RewardError) as e:
        run(tmp_path, *_with_reward(f))
    assert str(f) in str(e.value) and "my_score" in str(e.value) and shown in str(e.value)
    assert main([*TINY, *NO_VAL, "trainer.total_training_steps=1", f"trainer.run_dir={tmp_path / 'cli'}",
                 *_with_reward(f)]) == 1
    err = capsys.readouterr().err
    assert "my_score" in err and "Traceback" not in err


def test_a_reward_that_never_returns_is_named_then_stopped(tmp_path, capfd):
    f = _reward_file(tmp_path, "    time.sleep(3600)\n    return 1.0")
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"my_score.*took more than 1 s.*custom_reward_function.timeout_s"):
        run(tmp_path, *_with_reward(f), "custom_reward_function.timeout_s=1")
    assert time.monotonic() - start < 120
    err = capfd.readouterr().err
    assert "my_score" in err and "has been running for" in err  # the line after timeout_s / 2


def test_a_real_ctrl_c_during_a_reward_still_stops_cleanly(tmp_path):
    f = _reward_file(tmp_path, "    import signal\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(5)\n"
                               "    return 1.0")
    from ppolab.errors import TrainingInterrupted

    with pytest.raises(TrainingInterrupted) as e:
        run(tmp_path, *_with_reward(f))
    assert e.value.run.summary["interrupted_at_step"] == 0


def test_reward_timeouts_are_validated():
    with pytest.raises(ConfigError, match="custom_reward_function.timeout_s"):
        resolve_config("grpo_tiny", ["custom_reward_function.timeout_s=0"])
    assert resolve_config("grpo_tiny", ["custom_reward_function.timeout_s=null"])


# ====================================================================== no learning signal
GROUPS = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"]


def test_a_reward_of_the_prompt_alone_warns_that_nothing_is_learned(tmp_path):
    f = _reward_file(tmp_path, "    return float(int(ground_truth) % 2)")  # the same for every response of a prompt
    with pytest.warns(RewardWarning, match="no learning signal at step 1.*depends only on the prompt") as w:
        result = run(tmp_path, *_with_reward(f), *GROUPS, steps=2)
    assert sum("no learning signal" in str(x.message) for x in w) == 1  # once per run
    assert (result.metrics["ppolab/signal/uniform_group_frac"] == 1.0).all()
    assert (result.metrics["ppolab/signal/zero_adv_frac"] == 1.0).all()


def test_a_near_zero_temperature_warns_naming_it(tmp_path):
    with pytest.warns(RewardWarning, match="identical.*temperature=0.001 is near 0"):
        result = run(tmp_path, *GROUPS, "actor_rollout_ref.rollout.temperature=0.001")
    assert result.metrics["ppolab/signal/identical_group_frac"].iloc[-1] == 1.0


def test_a_run_with_signal_does_not_warn(tmp_path, recwarn):
    result = run(tmp_path, *GROUPS)
    assert not [w for w in recwarn if "no learning signal" in str(w.message)]
    assert result.metrics["ppolab/signal/uniform_group_frac"].iloc[-1] < 0.9


# ====================================================================== data the tokenizer cannot encode
@pytest.mark.parametrize("question, char", [("What is ½+1?", "½"), ("What is 2+2? 😀", "😀")])
def test_prompt_characters_outside_the_vocabulary_stop_naming_file_row_and_character(tmp_path, question, char):
    rows = [make_row(f"What is {i}+1?", i + 1, "train", i) for i in range(4)] + [make_row(question, 3, "train", 4)]
    data = write_parquet(tmp_path / "train.parquet", rows)
    with pytest.raises(DataError) as e:
        load_rl_dataset(data, load_tokenizer(SHIPPED_MODEL), 64)
    message = str(e.value)
    assert str(data) in message and "row 4" in message and repr(char) in message and f"U+{ord(char):04X}" in message
    assert "add_tokens" in message


# ====================================================================== devices and modules
def test_cuda_without_cuda_is_one_line_naming_what_the_user_set(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("PPOLAB_DEVICE", raising=False)
    assert main([*TINY, "trainer.device=cuda", f"trainer.run_dir={tmp_path / 'a'}"]) == 2
    err = capsys.readouterr().err
    assert "trainer.device=cuda" in err and "no CUDA device" in err and "Traceback" not in err
    monkeypatch.setenv("PPOLAB_DEVICE", "cuda")
    assert main([*TINY, f"trainer.run_dir={tmp_path / 'b'}"]) == 2
    err = capsys.readouterr().err
    assert "PPOLAB_DEVICE=cuda" in err and "trainer.device" not in err.split("no CUDA")[0]
    monkeypatch.setenv("PPOLAB_DEVICE", "gpu0")
    with pytest.raises(ConfigError, match="PPOLAB_DEVICE='gpu0'"):
        ppolab.train("grpo_tiny", [*TINY], progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_command_line_outranks_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PPOLAB_DEVICE", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([*TINY, *NO_VAL, "trainer.total_training_steps=1", "trainer.device=cpu",
                 f"trainer.run_dir={tmp_path / 'run'}"]) == 0
    assert ppolab.load_run(tmp_path / "run").config["trainer"]["device"] == "cpu"


def test_a_typo_in_target_modules_is_refused_listing_the_layers(tmp_path, capsys):
    assert main([*TINY, "actor_rollout_ref.model.target_modules=[q_proj,v_prj]",
                 f"trainer.run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "actor_rollout_ref.model.target_modules: 'v_prj' is not a layer" in err
    assert "v_proj" in err and "q_proj" in err and "Traceback" not in err


# ====================================================================== ppolab.train's own arguments
@pytest.mark.parametrize("args, kwargs, named", [
    ((42,), {}, "config=42"), (("grpo_tiny", 42), {}, "overrides=42"),
    (("grpo_tiny", "trainer.total_training_steps=3"), {}, "wrap one override in a list"),
    (("grpo_tiny", ["trainer.total_training_steps"]), {}, "'trainer.total_training_steps' is not a 'key=value'"),
    (("grpo_tiny",), {"on_step": 3}, "on_step=3"), (("grpo_tiny",), {"progress": "yes"}, "progress='yes'"),
])
def test_bad_train_arguments_name_the_argument(args, kwargs, named):
    with pytest.raises(TypeError) as e:
        ppolab.train(*args, **kwargs)
    assert named in str(e.value) and "ppolab.train(" in str(e.value)


# ====================================================================== a critic of another vocabulary
def test_a_critic_with_a_smaller_vocabulary_stops_before_training_naming_it(tmp_path):
    from safetensors.torch import load_file, save_file

    critic = tmp_path / "critic"
    shutil.copytree(SHIPPED_MODEL, critic)
    config = json.loads((critic / "config.json").read_text())
    rows = config["vocab_size"] - 4
    config["vocab_size"] = rows
    (critic / "config.json").write_text(json.dumps(config))
    weights = load_file(str(critic / "model.safetensors"))
    save_file({k: (v[:rows] if v.shape[0] == rows + 4 else v) for k, v in weights.items()},
              str(critic / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"critic.model.path=.*critic.*embedding has"):
        ppolab.train("ppo_gae_tiny", [*TINY, *NO_VAL, "actor_rollout_ref.model.lora_rank=0",
                                      "critic.ppo_micro_batch_size_per_gpu=4",
                                      f"critic.model.path={critic}", f"trainer.run_dir={tmp_path / 'run'}"],
                     progress=False)


# ====================================================================== leftovers of a killed writer
def test_temporary_files_are_ignored_by_load_run_and_cleaned_on_resume(copy_of):
    leftovers = [copy_of / ".metrics.jsonl.k2j3.tmp", copy_of / "steps" / ".step_000003.safetensors.a8f.tmp",
                 copy_of / "checkpoints" / "step_000002" / ".state.json.x1.tmp"]
    for f in leftovers:
        f.write_bytes(b"half")
    opened = ppolab.load_run(copy_of)
    assert opened.steps == [1, 2] and list(opened.metrics.index) == [1, 2]
    with pytest.warns(RunWarning, match="removed 3 temporary file"):
        resume(copy_of)
    assert not any(f.exists() for f in leftovers)


# ====================================================================== more of the same kinds
def test_a_file_or_an_unwritable_place_as_run_dir_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(RunDirError, match="is a file, not a folder"):
        run(tmp_path, name="afile")
    with pytest.raises(RunDirError, match="cannot be written"):
        run(tmp_path, name="afile/run")


@pytest.mark.parametrize("source, shown", [("def my_score(:\n", "SyntaxError"),
                                           ("import sys\nsys.exit(0)\n", "SystemExit"),
                                           ("import no_such_module_here\n", "ModuleNotFoundError")])
def test_a_reward_file_that_does_not_import_names_the_file(tmp_path, source, shown):
    f = tmp_path / "broken_reward.py"
    f.write_text(source)
    with pytest.raises(RewardError) as e:
        run(tmp_path, *_with_reward(f))
    assert str(f) in str(e.value) and shown in str(e.value)


def test_a_reward_raising_another_base_exception_is_a_reward_error(tmp_path):
    f = _reward_file(tmp_path, "    raise GeneratorExit")
    with pytest.raises(RewardError, match="GeneratorExit"):
        run(tmp_path, *_with_reward(f))


@pytest.mark.parametrize("modules, shown", [("q_proj", "non-empty list of module names"),
                                            ("[]", "non-empty list of module names")])
def test_target_modules_that_match_nothing_are_refused(tmp_path, modules, shown):
    with pytest.raises(ConfigError, match=shown):
        run(tmp_path, f"actor_rollout_ref.model.target_modules={modules}")


def test_an_on_step_of_the_wrong_shape_is_refused_before_training(tmp_path):
    with pytest.raises(TypeError, match="on_step"):
        run(tmp_path, on_step=lambda step: None)
    assert not (tmp_path / "run").exists()


def test_a_target_module_that_is_not_a_linear_layer_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="'input_layernorm' in .* is not a layer LoRA can wrap"):
        run(tmp_path, "actor_rollout_ref.model.target_modules=[q_proj,input_layernorm]")


def test_a_reward_that_changes_the_working_directory_cannot_move_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    f = _reward_file(tmp_path, f"    os.chdir({str(elsewhere)!r})\n    return 0.0")
    result = ppolab.train("grpo_tiny", [*TINY, *NO_VAL, "trainer.total_training_steps=1", "trainer.run_dir=rel",
                                        *_with_reward(f)], progress=False)
    assert result.path == tmp_path / "rel" and (tmp_path / "rel" / "metrics.jsonl").is_file()
    assert not (elsewhere / "rel").exists()


def test_the_critic_adapter_wraps_critic_model_target_modules(tmp_path):
    from ppolab.trainer import PPOTrainer

    cfg = resolve_config("ppo_gae_tiny", [*TINY, *NO_VAL, "critic.ppo_micro_batch_size_per_gpu=4",
                                          "critic.model.target_modules=[q_proj]"])
    trainer = PPOTrainer(cfg)
    names = [n for n, _ in trainer.models.model.named_parameters() if ".critic." in n]
    assert names and all(".q_proj." in n for n in names)  # the actor's seven projections are not the critic's
    cfg = resolve_config("ppo_gae_tiny", [*TINY, *NO_VAL, "critic.ppo_micro_batch_size_per_gpu=4",
                                          "critic.model.target_modules=[q_prj]"])
    with pytest.raises(ConfigError, match="critic.model.target_modules: 'q_prj' is not a layer"):
        PPOTrainer(cfg)


# ====================================================================== modes: the umask decides (issue 36)
@pytest.mark.slow  # one training step (~10 s): in .ci/run's slow phase
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077, 0o002])
def test_every_file_and_folder_of_a_run_honours_the_umask(tmp_path, umask):
    """A run an instructor trains on a shared machine opens for the learners of the group: the recorder's files
    get 0666 & ~umask and its folders 0777 & ~umask, as open() and mkdir() give them (mkstemp alone gives 0600)."""
    old = os.umask(umask)
    try:
        run(tmp_path, "trainer.record_freq=1", "trainer.save_freq=1")
    finally:
        os.umask(old)
    root = tmp_path / "run"
    seen = {p.relative_to(root).parts[0] for p in root.rglob("*")}
    assert {"metrics.jsonl", "config.json", "steps", "tokenizer", "checkpoints"} <= seen, seen
    wrong = [f"{p.relative_to(root)} {oct(p.stat().st_mode & 0o777)}" for p in [root, *root.rglob("*")]
             if p.stat().st_mode & 0o777 != (0o777 if p.is_dir() else 0o666) & ~umask]
    assert not wrong, f"umask {oct(umask)}: {wrong}"


def test_ctrl_c_in_a_loop_of_trainings_stops_the_loop(tmp_path):
    """A cell that trains several runs in a loop: Ctrl-C during the first leaves it whole and stops the loop."""
    from ppolab.errors import TrainingInterrupted

    def stop(step, metrics, record):
        if step == 1:
            raise KeyboardInterrupt

    started = []
    with pytest.raises(KeyboardInterrupt):
        for name in ("a", "b"):
            started.append(name)
            run(tmp_path, name=name, steps=2, on_step=stop)
    assert started == ["a"] and ppolab.load_run(tmp_path / "a").summary["interrupted_at_step"] == 1
    assert issubclass(TrainingInterrupted, KeyboardInterrupt) and not (tmp_path / "b").exists()


@pytest.mark.slow  # two short trainings: in .ci/run's slow phase
def test_a_resume_removes_what_a_killed_writer_left(tmp_path):
    """A kill while tokenizer/ or a step file was written leaves a temporary behind; the resume cleans it."""
    run(tmp_path, "trainer.save_freq=1", "trainer.record_freq=1", steps=1)
    root = tmp_path / "run"
    left = [root / ".tokenizer.k1ll3d.tmp", root / "steps" / ".step_000002.safetensors.x9.tmp",
            root / ".metrics.jsonl.q2.tmp"]
    left[0].mkdir()
    (left[0] / "tokenizer.json").write_text("{")
    for f in left[1:]:
        f.write_bytes(b"half")
    resume(root, steps=2)
    assert not [p for p in left if p.exists()] and not list(root.rglob(".*.tmp"))
    assert ppolab.load_run(root).steps == [1, 2]


def test_a_start_again_after_a_start_killed_while_saving_its_tokenizer_cleans_it(tmp_path):
    """A kill before step 1 (while tokenizer/ was saved) leaves no run, so the same command starts afresh — and
    used to leave the half-saved .tokenizer.*.tmp/ folder there for good."""
    from ppolab.run.files import leftover_temp_files, remove_leftovers

    root = tmp_path / "run"
    half = root / ".tokenizer.k1ll3d.tmp"
    half.mkdir(parents=True)
    (half / "tokenizer.json").write_text("{")
    (root / "config.json").write_text("{}")
    mine = root / "notes.tmp"  # not the recorder's (no leading dot): left alone
    mine.write_text("mine")
    assert leftover_temp_files(root) == [half]
    assert remove_leftovers(root) == 1 and not half.exists() and mine.exists()


def test_the_claim_file_honours_a_group_writable_umask(tmp_path):
    """Under umask 002 every file of a run is group-writable but .ppolab-run was 0644: a group member could not
    claim the run to resume it."""
    old = os.umask(0o002)
    try:
        with claim_run_dir(tmp_path / "run"):
            assert (tmp_path / "run" / CLAIM_FILE).stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(old)


@pytest.mark.slow  # one training step (~10 s): in .ci/run's slow phase
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="acting as another user needs root")
def test_a_learner_of_the_group_reads_the_instructors_run(tmp_path):
    """The shared JupyterHub case, as it happens: an instructor trains into the course's group folder (setgid, so
    new files take its group) under umask 027; a learner — another user, in that group — opens the run, a recorded
    step's tensors and its tokenizer; a user outside the group cannot. The reads run in this process under the
    learner's effective ids (this interpreter may live in a home another user cannot enter), after a first read
    as the instructor has imported every module they need."""
    import tempfile

    course_gid, learner_uid = 4242, 65534
    shared = Path(tempfile.mkdtemp(prefix="ppolab-course-"))

    def read(as_groups: list[int]) -> str:
        groups = os.getgroups()
        os.setgroups(as_groups)
        os.setegid(as_groups[0])
        os.seteuid(learner_uid)
        try:
            r = ppolab.load_run(shared / "run")
            s = r.step(r.steps[-1])
            return f"{len(r.steps)} {tuple(s.tensors['responses'].shape)} {r.tokenizer().decode([5, 6])!r}"
        except PermissionError as e:
            return f"PermissionError {e.filename}"
        finally:
            os.seteuid(0)
            os.setegid(0)
            os.setgroups(groups)

    try:
        os.chown(shared, 0, course_gid)
        os.chmod(shared, 0o2750)  # the course folder: group-readable, setgid
        old = os.umask(0o027)
        try:
            run(shared, "trainer.record_freq=1")
        finally:
            os.umask(old)
        r = ppolab.load_run(shared / "run")
        mine = f"{len(r.steps)} {tuple(r.step(r.steps[-1]).tensors['responses'].shape)} " \
               f"{r.tokenizer().decode([5, 6])!r}"
        assert read([course_gid]) == mine  # the learner sees what the instructor sees
        assert read([65534]).startswith("PermissionError")  # outside the group: refused by the modes
    finally:
        shutil.rmtree(shared, ignore_errors=True)
