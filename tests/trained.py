"""Runs the tests train (and other costly things they build), each made once: one folder per (preset, overrides,
code), shared by every test file and every pytest worker of a session, and by later sessions when
``PPOLAB_TEST_RUNS`` names a folder to keep runs in.

Why: the any-run lab matrix, the exercise matrices and the tests that read a fresh run all asked for runs of the same
presets at the same shapes, and each trained its own. A run is a function of its preset, its overrides and the code
and data that trained it, so the key is a hash of exactly those — the whole ``ppolab`` package, the shipped models
and datasets, and the versions of the libraries that compute it. Change any of them and the key changes: a cached run
can never stand in for one the current tree would train differently.

Concurrency: pytest-xdist workers (``-n``) may ask for the same run at once; the first takes an exclusive ``flock``
on ``<key>.lock`` and trains, the others wait on that lock and then read. A run is used only when its ``<key>.done``
marker exists (written after ``ppolab.train`` returned), so a worker killed mid-training leaves a folder that the
next asker trains again, never half a run.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
#: What a run depends on besides its preset and overrides.
SOURCES = ("ppolab", "data/models", "data/arith", "data/arith_tool")
LIBRARIES = ("torch", "transformers", "peft", "accelerate", "tokenizers", "safetensors", "numpy")


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over every file under :data:`SOURCES` (path and bytes; caches skipped) and :data:`LIBRARIES`' versions."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256()
    for top in SOURCES:
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    for lib in LIBRARIES:
        try:
            h.update(f"{lib}=={version(lib)}\0".encode())
        except PackageNotFoundError:
            h.update(f"{lib} absent\0".encode())
    return h.hexdigest()


def run_key(preset: str, overrides: list[str]) -> str:
    """A readable, collision-safe folder name: the preset, then 16 hex digits of the hash of everything above."""
    digest = hashlib.sha256(json.dumps([preset, list(overrides), code_fingerprint()]).encode()).hexdigest()
    return f"{preset}-{digest[:16]}"


def shared_root(tmp_path_factory, keep: bool = True) -> Path:
    """``PPOLAB_TEST_RUNS`` when set and ``keep`` (kept across sessions: ``.ci/run`` sets it, so the runs its README
    command trained serve the matrices after it); else a folder of this session, the same for every xdist worker (a
    worker's base temp is ``<session>/popen-gwN``)."""
    given = os.environ.get("PPOLAB_TEST_RUNS") if keep else None
    if given:
        root = Path(given).expanduser().absolute()
    else:
        base = tmp_path_factory.getbasetemp()
        root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once"
    root.mkdir(parents=True, exist_ok=True)
    return root


def build_once(root: Path, key: str, make: Callable[[Path], None]) -> Path:
    """``root/key``, made by ``make(folder)`` unless an earlier call (this process, another worker, an earlier
    session sharing ``root``) finished making it; a folder left half made is emptied and made again."""
    folder, done = root / key, root / f"{key}.done"
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while making; released when the file closes
        if not done.is_file():
            if folder.exists():  # a worker killed mid-way: start over
                shutil.rmtree(folder)
            folder.mkdir()
            make(folder)
            done.write_text(key + "\n")
    return folder


def train_once(root: Path, preset: str, overrides: list[str]) -> str:
    """The run dir of ``ppolab.train(preset, overrides)`` under ``root``, trained now unless it already is."""
    import ppolab

    def make(folder: Path) -> None:
        ppolab.train(preset, [*overrides, f"trainer.run_dir={folder / 'run'}"], progress=False)

    return str(build_once(root, run_key(preset, overrides), make) / "run")


def build_random_llama(out: Path) -> None:
    """A model of another family than the shipped one (Qwen2): a Llama — RMSNorm, SwiGLU, rotary positions,
    grouped-query attention (4 query heads over 2 key/value heads), an untied LM head — with random weights (seed 0),
    hidden 32, 2 layers, saved with the shipped tokenizer. It never writes a right answer, so on GRPO every reward and
    every advantage is 0: the learner's own model before any training, where the labs must still run and teach."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "data" / "models" / "tiny-arith")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


def random_llama(root: Path) -> Path:
    """:func:`build_random_llama`'s folder under ``root``, made once (keyed by its source and the libraries)."""
    import inspect

    return build_once(root, run_key("random-llama", [inspect.getsource(build_random_llama)]), build_random_llama)
