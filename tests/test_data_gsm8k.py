"""``python -m ppolab.data gsm8k``: a local GSM8K copy → verl's parquet format (verl's
examples/data_preprocess/gsm8k.py), on a few hand-made rows."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ppolab import data

ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A car costs $12,500 more than $500. Price?", "answer": "12,500 + 500 = 13,000\n#### 13,000"},
    {"question": "What is 2 - 5?", "answer": "2 - 5 = -3\n#### -3"},
]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_ground_truth_extraction():
    assert data.gsm8k_ground_truth("so\n#### 1,234") == "1234"
    assert data.gsm8k_ground_truth("#### -3.5") == "-3.5"
    assert data.gsm8k_ground_truth("the answer is 7") is None


def test_jsonl_copy_to_verl_rows(tmp_path):
    write_jsonl(tmp_path / "in" / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "in" / "test.jsonl", ROWS[:1])
    train, test = data.write_gsm8k(tmp_path / "in", tmp_path / "out")
    rows = pq.read_table(train).to_pylist()
    assert [r["reward_model"] for r in rows] == [{"style": "rule", "ground_truth": g} for g in ("7", "13000", "-3")]
    first = rows[0]
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert first["prompt"] == [{"role": "user", "content": ROWS[0]["question"] + " Let's think step by step and "
                                "output the final answer after \"####\"."}]
    assert first["extra_info"] == {"split": "train", "index": 0, "answer": ROWS[0]["answer"],
                                   "question": ROWS[0]["question"]}
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2]
    assert pq.read_table(test).to_pylist()[0]["extra_info"]["split"] == "test"
    assert all(data._check_row(r) == (None, "") for r in rows)  # what the RL dataset loader accepts


def test_hub_parquet_layout_with_shards_and_socratic(tmp_path):
    main, socratic = tmp_path / "in" / "main", tmp_path / "in" / "socratic"
    main.mkdir(parents=True)
    socratic.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), main / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[2:]), main / "train-00001-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[:1]), main / "test-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS * 5), socratic / "train-00000-of-00001.parquet")
    train, _ = data.write_gsm8k(tmp_path / "in", tmp_path / "out")
    rows = pq.read_table(train).to_pylist()
    assert len(rows) == 3 and [r["extra_info"]["index"] for r in rows] == [0, 1, 2]


def test_cli(tmp_path, capsys):
    write_jsonl(tmp_path / "in" / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "in" / "test.jsonl", ROWS)
    data.main(["gsm8k", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "train.parquet (3 rows" in out and "test.parquet (3 rows" in out


def test_errors_name_the_path(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        data.write_gsm8k(tmp_path / "nowhere", tmp_path / "out")
    write_jsonl(tmp_path / "in" / "train.jsonl", ROWS)
    with pytest.raises(FileNotFoundError, match=r"no GSM8K test file under .*in"):
        data.write_gsm8k(tmp_path / "in", tmp_path / "out")
    write_jsonl(tmp_path / "in" / "test.jsonl", [ROWS[0], {"question": "q?", "answer": "no final answer"}])
    with pytest.raises(ValueError, match=r"test.jsonl: row 1 has no final answer '#### <number>'"):
        data.write_gsm8k(tmp_path / "in", tmp_path / "out")
    write_jsonl(tmp_path / "in" / "test.jsonl", [{"problem": "q?", "answer": "#### 1"}])
    with pytest.raises(ValueError, match=r"test.jsonl: row 0 has no text column 'question'"):
        data.write_gsm8k(tmp_path / "in", tmp_path / "out")
    with pytest.raises(SystemExit) as e:
        data.main(["gsm8k", "--input", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
    assert e.value.code == 2 and "missing" in capsys.readouterr().err
