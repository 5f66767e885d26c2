"""The shipped tiny model, the character tokenizer, evaluation and a reduced SFT run (issue 3)."""
import os
import subprocess
import sys

import pandas as pd
import pytest

from ppolab.data import load_rl_dataset, response_for, sample_problems
from ppolab.eval import evaluate
from ppolab.models import SHIPPED_ARITH, SHIPPED_MODEL, load_tokenizer, load_tokenizer_and_model
from ppolab.sft import train_sft
from ppolab.tokenizer import build_tokenizer

# The range data/models/README.md records for the shipped checkpoint.
GREEDY_RANGE = (0.30, 0.60)


@pytest.fixture(scope="module")
def shipped():
    return load_tokenizer_and_model(SHIPPED_MODEL, "float32", "cpu")


def test_tokenizer_round_trips_every_training_string():
    tok = build_tokenizer()
    df = pd.read_parquet(SHIPPED_ARITH / "train.parquet")
    for prompt, rm in zip(df["prompt"], df["reward_model"]):
        for text in (prompt[0]["content"], response_for(rm["ground_truth"])):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.unk_token_id is None or tok.unk_token_id not in ids
            assert tok.decode(ids) == text


def test_chat_template_marks_roles_and_adds_generation_prompt():
    tok = load_tokenizer(SHIPPED_MODEL)
    msgs = [{"role": "user", "content": "What is 1+2?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    bare = tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    assert "What is 1+2?" in text and text.startswith(bare) and len(text) > len(bare)


@pytest.mark.slow  # a fresh interpreter importing torch and transformers (7 s)
def test_shipped_model_loads_offline_in_a_fresh_process():
    code = ("from transformers import AutoModelForCausalLM; import sys; "
            f"m = AutoModelForCausalLM.from_pretrained(r'{SHIPPED_MODEL}'); "
            "print(type(m).__name__, sum(p.numel() for p in m.parameters()))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    name, n = out.stdout.split()
    assert name == "Qwen2ForCausalLM" and 1e5 < int(n) < 5e6


def test_missing_model_dir_names_the_path_and_suggests_the_shipped_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="tiny-arith") as e:
        load_tokenizer_and_model(tmp_path / "nope", "float32", "cpu")
    assert "nope" in str(e.value)


def test_shipped_model_accuracy_is_inside_the_recorded_range(shipped):
    tok, model = shipped
    ds = load_rl_dataset(SHIPPED_ARITH / "test.parquet", tok, 64)[:500]  # as `python -m ppolab.eval` (--n 500)
    greedy = evaluate(model, tok, ds, 16, do_sample=False, n_examples=0)
    sampled = evaluate(model, tok, ds, 16, do_sample=True, n_examples=0, seed=0)
    assert greedy["n"] == 500
    assert GREEDY_RANGE[0] <= greedy["accuracy"] <= GREEDY_RANGE[1], greedy["accuracy"]
    assert sampled["accuracy"] < greedy["accuracy"]


def test_reduced_sft_lowers_the_loss():
    r = train_sft(None, steps=30, batch_size=16, lr=3e-3, hidden=32, layers=1, heads=2,
                  progress=False)
    first, last = sum(r["losses"][:5]) / 5, sum(r["losses"][-5:]) / 5
    assert last < 0.75 * first, (first, last)
    assert r["n_params"] < 1e5


def test_sft_never_trains_on_test_questions():
    test_q = {p[0]["content"] for p in pd.read_parquet(SHIPPED_ARITH / "test.parquet")["prompt"]}
    train_q = {q for q, _ in sample_problems(5000, "train", 0, 2, "+-", unique=False)}
    assert not test_q & train_q


def test_data_dir_stays_small():
    size = sum(f.stat().st_size for f in (SHIPPED_MODEL.parent.parent).rglob("*") if f.is_file())
    assert size < 20 * 2**20
