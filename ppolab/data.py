"""The arithmetic task in verl's RL dataset format, and a loader for verl-format parquet files.

A row, as verl's GSM8K preprocessing writes it::

    {"data_source": "arith",
     "prompt": [{"role": "user", "content": "What is 37+48?"}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "85"},
     "extra_info": {"split": "train", "index": 0}}

The answer the model should write is ``#### 85``. About 10% of all problems (chosen by a hash of
the question, independent of any seed) are held out: only the test split draws from them, so
train rows and SFT data never contain a test question.

The ``arith_tool`` task multiplies two numbers of ``digits`` digits each (``What is 37*48?``, ground truth
``1776``): too hard for the tiny model to answer directly, easy with the calculator tool of the
multi-turn agent rollout (``ppolab.rollout.agent``). Its rows have ``data_source`` ``arith_tool``.

    python -m ppolab.data arith --out data/arith
    python -m ppolab.data arith_tool --out data/arith_tool

``gsm8k`` converts a local copy of GSM8K (its parquet or jsonl files with ``question``/``answer``, as on a GPU box
without hub access) into the same format, as verl's ``examples/data_preprocess/gsm8k.py`` does::

    python -m ppolab.data gsm8k --input ~/gsm8k --out data/gsm8k
"""

from __future__ import annotations

import argparse
import os
import random
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "arith"
TOOL_DATA_SOURCE = "arith_tool"
REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
HELD_OUT_PERCENT = 10


# ----------------------------------------------------------------------------- the arithmetic task


def _operand(rng: random.Random, digits: int) -> int:
    """A number with exactly ``digits`` digits (0-9 for one digit)."""
    return rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits)


def sample_problem(rng: random.Random, digits: int | Sequence[int] = 2, ops: str = "+-", full_mul: bool = False
                   ) -> tuple[str, int]:
    """One random problem ``(question, answer)``; ``*`` multiplies by a single digit, or by a number of the
    same number of digits with ``full_mul`` (the ``arith_tool`` task)."""
    d = digits if isinstance(digits, int) else rng.choice(list(digits))
    op = rng.choice(ops)
    a = _operand(rng, d)
    b = _operand(rng, 1) if op == "*" and not full_mul else _operand(rng, d)
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a}{op}{b}?", answer


def is_held_out(question: str) -> bool:
    """Whether a question belongs to the test pool (a fixed hash, so every seed agrees)."""
    return zlib.crc32(question.encode()) % 100 < HELD_OUT_PERCENT


def sample_problems(
    n: int, split: str, seed: int, digits: int | Sequence[int] = 2, ops: str = "+-", unique: bool = True,
    full_mul: bool = False,
) -> list[tuple[str, int]]:
    """``n`` problems from the ``test`` (held-out) or ``train`` pool."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not ops or set(ops) - set("+-*"):
        raise ValueError(f"ops must be made of '+', '-', '*', got {ops!r}")
    rng = random.Random(f"{seed}-{split}")
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    for _ in range(200 * n + 1000):
        if len(out) == n:
            return out
        q, a = sample_problem(rng, digits, ops, full_mul)
        if is_held_out(q) != (split == "test") or (unique and q in seen):
            continue
        seen.add(q)
        out.append((q, a))
    raise ValueError(f"could not draw {n} distinct {split} problems with digits={digits} ops={ops!r}: too few exist")


def make_row(question: str, answer: int, split: str, index: int, data_source: str = DATA_SOURCE) -> dict[str, Any]:
    """One verl RL row."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index},
    }


def response_for(answer: int | str) -> str:
    """The target response (EOS comes from the chat template / tokenizer)."""
    return f"#### {answer}"


def write_arith(
    out: str | os.PathLike,
    n_train: int = 5000,
    n_test: int = 1000,
    seed: int = 0,
    digits: int | Sequence[int] = 2,
    ops: str = "+-",
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", n_train), ("test", n_test)):
        rows = [make_row(q, a, split, i) for i, (q, a) in enumerate(sample_problems(n, split, seed, digits, ops))]
        path = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        paths.append(path)
    return paths[0], paths[1]


def tool_call_for(question: str) -> str:
    """The calculator call that answers an arithmetic question: ``What is 37*48?`` -> ``37*48``."""
    return question.removeprefix("What is ").removesuffix("?")


def write_arith_tool(
    out: str | os.PathLike, n_train: int = 5000, n_test: int = 500, seed: int = 0,
    digits: int | Sequence[int] = 2, ops: str = "*",
) -> tuple[Path, Path]:
    """The ``arith_tool`` task (``digits``-digit by ``digits``-digit products by default) as ``train.parquet``
    and ``test.parquet`` under ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", n_train), ("test", n_test)):
        problems = sample_problems(n, split, seed, digits, ops, full_mul=True)
        rows = [make_row(q, a, split, i, TOOL_DATA_SOURCE) for i, (q, a) in enumerate(problems)]
        path = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        paths.append(path)
    return paths[0], paths[1]


# ----------------------------------------------------------------------------- loading verl parquet


class RLDataset:
    """Rows of a verl RL dataset with the chat-templated prompt already tokenized.

    Each item is a dict: ``input_ids`` (list[int]), ``prompt_text``, ``raw_prompt`` (the messages),
    ``data_source``, ``ground_truth``, ``ability``, ``extra_info``, ``index``.
    """

    def __init__(self, rows: list[dict[str, Any]]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int | slice) -> Any:
        return RLDataset(self.rows[i]) if isinstance(i, slice) else self.rows[i]

    def __iter__(self):
        return iter(self.rows)

    def __repr__(self) -> str:
        return f"RLDataset({len(self)} rows)"


def _check_row(row: dict[str, Any]) -> tuple[str | None, str]:
    """Returns ``(bad column, why)`` or ``(None, "")`` for a valid row."""
    if not isinstance(row["data_source"], str):
        return "data_source", f"expected a string, got {type(row['data_source']).__name__}"
    prompt = row["prompt"]
    if not isinstance(prompt, list) or not prompt:
        return "prompt", f"expected a non-empty list of chat messages, got {type(prompt).__name__}"
    for m in prompt:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return "prompt", f"expected messages {{'role': str, 'content': str}}, got {m!r}"
    if not any(m["content"].strip() for m in prompt):
        return "prompt", "every message's content is empty: the model would be asked nothing; fill or drop the row"
    rm = row["reward_model"]
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        return "reward_model", f"expected a dict with 'ground_truth', got {rm!r}"
    if not isinstance(rm["ground_truth"], (str, int)) or isinstance(rm["ground_truth"], bool):
        return "reward_model", f"ground_truth must be a string, got {type(rm['ground_truth']).__name__}"
    if row.get("extra_info") is not None and not isinstance(row["extra_info"], dict):
        return "extra_info", f"expected a dict, got {type(row['extra_info']).__name__}"
    return None, ""


def _paths(path_or_paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    return [Path(p) for p in ([path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else path_or_paths)]


def parquet_rows(path: str | os.PathLike, key: str = "data file") -> int:
    """Rows of a parquet file from its footer (no data read); the errors name ``key`` and the file."""
    from ppolab.errors import DataError, MissingFileError

    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{key}: {path} does not exist; give a verl-format parquet file "
                               "(python -m ppolab.data arith --out <dir> writes one)")
    try:
        return pq.read_metadata(path).num_rows
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{key}: {path} is not a parquet file ({e}); give verl-format parquet (python -m "
                        "ppolab.data arith --out <dir> writes one)") from None


def check_data_files(data: Any, need_val: bool = True) -> dict[str, int]:
    """Refuse, before any model loads, data files a run cannot use: missing or not parquet, an empty train
    file, fewer train rows than ``data.train_batch_size``, an empty val file when validation is asked for
    (``need_val``). ``data`` is the ``data`` config group; returns rows per file."""
    from ppolab.errors import DataError

    rows = {str(f): parquet_rows(f, "data.train_files") for f in _paths(data.train_files)}
    for f, n in rows.items():
        if n == 0:
            raise DataError(f"data.train_files: {f} has no rows; give a parquet with prompts (or drop it from "
                            "data.train_files)")
    total, size = sum(rows.values()), data.train_batch_size
    if total < size:
        raise DataError(f"data.train_files hold {total} prompts ({', '.join(rows)}), fewer than "
                        f"data.train_batch_size={size} that one step needs; lower data.train_batch_size (and "
                        "ppo_mini_batch_size to divide it) or add prompts")
    for f in _paths(data.val_files):
        n = rows[str(f)] = parquet_rows(f, "data.val_files")
        if n == 0 and need_val:
            raise DataError(f"data.val_files: {f} has no rows but validation was asked for (trainer.test_freq / "
                            "trainer.val_before_train); give prompts, or set trainer.test_freq=-1 and "
                            "trainer.val_before_train=false")
    return rows


def unencodable_characters(tokenizer: Any, text: str, ids: Sequence[int]) -> list[str]:
    """The distinct pieces of ``text`` the tokenizer can only encode as its unknown token, in order (empty for a
    byte-level BPE, which encodes every character). The literal unknown-token text is not counted."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or unk not in ids:
        return []
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        pieces = [text[a:b] for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if tid == unk]
    except (NotImplementedError, ValueError, KeyError, TypeError):  # a slow tokenizer has no offsets
        pieces = [c for c in text if tokenizer(c, add_special_tokens=False)["input_ids"] == [unk]]
    return [p for p in dict.fromkeys(pieces) if p and p != tokenizer.unk_token]


def load_rl_dataset(
    path_or_paths: str | os.PathLike | Sequence[str | os.PathLike], tokenizer: Any, max_prompt_length: int
) -> RLDataset:
    """Read verl-format parquet file(s) and apply the tokenizer's chat template to each prompt.

    Raises ``ValueError`` naming the file, row and column for a missing column, a wrong type, or a
    prompt longer than ``max_prompt_length`` tokens.
    """
    if not getattr(tokenizer, "chat_template", None):
        from ppolab.errors import DataError

        raise DataError(f"the tokenizer of {getattr(tokenizer, 'name_or_path', '') or 'the model'} has no chat "
                        "template, and every prompt goes through one (verl's RLHFDataset applies "
                        "tokenizer.apply_chat_template to the 'prompt' messages) — base models often have none: add "
                        "a \"chat_template\" to the model directory's tokenizer_config.json (or a "
                        "chat_template.jinja beside it), or train from an instruct model's directory")
    rows: list[dict[str, Any]] = []
    for path in _paths(path_or_paths):
        parquet_rows(path)  # a missing or non-parquet file: an error naming it
        table = pq.read_table(path)
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"{path}: every row, column {missing[0]!r}: missing (columns: {table.column_names})")
        for i, row in enumerate(table.to_pylist()):
            where = f"{path}: row {i}, column"
            column, why = _check_row(row)
            if column:
                raise ValueError(f"{where} {column!r}: {why}")
            try:
                text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
            except Exception as e:  # a template that rejects a role or message
                raise ValueError(f"{where} 'prompt': chat template failed: {e}") from e
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            unknown = unencodable_characters(tokenizer, text, ids)
            if unknown:
                from ppolab.errors import DataError

                shown = ", ".join(f"{c!r} (U+{ord(c[0]):04X})" for c in unknown[:5])
                raise DataError(
                    f"{where} 'prompt': {shown} {'is' if len(unknown) == 1 else 'are'} not in the vocabulary of the "
                    f"tokenizer of {getattr(tokenizer, 'name_or_path', 'the model') or 'the model'}: each would become "
                    f"{tokenizer.unk_token} and the model would never see it. Replace or remove "
                    f"{'it' if len(unknown) == 1 else 'them'} in the data, or extend the tokenizer "
                    "(tokenizer.add_tokens([...]); model.resize_token_embeddings(len(tokenizer)); save both to a new "
                    "model directory and point actor_rollout_ref.model.path at it)")
            if len(ids) > max_prompt_length:
                raise ValueError(
                    f"{where} 'prompt': {len(ids)} tokens after the chat template, "
                    f"more than max_prompt_length={max_prompt_length}"
                )
            extra = row.get("extra_info") or {}
            rows.append(
                {
                    "input_ids": ids,
                    "prompt_text": text,
                    "raw_prompt": row["prompt"],
                    "data_source": row["data_source"],
                    "ground_truth": str(row["reward_model"]["ground_truth"]),
                    "ability": row.get("ability"),
                    "extra_info": extra,
                    "index": extra.get("index", len(rows)),
                }
            )
    return RLDataset(rows)


# ----------------------------------------------------------------------------- CLI


# ----------------------------------------------------------------------------- GSM8K from a local copy

GSM8K_DATA_SOURCE = "openai/gsm8k"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
GSM8K_SUFFIXES = (".parquet", ".jsonl", ".json")


def gsm8k_ground_truth(answer: str) -> str | None:
    """The number after ``#### `` in a GSM8K answer, commas removed (verl's ``extract_solution``); None if absent."""
    match = GSM8K_ANSWER.search(answer)
    return match.group(0).split("#### ")[1].replace(",", "") if match else None


def _gsm8k_files(input_dir: Path, split: str) -> list[Path]:
    """The ``split`` files under ``input_dir`` (``train.jsonl``, ``main/train-00000-of-00001.parquet``, ...), shards
    in name order; verl reads the ``main`` config, so ``socratic`` copies are skipped when others exist."""
    found = sorted(p for p in input_dir.rglob(f"{split}*") if p.is_file() and p.suffix in GSM8K_SUFFIXES)
    plain = [p for p in found if "socratic" not in p.relative_to(input_dir).parts]
    return plain or found


def _gsm8k_records(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    import json

    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def gsm8k_rows(paths: Sequence[Path], split: str) -> list[dict[str, Any]]:
    """verl RL rows from GSM8K records (verl's ``examples/data_preprocess/gsm8k.py``): the question plus the
    instruction suffix as one user message, ``data_source`` ``openai/gsm8k``, ability ``math``, the number after
    ``####`` as rule ground truth, and ``extra_info`` {split, index, answer, question}; index counts over the split.
    Raises ``ValueError`` naming the file and row for a missing column or an answer without ``#### <number>``."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        for i, rec in enumerate(_gsm8k_records(path)):
            missing = [c for c in ("question", "answer") if not isinstance(rec.get(c), str)]
            if missing:
                raise ValueError(f"{path}: row {i} has no text column {missing[0]!r} (GSM8K rows need 'question' "
                                 f"and 'answer'; columns: {sorted(rec)})")
            solution = gsm8k_ground_truth(rec["answer"])
            if solution is None:
                raise ValueError(f"{path}: row {i} has no final answer '#### <number>' in its 'answer' column: "
                                 f"{rec['answer'][-80:]!r}")
            rows.append({
                "data_source": GSM8K_DATA_SOURCE,
                "prompt": [{"role": "user", "content": rec["question"] + " " + GSM8K_INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": solution},
                "extra_info": {"split": split, "index": len(rows), "answer": rec["answer"],
                               "question": rec["question"]},
            })
    return rows


def write_gsm8k(input_dir: str | os.PathLike, out: str | os.PathLike) -> tuple[Path, Path]:
    """Convert a local GSM8K copy (parquet or jsonl with ``question``/``answer``) into verl's ``train.parquet`` and
    ``test.parquet`` under ``out``; returns their paths. Raises ``FileNotFoundError`` for a missing directory or
    split, ``ValueError`` for a bad row (both name the path)."""
    input_dir = Path(input_dir)
    if not input_dir.is_dir():
        raise FileNotFoundError(f"GSM8K input directory {input_dir} does not exist (or is not a directory)")
    splits = {split: _gsm8k_files(input_dir, split) for split in ("train", "test")}
    for split, paths in splits.items():
        if not paths:
            raise FileNotFoundError(f"no GSM8K {split} file under {input_dir}: expected {split}*.parquet or "
                                    f"{split}*.jsonl (e.g. main/{split}-00000-of-00001.parquet or {split}.jsonl)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for split, paths in splits.items():
        path = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(gsm8k_rows(paths, split)), path)
        written.append(path)
    return written[0], written[1]


def digits_arg(s: str) -> int | list[int]:
    ds = [int(x) for x in s.split(",")]
    if any(d < 1 or d > 6 for d in ds):
        raise argparse.ArgumentTypeError("digits per operand must be 1..6")
    return ds[0] if len(ds) == 1 else ds


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ppolab.data", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="task", required=True)
    tasks = (  # name, help, n_test, ops, ops help
        ("arith", "arithmetic prompts like 'What is 37+48?' answered '#### 85'", 1000, "+-",
         "operators to draw from, e.g. '+-*'"),
        ("arith_tool", "products like 'What is 37*48?' for the calculator tool agent", 500, "*",
         "operators to draw from ('*' multiplies two such operands)"),
    )
    for name, task_help, n_test, ops, ops_help in tasks:
        t = sub.add_parser(name, help=task_help)
        t.add_argument("--out", default=f"data/{name}", help="output directory")
        t.add_argument("--n-train", type=int, default=5000)
        t.add_argument("--n-test", type=int, default=n_test)
        t.add_argument("--digits", type=digits_arg, default=2,
                       help="digits per operand (difficulty tier), or a mix '1,2'")
        t.add_argument("--ops", default=ops, help=ops_help)
        t.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("gsm8k", help="a local GSM8K copy (parquet/jsonl with question, answer) in verl's format")
    g.add_argument("--input", required=True, help="directory holding the train/test parquet or jsonl files")
    g.add_argument("--out", default="data/gsm8k", help="output directory")
    args = p.parse_args(argv)
    if args.task == "gsm8k":
        try:
            train, test = write_gsm8k(args.input, args.out)
        except (FileNotFoundError, ValueError) as e:
            p.exit(2, f"python -m ppolab.data gsm8k: error: {e}\n")
    else:
        write = write_arith_tool if args.task == "arith_tool" else write_arith
        train, test = write(args.out, args.n_train, args.n_test, args.seed, args.digits, args.ops)
    for path in (train, test):
        print(f"wrote {path} ({pq.read_metadata(path).num_rows} rows, {path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
