"""``ppolab doctor verl`` on a job someone sent: nothing its config names is run (a ``_target_`` Hydra would call, a
resolver), every YAML reader is bounded (an alias bomb, 10,000 levels of nesting) and an override is never dropped
unseen — each named in one line. Without verl installed; tests/parity/test_doctor_verl_checks.py has the cases under
verl's own ``validate_config``."""
from __future__ import annotations

import time

import pytest
import yaml

from ppolab.config import ConfigError, load_config
from ppolab.doctor import EXAMPLE_JOB, diagnose, disarm, find_config, main, read_verl_config
from ppolab.errors import FileFormatError

#: Callables Hydra's blocklist lets through that write a file, with the arguments that aim them at ``victim``.
WRITERS = {
    "builtins.open": lambda v: {"file": str(v), "mode": "w"},
    "pathlib.Path.write_text": lambda v: {"_args_": [str(v), ""]},
    "shutil.copyfile": lambda v: {"src": "/dev/null", "dst": str(v)},
    "logging.FileHandler": lambda v: {"filename": str(v), "mode": "w"},
    "zipfile.ZipFile": lambda v: {"file": str(v), "mode": "w"},
    "verl.utils.fs.copy": lambda v: {"src": "/dev/null", "dst": str(v)},  # under verl., not a config class
}


def job(tmp_path, edit=lambda cfg: None, name="config.yaml"):
    """The shipped example job's config, edited, written to ``tmp_path/job/name``."""
    cfg = yaml.safe_load(find_config(EXAMPLE_JOB).read_text())
    edit(cfg)
    path = tmp_path / "job" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def snapshot(tmp_path):
    return {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("target", sorted(WRITERS))
def test_a_target_that_writes_a_file_is_not_run_and_named(tmp_path, capsys, target):
    victim = tmp_path / "notes.txt"
    victim.write_text("the user's work")

    def aim(cfg):
        cfg["actor_rollout_ref"]["actor"]["optim"] = {"_target_": target, **WRITERS[target](victim)}
    path = job(tmp_path, aim)
    before = snapshot(tmp_path)
    lines = diagnose(path)
    assert main(["verl", str(path)]) == 0
    assert snapshot(tmp_path) == before  # the victim's bytes, and no new file
    key = f"actor_rollout_ref.actor.optim._target_ = {target!r}"
    named = [ln for ln in lines if key in ln]
    assert len(named) == 1 and "not one of verl's config classes" in named[0], lines
    assert any("validate_config is not run on this config" in ln for ln in lines)
    # "ppolab's copy of its checks follows" — and it does, even when it finds nothing to stop
    assert "  ppolab's copy of verl's checks: none would stop this job" in lines, lines
    assert any(ln.startswith("the step in the chapter's arithmetic") for ln in lines)  # ppolab's part still comes
    assert key in capsys.readouterr().out


def test_a_target_that_is_not_a_string_or_hydras_args_are_refused(tmp_path):
    def edit(cfg):
        cfg["critic"]["optim"]["_target_"] = {"_target_": "builtins.open"}
        cfg["algorithm"]["_partial_"] = True
        cfg["trainer"]["extra"] = [{"_target_": "shutil.rmtree", "path": str(tmp_path)}]
    refused, _, _ = disarm(read_verl_config(job(tmp_path, edit))[0])
    assert [r.split(" = ")[0] for r in refused] == ["algorithm._partial_", "critic.optim._target_",
                                                    "critic.optim._target_._target_", "trainer.extra[0]._target_"]


def test_fields_that_make_verl_run_code_are_disarmed_or_refused(tmp_path):
    def edit(cfg):
        cfg["critic"]["model"]["external_lib"] = "evil_module"
        cfg["critic"]["model"]["trust_remote_code"] = True
        cfg["critic"]["model"]["path"] = "hdfs://x; touch /tmp/pwned"
    refused, changed, safe = disarm(read_verl_config(job(tmp_path, edit))[0])
    assert refused == ["critic.model.path = 'hdfs://x; touch /tmp/pwned': verl's checks would copy it with a shell "
                       "command (hdfs dfs)"]
    assert [c.split(" = ")[0] for c in changed] == ["critic.model.external_lib", "critic.model.trust_remote_code"]
    assert safe["critic"]["model"]["external_lib"] is None and safe["critic"]["model"]["trust_remote_code"] is False


def test_the_shipped_job_names_no_code(tmp_path):
    assert disarm(read_verl_config(EXAMPLE_JOB)[0])[0] == []


@pytest.mark.parametrize("resolver", ["oc.create", "oc.env", "oc.decode"])
def test_a_resolver_verls_configs_do_not_call_is_refused_in_one_line(tmp_path, resolver):
    def edit(cfg):
        cfg["trainer"]["project_name"] = f"${{{resolver}:HOME}}"
    with pytest.raises(FileFormatError) as e:
        read_verl_config(job(tmp_path, edit))
    assert f"trainer.project_name calls the resolver ${{{resolver}:…}}" in str(e.value)
    assert "\n" not in str(e.value)


def test_an_escaped_interpolation_is_not_handed_on(tmp_path):
    def edit(cfg):
        cfg["trainer"]["project_name"] = "\\${oc.select:trainer.nnodes,1}"  # comes out as one verl resolves again
    with pytest.raises(FileFormatError, match=r"project_name=.\$\{oc.select:trainer.nnodes,1\}. still holds an"):
        read_verl_config(job(tmp_path, edit))


def bomb(tmp_path, name="bomb.yaml"):
    """A ~30 kB billion laughs: 12 levels of ten aliases each, 10^12 nodes once expanded."""
    rows = ["a0: &a0 [" + ", ".join(["lol"] * 10) + "]"]
    rows += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    text = "\n".join(rows) + "\n"
    path = tmp_path / name
    path.write_text(text + "# padding\n" * ((30_000 - len(text)) // 10))
    assert 29_000 < path.stat().st_size < 31_000
    return path


def deep(tmp_path, name="deep.yaml"):
    path = tmp_path / name
    path.write_text("a: " + "[" * 10_000 + "]" * 10_000 + "\n")
    return path


@pytest.mark.parametrize("make", [bomb, deep])
def test_an_alias_bomb_or_deep_nesting_is_one_line_naming_the_file_at_once(tmp_path, capsys, make):
    path = make(tmp_path)
    start = time.perf_counter()
    with pytest.raises(FileFormatError) as e:
        diagnose(path)
    assert main(["verl", str(path)]) == 1
    with pytest.raises(ConfigError) as e2:
        load_config(path)
    assert time.perf_counter() - start < 1.0
    for msg in (str(e.value), str(e2.value), capsys.readouterr().err.strip()):
        assert str(path) in msg and "\n" not in msg, msg
        assert ("alias bomb" in msg) if make is bomb else ("nest" in msg), msg


def test_a_preset_with_a_few_aliases_still_loads(tmp_path):
    from ppolab.config.loader import PRESET_DIR

    path = tmp_path / "mine.yaml"
    text = (PRESET_DIR / "grpo_tiny.yaml").read_text().replace("kl_loss_coef: 0.001", "kl_loss_coef: &beta 0.001")
    path.write_text(text.replace("adv_estimator: grpo", "adv_estimator: grpo\n  kl_ctrl:\n    kl_coef: *beta"))
    cfg = load_config(path)
    assert cfg.algorithm.kl_ctrl.kl_coef == cfg.actor_rollout_ref.actor.kl_loss_coef == 0.001


def test_a_preset_calling_oc_create_is_refused(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("trainer:\n  project_name: ${oc.create:'[1, 2]'}\n")
    with pytest.raises(ConfigError, match=r"mine.yaml: trainer.project_name calls the resolver \$\{oc.create:…\}"):
        load_config(path)


@pytest.mark.parametrize("override,said", [
    ("actor_rollout_ref.actor.ppo_epoch=2", "actor_rollout_ref.actor.ppo_epoch is not a key of .* nor one ppolab "
                                            "knows; did you mean actor_rollout_ref.actor.ppo_epochs\\?"),
    ("actor_rollout_ref.rollout.n", "'actor_rollout_ref.rollout.n' is not of the form key=value"),
    ("+actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.n is already in .*; write "
                                       "actor_rollout_ref.rollout.n=8 to change it"),
    ("+actor_rollout_ref.actor.ppo_epoch=2", "did you mean actor_rollout_ref.actor.ppo_epochs\\?"),
    ("~trainer.no_such_key", "trainer.no_such_key is not a key of"),
    ("+trainer.total_epoch=5", "did you mean trainer.total_epochs\\? \\(to add trainer.total_epoch all the same, "
                               "write \\+\\+trainer.total_epoch=5\\)"),  # trainer: a group without _target_
    ("actor_rollout_ref.rollout=8", "actor_rollout_ref.rollout is a group of keys in .*, and a group cannot be set "
                                    "to a value; set a key inside it \\(e.g. actor_rollout_ref.rollout.name=…\\)"),
    ("~actor_rollout_ref", "actor_rollout_ref is a group of 6 keys verl requires, so it cannot be deleted"),
    ("~actor_rollout_ref.rollout.multi_turn", "multi_turn is a group of 13 keys verl requires"),
    ("~model_engine", "model_engine is a top-level key verl requires, so it cannot be deleted; set it"),
])
def test_an_override_is_never_dropped_unseen(tmp_path, capsys, override, said):
    with pytest.raises(ConfigError, match=said) as e:
        diagnose(EXAMPLE_JOB, [override])
    assert "\n" not in str(e.value)
    assert main(["verl", str(EXAMPLE_JOB), override]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and override.lstrip("+~") in err


def test_hydras_add_force_and_delete_overrides_work_as_hydra_does(tmp_path):
    raw, _ = read_verl_config(EXAMPLE_JOB, ["actor_rollout_ref.rollout.n=8", "++actor_rollout_ref.actor.ppo_epochs=3",
                                            "+actor_rollout_ref.model.override_config.attention_dropout=0.1",
                                            "~trainer.val_before_train", "++trainer.total_epoch=5"])
    assert raw["actor_rollout_ref"]["rollout"]["n"] == 8 and raw["actor_rollout_ref"]["actor"]["ppo_epochs"] == 3
    assert raw["actor_rollout_ref"]["model"]["override_config"]["attention_dropout"] == 0.1
    assert "val_before_train" not in raw["trainer"]
    assert raw["trainer"]["total_epoch"] == 5  # ++: added though a letter off total_epochs, as the user insisted


def test_a_what_if_on_a_recorded_config_parses_overrides_as_ppolab_train_does():
    """numbers.critic_engine.config_with (lab 09's what-if) reads its overrides with the one parser: a mistyped key
    is named with its nearest, no '=' is one line — neither is set silently into a key the trainer never reads."""
    from ppolab.config import ConfigError
    from ppolab.numbers.critic_engine import config_with

    cfg = config_with("ppo_gae_tiny", ["critic.ppo_micro_batch_size_per_gpu=2", "+critic.cliprange_value=0.3"])
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 2 and cfg.critic.cliprange_value == 0.3
    with pytest.raises(ConfigError, match="did you mean critic.ppo_micro_batch_size_per_gpu"):
        config_with("ppo_gae_tiny", ["critic.ppo_micro_batch_size_per_gpus=2"])
    with pytest.raises(ConfigError, match="not of the form key=value"):
        config_with("ppo_gae_tiny", ["critic.ppo_micro_batch_size_per_gpu"])
