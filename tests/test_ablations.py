"""Predict the curve (lab 15, ppolab.experiments.ablations): each short run differs from its base in its knob alone,
the shipped set is complete, and a fresh run's ablations are trained into the cache and checked the same way."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppolab import exercises
from ppolab.experiments import ablations

IGNORED = {"trainer.run_dir", "trainer.experiment_name"}


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def config_changes(run, base) -> set[str]:
    """The config keys whose values differ between two runs (config.json's ``config``: the resolved config)."""
    a, b = (flat(json.loads((r.path / "config.json").read_text())["config"]) for r in (run, base))
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} - IGNORED


def test_the_shipped_ablations_differ_from_their_base_in_their_knob_alone():
    runs = ablations.ablation_runs("grpo_tiny", train=False)
    assert set(runs) == {"base", *ablations.KNOBS}
    for knob, spec in ablations.KNOBS.items():
        keys = {o.split("=")[0] for o in spec.overrides}
        changed = config_changes(runs[knob], runs["base"])
        assert changed and changed <= keys, (knob, changed)  # an override may set what the base already has
        assert len(ablations.curve(runs[knob], spec.metric)) == ablations.STEPS
    # step 1's rollouts are the base's: the score of step 1 is the same under every knob that leaves sampling alone
    score = ablations.curve(runs["base"], "critic/score/mean")[0]
    assert all(ablations.curve(runs[k], "critic/score/mean")[0] == score for k in ablations.KNOBS if k != "temperature")


def test_what_the_shipped_curves_teach():
    e = ablations.effects("grpo_tiny")
    assert e["clip_ratio"] > 5 and e["ppo_epochs"] > 2 and e["loss_agg_mode"] > 2
    assert e["bypass_mode"] == 1.0  # the hf engine's π_rollout is π_old: the same anchor
    assert e["temperature"] < 0.8


@pytest.mark.slow
def test_a_fresh_run_gets_its_own_ablations_in_the_cache(trained_run, tmp_path, monkeypatch):
    from helpers import NO_VAL, TINY

    monkeypatch.setenv("PPOLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(ablations, "STEPS", 3)
    run = trained_run("grpo_tiny", [*TINY, *NO_VAL, "trainer.total_training_steps=2"])
    runs = ablations.ablation_runs(run, ("clip_ratio", "temperature"))
    assert set(runs) == {"base", "clip_ratio", "temperature"}
    assert all(str(r.path).startswith(str(tmp_path)) for r in runs.values())
    assert config_changes(runs["clip_ratio"], runs["base"]) == {  # the window is the two bounds (verl's 0.2 each)
        "actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.clip_ratio_low",
        "actor_rollout_ref.actor.clip_ratio_high"}
    assert "clip_ratio (clip ε 0.2 → 0.05: actor/pg_clipfrac)" in exercises.prompt("15.6", run=run)
    with pytest.raises(ablations.RunLacks):
        ablations.ablation_runs(run, ("ppo_epochs",), train=False)


@pytest.mark.slow
def test_the_retraining_script_trains_the_shipped_set_and_ships_no_machine_path(monkeypatch):
    """tools/train_ablations.py, cut to one knob and two steps: it trains into its folder and keeps only files whose
    paths are the checkout's own, relative to it."""
    import importlib.util
    import os
    import shutil

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("train_ablations", root / "tools" / "train_ablations.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = root / ".test-runs" / f"ablations-{os.getpid()}" / "grpo_tiny"
    monkeypatch.setattr(ablations, "SHIPPED", out)
    monkeypatch.setattr(ablations, "STEPS", 2)
    monkeypatch.setattr(ablations, "KNOBS", {"clip_ratio": ablations.KNOBS["clip_ratio"]})
    try:
        assert tool.main() == 0
        assert sorted(p.name for p in out.iterdir()) == ["base", "clip_ratio"]
        for f in out.rglob("*"):
            assert f.name in tool.KEEP or f.is_dir(), f
            if f.suffix == ".json":
                assert str(root) not in f.read_text(), f
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def test_the_shipped_ablations_hold_no_machine_path():
    for f in ablations.SHIPPED.rglob("*.json"):
        text = f.read_text()
        assert '"/' not in text and ":\\\\" not in text, f


def test_a_knobs_label_states_the_base_runs_own_value():
    """Issue 52: lab 15 titled the epochs knob "ppo_epochs 2 → 4" on a base that trains one epoch."""
    from ppolab.exercises import prompt

    assert ablations.knob_label("ppo_gae_tiny", "ppo_epochs") == "ppo_epochs 1 → 4"
    assert ablations.knob_label("grpo_tiny", "ppo_epochs") == "ppo_epochs 2 → 4"
    assert ablations.knob_label("grpo_temp_tiny", "temperature") == "rollout temperature 0.7 → 0.7"
    assert "ppo_epochs 1 → 4" in prompt("15.6", run="ppo_gae_tiny")  # the prompt of the lab's base
