"""Issue 23, item 1: a run dir carries the tokenizer it was trained with and finds its model only by fingerprint —
never a silent fallback to the shipped model."""
from __future__ import annotations

import json
import shutil

import pytest

import ppolab
from ppolab.errors import MissingFileError
from ppolab.models import SHIPPED_MODEL, load_tokenizer
from ppolab.run.files import TOKENIZER_DIR
from ppolab.run.reader import SHIPPED_RUNS


@pytest.mark.parametrize("name", sorted(SHIPPED_RUNS))
def test_every_shipped_run_carries_its_tokenizer_and_finds_its_model(name):
    run = ppolab.load_run(SHIPPED_RUNS[name])
    tok = run.tokenizer()
    model = run.model_path()
    assert tok.get_vocab() == load_tokenizer(model).get_vocab()
    step = run.step(run.steps[0])
    decoded = tok.batch_decode(step["responses"][:4].long(), skip_special_tokens=True)
    assert decoded == step.texts["responses"][:4]  # exactly what the trainer decoded when it recorded the step


def test_a_fresh_run_records_its_tokenizer(finished):
    run = ppolab.load_run(finished)
    assert (finished / TOKENIZER_DIR / "tokenizer.json").is_file()
    text = "What is 12+7? #### 19"
    assert run.tokenizer()(text)["input_ids"] == load_tokenizer(SHIPPED_MODEL)(text)["input_ids"]
    assert run.tokenizer().chat_template == load_tokenizer(SHIPPED_MODEL).chat_template


def test_a_run_without_its_tokenizer_says_so(copy_of):
    shutil.rmtree(copy_of / TOKENIZER_DIR)
    # this run recorded its tokenizer/ (its fingerprint is in config.json): the folder is missing, not never made
    with pytest.raises(MissingFileError, match="tokenizer is missing, where the run keeps.*tiny-arith"):
        ppolab.load_run(copy_of).tokenizer()
    config = json.loads((copy_of / "config.json").read_text())
    del config["fingerprints"][TOKENIZER_DIR]  # a run recorded before runs carried their tokenizer
    (copy_of / "config.json").write_text(json.dumps(config))
    with pytest.raises(MissingFileError, match="no tokenizer/ folder.*tiny-arith"):
        ppolab.load_run(copy_of).tokenizer()


def test_the_model_is_found_only_by_its_fingerprint(copy_of, tmp_path):
    config = json.loads((copy_of / "config.json").read_text())
    moved = tmp_path / "elsewhere" / "tiny-arith"  # recorded on another machine: a path that is not here
    config["config"]["actor_rollout_ref"]["model"]["path"] = str(moved)
    (copy_of / "config.json").write_text(json.dumps(config))
    assert ppolab.load_run(copy_of).model_path() == SHIPPED_MODEL  # data/models/tiny-arith, same fingerprint
    config["fingerprints"]["actor_rollout_ref.model.path"] = "0" * 16  # trained with other weights
    (copy_of / "config.json").write_text(json.dumps(config))
    with pytest.raises(MissingFileError, match="other weights"):
        ppolab.load_run(copy_of).model_path()
