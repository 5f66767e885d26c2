"""Files a learner is sent or damages by hand, made to cost ppolab far more than their size or to reach a builtin
error: ``${…}`` interpolations that expand exponentially, 5,000-digit numbers, JSON nested 5,000 deep, a lone
surrogate, a metric that is a dict, ``+``-prefixed overrides. Each ends in one line naming the file (and the key or
line), at once — never a traceback, a minute of CPU or an override dropped unseen."""
from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from pathlib import Path

import pytest
import yaml

from ppolab.config import ConfigError, load_config
from ppolab.errors import FileFormatError

REPO = Path(__file__).resolve().parents[1]
BIG = "9" * 5000
DEEP = "[" * 5000 + "]" * 5000


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# ====================================================================== YAML: interpolation bombs, long numbers
def bomb_rows(where: str, levels: int, ref=lambda key: f"${{{key}}}") -> list[str]:
    """x0 of 10 characters, each x<i> ten references to x<i-1>: 10^levels copies once resolved."""
    return ['x0: "aaaaaaaaaa"'] + [f'x{i}: "' + ref(f"{where}.x{i - 1}") * 10 + '"' for i in range(1, levels + 1)]


@pytest.mark.parametrize("ref", [lambda key: f"${{{key}}}", lambda key: f"${{oc.select:{key},b}}"])
def test_an_interpolation_bomb_in_a_preset_is_one_line_naming_the_file_and_key(tmp_path, ref):
    path = tmp_path / "mine.yaml"
    where = "actor_rollout_ref.actor.global_batch_info"
    rows = "\n".join("      " + r for r in bomb_rows(where, 6, ref))
    path.write_text(f"trainer:\n  project_name: ${{{where}.x6}}\nactor_rollout_ref:\n  actor:\n"
                    f"    global_batch_info:\n{rows}\n")
    start = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_config(path)  # was 53 s at 5 levels, minutes at 6
    assert time.perf_counter() - start < 2
    assert one_line(e).startswith(f"{path}: {where}.x4 expands to more than 10,000") and "bomb" in str(e.value)


def test_an_interpolation_bomb_in_a_verl_job_is_one_line_naming_the_file_and_key(tmp_path, capsys):
    from ppolab.doctor import EXAMPLE_JOB, diagnose, find_config, main

    cfg = yaml.safe_load(find_config(EXAMPLE_JOB).read_text())
    cfg["trainer"]["project_name"] = "${trainer.x6}"
    cfg["trainer"].update(yaml.safe_load("\n".join(bomb_rows("trainer", 6))))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    start = time.perf_counter()
    with pytest.raises(FileFormatError) as e:
        diagnose(path)
    assert main(["verl", str(path)]) == 1
    assert time.perf_counter() - start < 2
    assert one_line(e).startswith(f"{path}: trainer.x4 expands to more than 10,000")
    assert f"{path}: trainer.x4 expands" in capsys.readouterr().err


def test_many_interpolations_in_all_and_a_key_built_by_one_are_named(tmp_path):
    path = tmp_path / "mine.yaml"  # each value cheap, the file's total not
    path.write_text("trainer:\n  x0: a\n" + "".join(f"  y{i}: '{'${trainer.x0}' * 100}'\n" for i in range(200)))
    with pytest.raises(ConfigError, match=rf"^{path}: its \$\{{…\}} references expand more than 10,000 times in "
                                          r"all, passing the bound at trainer\.y100 "):
        load_config(path)
    path.write_text("trainer:\n  k: project_name\n  experiment_name: ${trainer.${trainer.k}}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: trainer.experiment_name=.* builds an interpolation's key"):
        load_config(path)


def test_verls_interpolations_and_a_relative_chain_still_resolve(tmp_path):
    from omegaconf import OmegaConf

    from ppolab.config.yaml_file import load_yaml
    from ppolab.doctor import EXAMPLE_JOB, read_verl_config

    plain, _ = read_verl_config(EXAMPLE_JOB)  # ${oc.select:…} a few levels deep, ${.save_contents}
    assert plain["actor_rollout_ref"]["actor"]["checkpoint"]["load_contents"] == ["model", "optimizer", "extra"]
    path = tmp_path / "mine.yaml"
    path.write_text("trainer:\n  project_name: p\n  experiment_name: ${.project_name}-${oc.select:trainer.nnodes,1}\n")
    assert OmegaConf.to_container(load_yaml(path, ConfigError), resolve=True)["trainer"] == {
        "project_name": "p", "experiment_name": "p-1"}


def test_a_5000_digit_number_in_a_yaml_names_the_file_and_line(tmp_path):
    from ppolab.doctor import read_verl_config

    path = tmp_path / "mine.yaml"
    path.write_text(f"trainer:\n  total_epochs: {BIG}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert one_line(e).startswith(f"{path} line 2 holds a whole number of 5,000 digits")
    with pytest.raises(FileFormatError) as e:
        read_verl_config(path)
    assert one_line(e).startswith(f"{path} line 2 holds a whole number of 5,000 digits")
    path.write_text(f'trainer:\n  total_epochs: !!int "{BIG}"\n')  # a tagged one reaches int() itself
    with pytest.raises(ConfigError, match=rf"^{path} is not valid YAML \(Exceeds the limit"):
        load_config(path)


# ====================================================================== damaged run records
@pytest.fixture
def shipped_copy(tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(REPO / "data" / "runs" / "grpo_tiny", dst)
    return dst


def _append(name: str, text: str):
    def edit(d: Path):
        (d / name).write_text((d / name).read_text() + text)
    return edit


def _replace(name: str, text: str):
    return lambda d: (d / name).write_text(text)


def _config_int(d: Path):
    c = json.loads((d / "config.json").read_text())
    c["config"]["trainer"]["total_training_steps"] = "XX"
    (d / "config.json").write_text(json.dumps(c).replace('"XX"', BIG))


@pytest.mark.parametrize("edit, name, read, message", [
    (_append("metrics.jsonl", '{"step": ' + BIG + "}\n"), "metrics.jsonl, line 102", "metrics", "a number Python"),
    (_append("metrics.jsonl", '{"step": 999, "x": ' + BIG + "}\n"), "metrics.jsonl, line 102", "metrics",
     "a number Python"),
    (_append("metrics.jsonl", '{"step": 999, "\\ud800": 1}\n'), "metrics.jsonl, line 102", "metrics",
     "a lone UTF-16 surrogate"),
    (_config_int, "config.json:", "config", "a number Python"),
    (_replace("config.json", DEEP), "config.json:", "open", "JSON nested deeper than"),
    (_replace("summary.json", DEEP), "summary.json:", "open", "JSON nested deeper than"),
    (_replace("steps/step_000001.json", DEEP), "steps/step_000001.json:", "step", "JSON nested deeper than"),
    (_replace("steps/step_000001.json", BIG), "steps/step_000001.json:", "step", "a number Python"),
], ids=["metrics-step", "metrics-value", "metrics-surrogate", "config-int", "config-deep", "summary-deep",
        "step-deep", "step-int"])
def test_a_damaged_run_record_is_one_line_naming_the_file(shipped_copy, edit, name, read, message):
    from ppolab.run.reader import load_run

    edit(shipped_copy)
    with warnings.catch_warnings(), pytest.raises(FileFormatError) as e:
        warnings.simplefilter("ignore")
        run = load_run(shipped_copy)
        {"metrics": lambda: run.metrics, "config": run.ppo_config, "open": lambda: run.summary,
         "step": lambda: run.step(1)}[read]()
    assert f"{shipped_copy / name} {message}" in one_line(e) or f"{shipped_copy / name}: {message}" in str(e.value)


# ====================================================================== ppolab logs
def test_ppolab_logs_skips_a_metric_that_is_an_object_or_a_list_naming_it(tmp_path, capsys):
    from ppolab.verl_logs import main

    path = tmp_path / "job.jsonl"
    path.write_text('{"step": 1, "data": {"actor/pg_loss": {"a": 1}, "actor/entropy": 1.0}}\n'
                    '{"step": 2, "data": {"actor/pg_loss": [1, 2], "actor/entropy": "abc"}}\n')
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}, line 1: 'actor/pg_loss' is a JSON object, not a number: skipped" in out
    assert f"{path}, line 2: 'actor/pg_loss' is a JSON array, not a number: skipped" in out


@pytest.mark.parametrize("line, message", [('{"step": ' + BIG + ', "data": {}}', "a number Python will not read"),
                                           ('{"step": 1, "data": {"\\ud800": 1}}', "a lone UTF-16 surrogate")],
                         ids=["long-step", "surrogate"])
def test_ppolab_logs_names_a_long_step_or_a_lone_surrogate(tmp_path, capsys, line, message):
    from ppolab.verl_logs import main

    path = tmp_path / "job.jsonl"
    path.write_text(line + "\n")
    assert main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}, line 1: {message}") and err.count("\n") == 1


def test_warning_signs_read_past_a_text_or_object_metric():
    import pandas as pd

    from ppolab.numbers.metrics import warning_signs

    frame = pd.DataFrame({"actor/pg_loss": ["abc", {"a": 1}, 0.1, 0.2], "actor/pg_clipfrac": ["0.5"] * 4},
                         index=pd.Index([1, 2, 3, 4], name="step"))
    assert [s for s in warning_signs(frame) if "pg_clipfrac persistently high" in s]


# ====================================================================== ppolab train: overrides, --preset
@pytest.mark.parametrize("override, message", [
    ("+trainer.total_epochs=3", "trainer.total_epochs is already in verl's config; write trainer.total_epochs=3 to "
                                "change it (Hydra's + only adds a key the job lacks)"),
    ("+++trainer.total_epochs=3", "+++ is not an override prefix (Hydra's are +, ++ and ~); write "
                                  "trainer.total_epochs=3"),
    ("trainer.logger=" + "[" * 3000 + "]" * 3000, "its value cannot be read (nests too deep)"),
    ("trainer.total_epochs=" + BIG, "its value cannot be read (Exceeds the limit (4300 digits)"),
], ids=["plus", "three-plus", "deep-list", "long-int"])
def test_ppolab_train_names_an_override_it_cannot_take(override, message, capsys):
    from ppolab.train import main

    assert main([override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: override {override[:80]!r}: {message}") and err.count("\n") == 1, err


def test_a_plus_on_a_key_verl_lacks_still_adds_it():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ppolab.train import resolve_config

        cfg = resolve_config("ppo_gae_tiny", ["+critic.ppo_infer_max_token_len_per_gpu=4096",
                                              "++trainer.total_epochs=2"])
    assert (cfg.critic.ppo_infer_max_token_len_per_gpu, cfg.trainer.total_epochs) == (4096, 2)


def test_a_preset_that_is_a_fifo_or_a_link_to_dev_zero_is_not_a_regular_file(tmp_path, capsys):
    from ppolab.train import main

    fifo, zero = tmp_path / "fifo.yaml", tmp_path / "zero.yaml"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        assert main(["--preset", str(path)]) == 2
        assert capsys.readouterr().err == f"config error: {path} is not a regular file (a folder, device, pipe or " \
                                          "socket)\n"
    assert main(["--preset", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
