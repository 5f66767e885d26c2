"""The arithmetic data in verl's RL format, and load_rl_dataset's checks."""

import re

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ppolab import data
from ppolab.data import is_held_out, load_rl_dataset, sample_problems, write_arith
from ppolab.models import SHIPPED_ARITH
from ppolab.tokenizer import build_tokenizer

VERL_SCHEMA = {
    "data_source": pa.string(),
    "prompt": pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])),
    "ability": pa.string(),
    "reward_model": pa.struct([("style", pa.string()), ("ground_truth", pa.string())]),
    "extra_info": pa.struct([("split", pa.string()), ("index", pa.int64())]),
}
QUESTION = re.compile(r"What is (\d+)([+*-])(\d+)\?")


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _solve(question: str) -> int:
    a, op, b = QUESTION.fullmatch(question).groups()
    return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]


def _check_rows(rows, split):
    for i, r in enumerate(rows):
        assert r["data_source"] == "arith" and r["ability"] == "math"
        assert len(r["prompt"]) == 1 and r["prompt"][0]["role"] == "user"
        assert r["reward_model"]["style"] == "rule"
        assert r["reward_model"]["ground_truth"] == str(_solve(r["prompt"][0]["content"]))
        assert r["extra_info"] == {"split": split, "index": i}
        assert is_held_out(r["prompt"][0]["content"]) == (split == "test")


@pytest.mark.parametrize("split", ["train", "test"])
def test_shipped_files_have_verl_columns_and_types(split):
    table = pq.read_table(SHIPPED_ARITH / f"{split}.parquet")
    assert {f.name: f.type for f in table.schema} == VERL_SCHEMA
    rows = table.to_pylist()
    assert len(rows) == {"train": 5000, "test": 1000}[split]
    _check_rows(rows, split)


def test_shipped_splits_are_disjoint_and_rebuild_from_the_seed(tmp_path):
    train, test = write_arith(tmp_path)  # the CLI defaults
    for path in (train, test):
        assert pq.read_table(path).equals(pq.read_table(SHIPPED_ARITH / path.name))
    q = {s: {r["prompt"][0]["content"] for r in pq.read_table(tmp_path / f"{s}.parquet").to_pylist()}
         for s in ("train", "test")}
    assert len(q["train"]) == 5000 and len(q["test"]) == 1000
    assert not q["train"] & q["test"]


def test_deterministic_from_seed(tmp_path):
    a = write_arith(tmp_path / "a", 50, 20, seed=3)
    b = write_arith(tmp_path / "b", 50, 20, seed=3)
    c = write_arith(tmp_path / "c", 50, 20, seed=4)
    assert pq.read_table(a[0]).equals(pq.read_table(b[0]))
    assert not pq.read_table(a[0]).equals(pq.read_table(c[0]))


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_difficulty_tiers(digits):
    for split in ("train", "test"):
        for q, ans in sample_problems(100 if digits > 1 else 10, split, 0, digits, "+-*"):
            a, op, b = QUESTION.fullmatch(q).groups()
            assert len(a) == digits
            assert len(b) == (1 if op == "*" else digits)
            assert ans == _solve(q)


def test_mixed_tiers_and_ops():
    qs = [q for q, _ in sample_problems(300, "train", 0, [1, 3], "+-")]
    lengths = {len(QUESTION.fullmatch(q).group(1)) for q in qs}
    assert lengths == {1, 3}
    assert {QUESTION.fullmatch(q).group(2) for q in qs} == {"+", "-"}
    with pytest.raises(ValueError, match="too few"):
        sample_problems(500, "test", 0, 1, "+")  # only ~10 one-digit sums are held out
    with pytest.raises(ValueError, match="ops"):
        sample_problems(5, "train", 0, 2, "/")


def test_cli(tmp_path, capsys):
    data.main(["arith", "--out", str(tmp_path), "--n-train", "30", "--n-test", "10", "--digits", "1,2", "--ops", "+-*"])
    assert "30 rows" in capsys.readouterr().out
    assert pq.read_metadata(tmp_path / "test.parquet").num_rows == 10


def test_load_rl_dataset_items(tok):
    ds = load_rl_dataset(SHIPPED_ARITH / "test.parquet", tok, max_prompt_length=24)
    assert len(ds) == 1000 and len(ds[:10]) == 10
    item = ds[3]
    assert set(item) >= {"input_ids", "raw_prompt", "data_source", "ground_truth", "extra_info", "index"}
    text = tok.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=False)
    assert item["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert (item["input_ids"][0] == tok.bos_token_id
            and item["input_ids"][-1] == tok.convert_tokens_to_ids("<|assistant|>"))
    assert item["index"] == 3 and item["extra_info"]["split"] == "test" and item["data_source"] == "arith"
    assert max(len(it["input_ids"]) for it in ds) <= 24
    both = load_rl_dataset([SHIPPED_ARITH / "test.parquet", SHIPPED_ARITH / "test.parquet"], tok, 24)
    assert len(both) == 2000


def test_loads_a_verl_gsm8k_style_file(tmp_path, tok):
    # Written the way verl's examples/data_preprocess/gsm8k.py does (pandas/datasets, extra keys in extra_info).
    rows = [
        {
            "data_source": "openai/gsm8k",
            # (the tiny tokenizer's characters only: a real GSM8K prompt needs a real model's tokenizer)
            "prompt": [{"role": "user", "content": "What is 1+2?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "3"},
            "extra_info": {"split": "test", "index": 7, "answer": "He has 3.\n#### 3", "question": "Tom has 3 apples."},
        }
    ]
    path = tmp_path / "gsm8k.parquet"
    pd.DataFrame(rows).to_parquet(path)
    ds = load_rl_dataset(str(path), tok, 128)
    assert ds[0]["ground_truth"] == "3" and ds[0]["index"] == 7 and ds[0]["data_source"] == "openai/gsm8k"
    assert ds[0]["extra_info"]["answer"].endswith("#### 3")


def _write(tmp_path, rows, name="bad.parquet"):
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _good_rows(n=3):
    return [data.make_row(f"What is {i}+1?", i + 1, "train", i) for i in range(n)]


def test_missing_column_names_file_and_column(tmp_path, tok):
    rows = [{k: v for k, v in r.items() if k != "reward_model"} for r in _good_rows()]
    path = _write(tmp_path, rows)
    with pytest.raises(ValueError, match=r"bad\.parquet.*column 'reward_model'.*missing"):
        load_rl_dataset(path, tok, 64)


@pytest.mark.parametrize(
    "column,value,why",
    [
        ("prompt", "What is 1+1?", "list of chat messages"),
        ("prompt", [{"role": "user"}], "messages"),
        ("prompt", [{"role": "tool", "content": "1+1"}], "chat template"),
        ("reward_model", {"style": "rule"}, "ground_truth"),
        ("data_source", 5, "string"),
        ("extra_info", "x", "dict"),
    ],
)
def test_bad_row_names_file_row_and_column(tmp_path, tok, column, value, why):
    rows = _good_rows()
    rows[2][column] = value
    # keep the Arrow column typeable: the bad row goes into its own file
    path = _write(tmp_path, rows[2:], "bad_row.parquet")
    path_ok = _write(tmp_path, rows[:2], "ok.parquet")
    with pytest.raises(ValueError, match=rf"bad_row\.parquet: row 0, column '{column}'.*{why}"):
        load_rl_dataset([path_ok, path], tok, 64)
    assert len(load_rl_dataset(path_ok, tok, 64)) == 2


def test_too_long_prompt_names_file_row_and_column(tmp_path, tok):
    rows = _good_rows(4)
    rows[2]["prompt"] = [{"role": "user", "content": "What is " + "1" * 40 + "+1?"}]
    path = _write(tmp_path, rows)
    with pytest.raises(ValueError, match=r"bad\.parquet: row 2, column 'prompt': \d+ tokens.*max_prompt_length=24"):
        load_rl_dataset(path, tok, 24)
    assert len(load_rl_dataset(path, tok, 64)) == 4


def test_missing_file(tmp_path, tok):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        load_rl_dataset(tmp_path / "nope.parquet", tok, 64)
