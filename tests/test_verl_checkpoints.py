"""A verl job's checkpoints (ppolab/verl_checkpoints.py, ppolab/numbers/checkpoint_moves.py): the shipped pair in
verl 0.9.1's layout opens, LoRA's effective move is B·A's, pickles are refused unread, bad input is one line."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ppolab.errors import FileFormatError, MissingFileError
from ppolab.numbers.checkpoint_moves import checkpoint_moves
from ppolab.verl_checkpoints import EXAMPLE, PICKLES_ONLY, checkpoint_pair, read_weights, weight_files


def test_the_shipped_pair_opens_in_verls_layout():
    a, b = checkpoint_pair()
    assert (a.name, b.name) == ("global_step_2", "global_step_4")
    files, lora = weight_files(a)
    assert files == [a / "actor" / "huggingface" / "model.safetensors"] and lora == {"r": 8, "lora_alpha": 16}
    moves = checkpoint_moves(a, b)
    # LoRA: only adapters move; the base weights, embeddings and norms are the same bytes at both steps
    moved = {t["name"] for t in moves["tensors"] if t["delta_norm"] > 0}
    assert moved and all(".lora_" in n for n in moved)
    assert moves["lora"] and all(m["delta_norm"] > 0 and 0 < m["rel"] < 1 for m in moves["lora"])


def _lora_pair(tmp_path: Path, scale_meta: dict) -> tuple[Path, Path, dict]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 5, generator=g)
    sides = {}
    for step in (1, 2):
        d = tmp_path / f"global_step_{step}" / "actor"
        (d / "huggingface").mkdir(parents=True)
        t = {"m.q.base_layer.weight": w, "m.q.lora_A.default.weight": torch.randn(2, 5, generator=g),
             "m.q.lora_B.default.weight": torch.randn(6, 2, generator=g)}
        save_file(t, str(d / "huggingface" / "model.safetensors"))
        (d / "lora_train_meta.json").write_text(json.dumps(scale_meta))
        sides[step] = t
    return tmp_path / "global_step_1", tmp_path / "global_step_2", sides


def test_lora_moves_by_the_product_of_its_factors_times_alpha_over_r(tmp_path):
    a, b, t = _lora_pair(tmp_path, {"r": 2, "lora_alpha": 8, "task_type": "CAUSAL_LM"})
    moves = checkpoint_moves(a, b)
    want = 4.0 * (t[2]["m.q.lora_B.default.weight"] @ t[2]["m.q.lora_A.default.weight"]
                  - t[1]["m.q.lora_B.default.weight"] @ t[1]["m.q.lora_A.default.weight"])
    (m,) = moves["lora"]
    assert m["module"] == "m.q" and moves["scaling"] == 4.0
    assert m["delta_norm"] == pytest.approx(float(want.norm()), rel=1e-6)
    assert m["rel"] == pytest.approx(float(want.norm() / t[1]["m.q.base_layer.weight"].norm()), rel=1e-6)


def test_a_checkpoint_of_pickles_only_is_refused_unread(tmp_path):
    actor = tmp_path / "global_step_3" / "actor"
    actor.mkdir(parents=True)
    shard = actor / "model_world_size_2_rank_0.pt"
    shard.write_bytes(b"not a pickle: the refusal comes from the file's name, before anything is read")
    with pytest.raises(FileFormatError) as e:
        weight_files(tmp_path / "global_step_3")
    assert "model_world_size_2_rank_0.pt" in str(e.value) and "hf_model" in str(e.value)
    assert PICKLES_ONLY.split("{")[0] in str(e.value)


def test_another_trainers_pickled_checkpoint_is_refused_unread(tmp_path):
    """DeepSpeed's global_step folder (as OpenRLHF saves it), or a pytorch_model.bin: pickles, named, not opened."""
    ds = tmp_path / "global_step10"
    ds.mkdir()
    (ds / "mp_rank_00_model_states.pt").write_bytes(b"not a pickle")
    with pytest.raises(FileFormatError, match=r"pickled weights only \(mp_rank_00_model_states.pt\)"):
        weight_files(ds)


def test_bad_checkpoints_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(MissingFileError, match="does not exist"):
        weight_files(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileFormatError, match="holds no weights ppolab can read"):
        weight_files(tmp_path / "empty")
    bad = tmp_path / "torn" / "huggingface"
    bad.mkdir(parents=True)
    (bad / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(FileFormatError, match="not a whole safetensors file"):
        read_weights(tmp_path / "torn")
    with pytest.raises(FileFormatError, match="holds 0 global_step_"):
        checkpoint_pair(tmp_path / "empty")
    monkeypatch.setenv("PPOLAB_VERL_CHECKPOINTS", f"{EXAMPLE / 'global_step_4'}{os.pathsep}{EXAMPLE / 'global_step_2'}")
    assert [p.name for p in checkpoint_pair()] == ["global_step_4", "global_step_2"]


def test_two_checkpoints_of_other_models_are_named(tmp_path):
    for step, shape in ((1, (2, 3)), (2, (3, 3))):
        d = tmp_path / f"global_step_{step}" / "actor" / "huggingface"
        d.mkdir(parents=True)
        save_file({"w": torch.zeros(shape)}, str(d / "model.safetensors"))
    with pytest.raises(FileFormatError, match=r"w is \(2, 3\) in .* and \(3, 3\)"):
        checkpoint_moves(tmp_path / "global_step_1", tmp_path / "global_step_2")
