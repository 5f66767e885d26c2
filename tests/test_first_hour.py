"""What a newcomer trips on in the first hour on a fresh clone (issue 50): the main job's first lines, a run trained
with a plugged-in loss reopened in a new process, a dropout notice about a head a causal LM never builds, and a LoRA
target that names no layer, refused before the weights load."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "models" / "tiny-arith"


def tiny_neox(out: Path, **config) -> Path:
    """A GPT-NeoX folder (random weights, the shipped tokenizer): its linear layers are query_key_value, dense,
    dense_h_to_4h and dense_4h_to_h, not Llama's q_proj … down_proj; ``config`` overrides GPTNeoXConfig's fields."""
    import torch
    from transformers import AutoTokenizer, GPTNeoXConfig, GPTNeoXForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(TINY)
    cfg = GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        vocab_size=len(tokenizer), max_position_embeddings=128, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **config)
    torch.manual_seed(0)
    GPTNeoXForCausalLM(cfg).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def dropout_notices(path: Path) -> list[str]:
    from ppolab.config.schema import ConfigNotice
    from ppolab.models import load_tokenizer_and_model

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_tokenizer_and_model(path)
    return [str(w.message) for w in caught if issubclass(w.category, ConfigNotice) and "dropout" in str(w.message)]


# ---------------------------------------------------------------------------------------------- 3. dropout notice
def test_classifier_dropout_of_a_causal_lm_gets_no_notice(tmp_path):
    # GPT-NeoX's default classifier_dropout=0.1 belongs to GPTNeoXForSequenceClassification's head
    assert dropout_notices(tiny_neox(tmp_path / "neox", classifier_dropout=0.1)) == []


def test_dropout_the_causal_lm_uses_is_named_alone(tmp_path):
    notices = dropout_notices(tiny_neox(tmp_path / "neox", classifier_dropout=0.1, hidden_dropout=0.1))
    assert len(notices) == 1, notices
    assert "(hidden_dropout=0.1)" in notices[0] and "classifier_dropout" not in notices[0], notices[0]
    assert "set hidden_dropout to 0 in its config.json" in notices[0]


def test_attention_dropout_passed_to_the_attention_function_is_named(tmp_path):
    from ppolab.models import dropout_in_use

    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_neox(tmp_path / "neox", attention_dropout=0.2, classifier_dropout=0.1))
    assert dropout_in_use(cfg) == {"attention_dropout": 0.2}


# ---------------------------------------------------------------------------------------------- 4. target_modules
def test_lora_targets_that_name_no_layer_are_refused_before_any_weight_loads(tmp_path, monkeypatch):
    import transformers

    import ppolab
    from ppolab.config import ConfigError

    neox = tiny_neox(tmp_path / "neox")

    def no_load(*args, **kwargs):
        raise AssertionError("from_pretrained was called before target_modules was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    with pytest.raises(ConfigError) as e:
        ppolab.train("grpo_tiny", [f"actor_rollout_ref.model.path={neox}", f"trainer.run_dir={tmp_path / 'run'}"],
                     progress=False)
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("actor_rollout_ref.model.target_modules: 'q_proj', 'k_proj'"), line
    assert f"not a layer of {neox}" in line
    assert "query_key_value" in line and "dense_h_to_4h" in line and "'all-linear'" in line, line


def test_the_model_skeleton_reads_no_weights(tmp_path):
    import torch

    from ppolab.models import linear_module_names, model_skeleton

    neox = tiny_neox(tmp_path / "neox")
    (neox / "model.safetensors").unlink()  # no weights at all: the skeleton never needs them
    skeleton = model_skeleton(neox)
    assert {p.device for p in skeleton.parameters()} == {torch.device("meta")}
    assert {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"} <= set(linear_module_names(skeleton))
    assert torch.get_default_dtype() == torch.float32
    assert model_skeleton(tmp_path / "nothing-here") is None  # the load names a missing folder itself


# ---------------------------------------------------------------------------------------------- 2. a learner's run
def learner_run(out: Path) -> Path:
    """The shipped grpo_tiny run as a run trained with a plugged-in loss records itself: loss_mode=learner in its
    config.json and in each step's (a run dir records the loss's name, never its code)."""
    import json
    import shutil

    from ppolab.experiments.capstone_grade import LEARNER
    from ppolab.run.reader import SHIPPED_RUNS

    shutil.copytree(SHIPPED_RUNS["grpo_tiny"], out)
    for f in [out / "config.json", *sorted((out / "steps").glob("step_*.json"))]:
        meta = json.loads(f.read_text())
        if "config" in meta:
            meta["config"]["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] = LEARNER
            f.write_text(json.dumps(meta))
    return out


def test_a_run_trained_with_a_plugged_in_loss_opens_in_a_new_process(tmp_path):
    import subprocess
    import sys

    run = learner_run(tmp_path / "learner-run")
    code = f"""
import ppolab
from ppolab.algos import POLICY_LOSS_REGISTRY
from ppolab.replay import replay_actor_update
assert "learner" not in POLICY_LOSS_REGISTRY
run = ppolab.load_run({str(run)!r})
print("mode", run.ppo_config().actor_rollout_ref.actor.policy_loss.loss_mode)
print("advantages", tuple(run.step(1).tensors["advantages"].shape))
try:
    replay_actor_update(run)
except ValueError as e:
    print("replay:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert "mode learner" in lines and any(x.startswith("advantages (") for x in lines), out.stdout
    replay = [x for x in lines if x.startswith("replay:")]
    assert replay == [f"replay: {run} was trained with the learner's policy loss 'learner' "
                      "(actor_rollout_ref.actor.policy_loss.loss_mode), which is not registered in this process (a "
                      "plugged-in loss lives only in the process that plugged it in): plug it in again first — "
                      "ppolab.experiments.capstone_grade.plug_in(your_loss, 'learner') — then replay"], out.stdout


def test_a_replay_with_the_loss_plugged_in_again_runs(tmp_path):
    from ppolab.algos import POLICY_LOSS_REGISTRY
    from ppolab.experiments.capstone_grade import LEARNER, plug_in
    from ppolab.run.reader import load_run
    from ppolab.replay import require_policy_loss

    run = load_run(learner_run(tmp_path / "learner-run"))
    vanilla = POLICY_LOSS_REGISTRY["vanilla"]
    saved = POLICY_LOSS_REGISTRY.pop(LEARNER, None)
    try:
        with pytest.raises(ValueError, match="not registered in this process"):
            require_policy_loss(run)
        plug_in(lambda *a, **k: vanilla(*a, **k))
        require_policy_loss(run)  # plugged in again: the replay goes on
    finally:
        POLICY_LOSS_REGISTRY.pop(LEARNER, None)
        if saved is not None:
            POLICY_LOSS_REGISTRY[LEARNER] = saved


def test_training_with_an_unplugged_loss_says_how_to_plug_it_in(monkeypatch):
    from ppolab.algos import POLICY_LOSS_REGISTRY
    from ppolab.config import ConfigError, load_config

    monkeypatch.delitem(POLICY_LOSS_REGISTRY, "learner", raising=False)  # as in a new process

    with pytest.raises(ConfigError, match=r"loss_mode='learner' is not valid.*plug_in\(your_loss, name\)"):
        load_config("grpo_tiny", ["actor_rollout_ref.actor.policy_loss.loss_mode=learner"])


# ====================================================================== the main job speaks from its first second
def test_the_main_job_says_what_it_does_from_its_first_line_and_never_redraws_in_a_log(tmp_path):
    """``python -m ppolab.train`` into a pipe (a CI log, ``| tee``): its first line comes before torch loads, then
    one line a phase (the model, the data, the initial evaluation, the steps), every line ending in a newline —
    tqdm's carriage-return redraws reached a line-reading log only when the run ended."""
    import os
    import subprocess
    import sys
    import time

    from helpers import TINY

    cmd = [sys.executable, "-m", "ppolab.train", *TINY, "trainer.total_training_steps=2", "trainer.test_freq=-1",
           f"trainer.run_dir={tmp_path / 'run'}"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ,
                                                                                      "OMP_NUM_THREADS": "1"})
    first = proc.stderr.readline().decode()
    first_at = time.perf_counter() - start
    rest, _ = proc.stderr.read().decode(), proc.wait(timeout=300)
    assert proc.returncode == 0, rest
    assert first.startswith("ppolab: starting python -m ppolab.train"), first
    assert first_at < 5.0, f"the first line came after {first_at:.1f} s"  # the interpreter's start, no torch yet
    lines = [ln for ln in rest.splitlines() if ln.startswith("ppolab [")]
    said = " | ".join(lines)
    for phase in ("loading the model", "data:", "initial evaluation", "before training: val/accuracy",
                  "training steps 1–2"):
        assert phase in said, f"{phase!r} not said: {said}"
    assert "\r" not in rest, "a redraw in a log"


def test_the_main_job_says_how_soon_it_learned():
    """The main job's last line: the first validated step within 2 points of the final accuracy and the seconds
    since the command started (``+50 points by step 20`` on grpo_tiny), not only how long all 100 steps took."""
    from ppolab.train import time_to_accuracy

    seen = [(0, 0.36, 3.0), (5, 0.72, 6.0), (10, 0.84, 9.0), (15, 0.85, 12.0), (20, 0.862, 15.0), (25, 0.87, 18.0),
            (30, 0.85, 21.0), (100, 0.88, 60.0)]
    line = time_to_accuracy(seen, 0.36, 0.88)
    assert line == "learned: 0.862 (+50.2 points, within 2 of the final) first at step 20, 15 s after the command " \
                   "started\n"
    assert time_to_accuracy(seen, 0.36, 0.37) is None  # learned nothing: nothing to time
    assert time_to_accuracy([(0, 0.36, 3.0)], 0.36, 0.88) is None  # validated only before training
