"""Nothing lost, nothing silent (issue 14): bad run dirs, rewards, data, model files and recorded runs stop or
warn with a message naming the culprit, and no file of an existing run changes."""
import math
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

import ppolab
from ppolab.config import ConfigError
from ppolab.data import make_row
from ppolab.errors import DataError, FileFormatError, MissingFileError, RewardError, RewardWarning, RunDirError, \
    RunWarning
from ppolab.models import SHIPPED_MODEL, load_tokenizer_and_model
from ppolab.run.checkpoints import resume_checkpoint
from ppolab.run.claim import holds_run
from ppolab.run.claim import new_run_dir
from ppolab.rewards import compute_score, get_reward_fn, reward_warning_signs
from ppolab.train import main, resolve_config
from ppolab.trainer import PPOTrainer
from helpers import NO_VAL, TINY, no_model, tree_hash, write_parquet

# ====================================================================== run directories
def test_training_into_a_finished_run_is_refused_before_the_model_loads(finished, tmp_path, capsys):
    before = tree_hash(finished)
    with pytest.raises(RunDirError) as e:
        ppolab.train("grpo_tiny", [*TINY, no_model(tmp_path), f"trainer.run_dir={finished}"], progress=False)
    message = str(e.value)
    assert str(finished) in message and "trainer.resume=true" in message and "trainer.run_dir" in message
    assert main([*TINY, f"trainer.run_dir={finished}"]) == 2  # the CLI: one line, exit code 2
    err = capsys.readouterr().err
    assert str(finished) in err and "trainer.resume=true" in err and "Traceback" not in err
    assert tree_hash(finished) == before


def test_a_start_that_failed_before_step_1_is_not_a_run_but_one_logged_step_is(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.json").write_text("{}")  # e.g. the reward function crashed in the validation before training
    (d / "metrics.jsonl").write_text('{"step": 0, "val/accuracy": 0.5}\n')
    (d / "summary.json").write_text('{"steps": 0, "interrupted_at_step": 0}')  # Ctrl-C before step 1
    (d / "steps").mkdir()
    assert not holds_run(d) and resume_checkpoint(d, resume=False) == (None, [])
    (d / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    assert holds_run(d)
    assert new_run_dir(d) == tmp_path / "run-2"  # default run names never reuse a directory


def test_a_resume_that_fails_leaves_the_run_as_it_was(copy_of):
    before = tree_hash(copy_of)
    with pytest.raises(RunDirError, match="lora_rank: 8 → 4") as e:  # a LoRA rank the checkpoint does not fit
        ppolab.train("grpo_tiny", [*TINY, *NO_VAL, "trainer.total_training_steps=3", f"trainer.run_dir={copy_of}",
                                   "trainer.resume=true", "actor_rollout_ref.model.lora_rank=4"], progress=False)
    assert "config.json" in str(e.value)
    assert tree_hash(copy_of) == before  # config.json included


@pytest.mark.parametrize("damage", ["no state.json", "truncated", "state.json torn"])
def test_resume_names_a_damaged_latest_checkpoint_and_takes_the_previous(copy_of, damage):
    latest = copy_of / "checkpoints" / "step_000002"
    if damage == "no state.json":
        (latest / "state.json").unlink()
    elif damage == "truncated":
        data = (latest / "trainable.safetensors").read_bytes()
        (latest / "trainable.safetensors").write_bytes(data[: len(data) // 2])
    else:
        (latest / "state.json").write_text('{"global_step": 2, "optim')
    before = tree_hash(copy_of)
    checkpoint, notes = resume_checkpoint(copy_of, resume=True)
    assert checkpoint == copy_of / "checkpoints" / "step_000001"
    assert len(notes) == 1 and str(latest) in notes[0] and "step_000001" in notes[0]
    assert ("incomplete" if damage == "no state.json" else "corrupt") in notes[0]
    with pytest.raises(RunDirError, match="trainer.resume=true"):  # training into it without resume
        resume_checkpoint(copy_of, resume=False)
    shutil.rmtree(copy_of / "checkpoints" / "step_000001")
    with pytest.raises(RunDirError, match="no complete checkpoint") as e:
        resume_checkpoint(copy_of, resume=True)
    assert str(latest) in str(e.value)
    assert tree_hash(copy_of) == {k: v for k, v in before.items() if not k.startswith("checkpoints/step_000001")}


def test_resume_from_the_previous_checkpoint_says_so_and_trains_on(copy_of):
    latest = copy_of / "checkpoints" / "step_000002" / "optim_actor.safetensors"
    latest.write_bytes(latest.read_bytes()[:100])
    with pytest.warns(RunWarning, match="step_000002.*corrupt.*previous complete checkpoint"):
        run = ppolab.train("grpo_tiny", [*TINY, *NO_VAL, "trainer.total_training_steps=2",
                                         f"trainer.run_dir={copy_of}", "trainer.resume=true"], progress=False)
    assert run.summary["steps"] == 2 and list(run.metrics.index) == [1, 2]


# ====================================================================== an interrupted step
def _interrupt_at_step_2(monkeypatch, where: str) -> None:
    if where == "update_actor":  # Ctrl-C in the middle of step 2's update
        original = PPOTrainer.update_actor

        def update_actor(self, batch):
            if self.global_step == 2:
                raise KeyboardInterrupt
            return original(self, batch)

        monkeypatch.setattr(PPOTrainer, "update_actor", update_actor)
    else:  # Ctrl-C while step 2's tensors are written, before its metrics are logged
        import ppolab.run.recorder as record

        original = record.write_json

        def write_json(path, obj):
            if Path(path).name == "step_000002.json":
                raise KeyboardInterrupt
            return original(path, obj)

        monkeypatch.setattr(record, "write_json", write_json)


@pytest.mark.parametrize("where", ["update_actor", "record_step"])
def test_an_interrupted_step_is_not_reported_as_done(tmp_path, monkeypatch, capsys, where):
    _interrupt_at_step_2(monkeypatch, where)
    run_dir = tmp_path / "run"
    code = main([*TINY, "trainer.total_training_steps=4", "trainer.test_freq=1", f"trainer.run_dir={run_dir}"])
    assert code == 130
    run = ppolab.load_run(run_dir)
    assert run.summary["steps"] == 1 and run.summary["interrupted_at_step"] == 1
    assert list(run.metrics.index) == [0, 1] and run.steps == [1]
    after = run.metrics.loc[1, "val/accuracy"]
    assert run.summary["val_after"]["val/accuracy"] == after
    out = capsys.readouterr()
    assert "interrupted after step 1" in out.err + out.out and "(1 steps" in out.out
    assert f"after {after:.3f}" in out.out


# ====================================================================== rewards
@pytest.fixture(scope="module")
def rolled_out():
    """A trainer and a generated batch (stage 1), to score with many reward functions."""
    t = PPOTrainer(resolve_config("grpo_tiny", [*TINY, *NO_VAL]))
    return t, t.generate_sequences(t.next_prompts())


@pytest.mark.parametrize("returned, shown", [("float('nan')", "nan"), ("float('-inf')", "-inf"), ("None", "None"),
                                             ("'1.0'", "str ('1.0')"), ("{'acc': 1.0}", "without a 'score'"),
                                             ("{'score': float('nan')}", "nan as 'score'")])
def test_a_bad_reward_value_stops_at_its_first_occurrence(rolled_out, tmp_path, returned, shown):
    t, batch = rolled_out
    f = tmp_path / "my_reward.py"
    f.write_text(f"def my_score(data_source, solution_str, ground_truth, extra_info=None):\n    return {returned}\n")
    saved = t.reward_fn
    t.reward_fn = get_reward_fn({"path": str(f), "name": "my_score"})
    try:
        with pytest.raises(RewardError) as e:
            t.compute_reward(batch)
        with pytest.raises(RewardError):  # validation scores through the same check
            t.validate()
    finally:
        t.reward_fn = saved
    message = str(e.value)
    first = t.tokenizer.decode(batch["responses"][0], skip_special_tokens=True)
    assert str(f) in message and "my_score" in message and shown in message and repr(first) in message


def test_a_crashing_reward_function_is_named_with_the_response(rolled_out, tmp_path):
    t, batch = rolled_out
    f = tmp_path / "crash.py"
    f.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    return int(solution_str)\n")
    saved = t.reward_fn
    t.reward_fn = get_reward_fn({"path": str(f), "reward_kwargs": {}})
    try:
        with pytest.raises(RewardError, match="ValueError") as e:
            t.compute_reward(batch)
    finally:
        t.reward_fn = saved
    assert str(f) in str(e.value) and "'compute_score'" in str(e.value) and "on the response" in str(e.value)


def test_constant_rewards_warn_and_name_a_ground_truth_that_is_not_a_number(tmp_path):
    rows = [make_row(f"What is {i}+1?", 0, "train", i) for i in range(5)]
    for r in rows:
        r["reward_model"]["ground_truth"] = "eighty"
    data = write_parquet(tmp_path / "train.parquet", rows)
    with pytest.warns(RewardWarning, match="'eighty'.*not a number"):
        ppolab.train("grpo_tiny", [*TINY, *NO_VAL, "trainer.total_training_steps=1", f"data.train_files={data}",
                                   f"trainer.run_dir={tmp_path / 'run'}"], progress=False)


def test_learning_signal_watch_and_warning_signs():
    from types import SimpleNamespace

    from ppolab.watch import LearningSignalWatch

    rollout = SimpleNamespace(temperature=1.0, top_k=-1, n=2)
    flat = {"ppolab/signal/uniform_group_frac": 1.0, "ppolab/signal/identical_group_frac": 0.0,
            "ppolab/signal/zero_adv_frac": 1.0}
    watch = LearningSignalWatch(compute_score, rollout, patience=2)
    assert watch.see({**flat, "ppolab/signal/uniform_group_frac": 0.5, "ppolab/signal/zero_adv_frac": 0.5},
                     [1.0, 0.0], 1, ["arith"] * 2, ["2", "3"], step=1) is None
    assert watch.see(flat, [0.0, 0.0], 1, ["arith"] * 2, ["2", "3"], step=2) is None  # one step of 1 group: chance
    assert "never writes a correct" in watch.see(flat, [0.0, 0.0], 1, ["arith"] * 2, ["2", "3"], step=3)
    assert watch.see(flat, [0.0, 0.0], 1, ["arith"] * 2, ["2", "3"], step=4) is None  # said once
    custom = LearningSignalWatch(lambda *a: 0.5, rollout, patience=1)
    assert "returns 0.5 whatever the response" in custom.see(flat, [0.5, 0.5], 1, ["x"] * 2, ["a", "b"], step=1)
    # PPO with a critic: one response a prompt scored alike, but GAE's advantages are not 0 — the update learns
    ppo = LearningSignalWatch(compute_score, SimpleNamespace(temperature=1.0, top_k=-1, n=1), patience=1)
    for step in (1, 2, 3):
        assert ppo.see({**flat, "ppolab/signal/zero_adv_frac": 0.02}, [0.0] * 8, 1, ["arith"] * 8, ["2"] * 8,
                       step=step) is None
    frame = pd.DataFrame({"critic/score/mean": [0.0, float("nan"), 0.0], "critic/score/min": [0.0, None, 0.0],
                          "critic/score/max": [0.0, None, 0.0]}, index=[1, 2, 3])
    signs = reward_warning_signs(frame)
    assert any("not finite" in s and "step 2" in s for s in signs)
    assert any("always 0" in s for s in signs)
    good = pd.DataFrame({"critic/score/mean": [0.5], "critic/score/min": [0.0], "critic/score/max": [1.0]})
    assert reward_warning_signs(good) == []


# ====================================================================== data
def test_bad_data_files_are_refused_before_the_model_loads(tmp_path):
    five = write_parquet(tmp_path / "five.parquet", [make_row(f"What is {i}+1?", i + 1, "train", i) for i in range(5)])
    empty = write_parquet(tmp_path / "empty.parquet", [])
    csv = tmp_path / "train.csv"
    csv.write_text("prompt,answer\nWhat is 1+1?,2\n")
    cases = [  # (overrides, words the message must hold)
        ([f"data.train_files={empty}"], [str(empty), "no rows"]),
        ([f"data.train_files={five}", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"],
         [str(five), "5 prompts", "data.train_batch_size=8"]),
        ([f"data.val_files={empty}", "trainer.test_freq=1"], [str(empty), "data.val_files", "trainer.test_freq=-1"]),
        ([f"data.train_files={csv}"], [str(csv), "not a parquet file"]),
    ]
    for overrides, words in cases:
        with pytest.raises(DataError) as e:
            ppolab.train("grpo_tiny", [*TINY, no_model(tmp_path), *overrides,
                                       f"trainer.run_dir={tmp_path / 'run'}"], progress=False)
        assert all(w in str(e.value) for w in words), (words, str(e.value))
    assert not (tmp_path / "run").exists()


# ====================================================================== models and files
@pytest.fixture
def model_copy(tmp_path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(SHIPPED_MODEL, dst)
    return dst


@pytest.mark.parametrize("damage, error, words", [
    # a model directory of the user's own (here a copy): saved again whole; only the shipped one is ppolab.sft's
    ("missing weights", MissingFileError, ["model.safetensors", "save_pretrained"]),
    ("truncated weights", FileFormatError, ["model.safetensors", "save_pretrained"]),
    ("no tokenizer", MissingFileError, ["no tokenizer files", "save_pretrained"]),
])
def test_damaged_model_directories_name_the_file(model_copy, damage, error, words):
    weights = model_copy / "model.safetensors"
    if damage == "missing weights":
        weights.unlink()
    elif damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    else:
        (model_copy / "tokenizer.json").unlink()
        (model_copy / "tokenizer_config.json").unlink()
    with pytest.raises(error) as e:
        load_tokenizer_and_model(model_copy)
    assert str(model_copy) in str(e.value) and all(w in str(e.value) for w in words)


@pytest.mark.parametrize("name, target", [("tokenizer_config.json", "pipe"), ("model.safetensors", "/dev/urandom")])
def test_a_pipe_or_device_in_a_model_directory_is_named_never_read(model_copy, name, target):
    """A pipe where tokenizer_config.json belongs used to be skipped (the tokenizer loaded without its config, and the
    error that followed named the vocabulary); a link to /dev/urandom as the weights was called missing."""
    (model_copy / name).unlink()
    os.mkfifo(model_copy / name) if target == "pipe" else (model_copy / name).symlink_to(target)
    with pytest.raises(FileFormatError) as e:
        load_tokenizer_and_model(model_copy)
    assert str(e.value).startswith(f"{model_copy / name} is a device, pipe or socket") and "save_pretrained" in str(
        e.value), str(e.value)


def test_an_ignored_critic_path_is_a_config_error():
    tool_model = SHIPPED_MODEL.parent / "tiny-arith-tool"
    with pytest.raises(ConfigError, match="critic.model.path.*would be ignored.*lora_rank"):
        resolve_config("ppo_gae_tiny", [f"critic.model.path={tool_model}"])
    resolve_config("ppo_gae_tiny", [f"critic.model.path={SHIPPED_MODEL}"])  # the actor's own base: fine


def test_a_critic_with_another_vocabulary_is_refused():
    tool_model = SHIPPED_MODEL.parent / "tiny-arith-tool"
    cfg = resolve_config("ppo_gae_tiny", [*NO_VAL, "actor_rollout_ref.model.lora_rank=0",
                                          f"critic.model.path={tool_model}"])
    with pytest.raises(ConfigError, match="different vocabulary") as e:
        PPOTrainer(cfg)
    assert str(tool_model) in str(e.value)


# ====================================================================== reading runs
def test_a_torn_metrics_line_is_reported_with_its_line_number(copy_of):
    path = copy_of / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1][: len(lines[1]) // 2]]) + "\n")
    with pytest.raises(FileFormatError, match=r"metrics.jsonl, line 2"):
        ppolab.load_run(copy_of)
    with pytest.raises(FileFormatError, match=r"metrics.jsonl, line 2"):  # resuming would drop it too
        resume_checkpoint(copy_of, resume=True)


def test_a_missing_or_torn_step_file_is_named(copy_of):
    (copy_of / "steps" / "step_000002.json").unlink()
    run = ppolab.load_run(copy_of)
    assert run.steps == [1, 2]
    for k in (None, 2):  # the default (last) step does not fall back to step 1
        with pytest.raises(MissingFileError, match="step_000002.json"):
            run.step(k)
    assert run.step(1).step == 1
    tensors = copy_of / "steps" / "step_000001.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:50])
    with pytest.raises(FileFormatError, match="step_000001.safetensors"):
        ppolab.load_run(copy_of).step(1)
    (copy_of / "summary.json").write_text("{")
    with pytest.raises(FileFormatError, match="summary.json"):
        ppolab.load_run(copy_of).summary


# ====================================================================== CLI
@pytest.mark.parametrize("override, key", [("data.train_files={a: 1}", "data.train_files"),
                                           ("trainer.logger={x: 1}", "trainer.logger"),
                                           ("data.train_files=[{a: 1}]", "data.train_files"),
                                           ("actor_rollout_ref.model.target_modules={a: 1}", "target_modules")])
def test_a_malformed_override_is_a_one_line_config_error(capsys, override, key):
    assert main([override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error:") and key in err and len(err.splitlines()) == 1


def test_reward_values_are_checked_not_coerced():
    import numpy as np

    from ppolab.rewards import checked_score

    assert [checked_score(v) for v in (1, 0.5, True, np.float32(0.25), {"score": 1.0, "acc": 0})] == \
        [1.0, 0.5, 1.0, 0.25, 1.0]
    for bad in (math.nan, math.inf, None, "1.0", {"acc": 1}, [1.0]):
        with pytest.raises(ValueError):
            checked_score(bad)


# ====================================================================== your own model
def test_a_tokenizer_without_a_chat_template_is_one_line(tmp_path):
    from ppolab.data import load_rl_dataset
    from ppolab.models import load_tokenizer

    tok = load_tokenizer(SHIPPED_MODEL)
    tok.chat_template = None  # most base models ship none
    data = write_parquet(tmp_path / "d.parquet", [make_row("What is 1+1?", 2, "train", 0)])
    with pytest.raises(DataError, match="has no chat template.*tokenizer_config.json") as e:
        load_rl_dataset(data, tok, 64)
    assert "\n" not in str(e.value) and e.value.__cause__ is None


def test_an_empty_prompt_is_refused_naming_file_row_and_column(tmp_path):
    from ppolab.data import load_rl_dataset
    from ppolab.models import load_tokenizer

    rows = [make_row("What is 1+1?", 2, "train", 0), make_row("  ", 3, "train", 1)]
    data = write_parquet(tmp_path / "d.parquet", rows)
    with pytest.raises(ValueError, match=r"d.parquet: row 1, column 'prompt': every message's content is empty"):
        load_rl_dataset(data, load_tokenizer(SHIPPED_MODEL), 64)


def test_a_model_with_dropout_is_named():
    from types import SimpleNamespace

    from ppolab.config.schema import ConfigNotice
    from ppolab.models import warn_dropout

    gpt2 = SimpleNamespace(to_dict=lambda: {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.0,
                                            "n_layer": 2})
    with pytest.warns(ConfigNotice, match=r"/m: the model has dropout \(embd_pdrop=0.1, resid_pdrop=0.1\)"):
        warn_dropout(gpt2, "/m")
    qwen = SimpleNamespace(to_dict=lambda: {"attention_dropout": 0.0})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_dropout(qwen, "/m")
