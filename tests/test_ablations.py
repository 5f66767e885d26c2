"""Predict the curve (lab 15, ppolab.experiments.ablations): each short run differs from its base in its knob alone,
the shipped set is complete, and a fresh run's ablations are trained into the cache and checked the same way."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppolab import exercises
from ppolab.experiments import ablations
from ppolab.exercises.lab15 import POLICY_KNOBS, REGULARISER_KNOBS

IGNORED = {"trainer.run_dir", "trainer.experiment_name"}
#: The verdicts on the shipped base (lab 15's text quotes them): the mechanisms' directions, and bypass mode flat —
#: the bf16 rollout's gap to the fp32 trainer (~1e-3 in probability) moves nothing beyond the seeds' noise.
EXPECTED = {"clip_ratio": "up", "ppo_epochs": "up", "loss_agg_mode": "up", "bypass_mode": "flat",
            "kl_loss_coef": "down", "kl_path": "down", "entropy_coeff": "up", "temperature": "down"}


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
    assert set(runs) == {"base", *ablations.KNOBS, "bypass_mode.base"}  # the hf engine: bypass on a bf16 rollout
    assert all(len(rs) == ablations.N_SEEDS for rs in runs.values())
    seeds = ablations.seeds("grpo_tiny")
    for name, rs in runs.items():
        assert [r.ppo_config().trainer.seed for r in rs] == list(seeds)
    for knob, spec in ablations.KNOBS.items():
        keys = {o.split("=")[0] for o in spec.overrides}
        base = runs[ablations.base_name("grpo_tiny", knob)]
        for mine, theirs in zip(runs[knob], base):
            changed = config_changes(mine, theirs)
            assert changed and changed <= keys, (knob, changed)  # an override may set what the base already has
            assert len(ablations.curve(mine, spec.metric)) == ablations.STEPS
        # a knob's own base differs from the base in its setting alone (and that setting is labelled)
    assert config_changes(runs["bypass_mode.base"][0], runs["base"][0]) == {"actor_rollout_ref.rollout.dtype"}
    assert ablations.knob_label("grpo_tiny", "bypass_mode").endswith(", both on a bf16 rollout")
    # under one seed, step 1's rollouts are the base's: its score is the same under every knob that leaves sampling
    # alone; across seeds the sampling differs
    for i in range(ablations.N_SEEDS):
        score = ablations.curve(runs["base"][i], "critic/score/mean")[0]
        assert all(ablations.curve(runs[k][i], "critic/score/mean")[0] == score
                   for k in ablations.KNOBS if k not in ("temperature", "bypass_mode"))
    assert len({ablations.curve(r, "critic/score/mean")[1] for r in runs["base"]}) == ablations.N_SEEDS


def test_what_the_shipped_curves_teach():
    """Every knob moves its metric clearly on the shipped base — every seed's run beyond every seed's base — so the
    null prediction ("flat" everywhere) fails 15.6 and 15.7, and the verdicts are the mechanisms' directions."""
    assert ablations.verdicts("grpo_tiny") == EXPECTED


def test_a_verdict_reads_every_seed_not_the_average(tmp_path):
    """One seed far off cannot make a verdict: where the ranges of the seeds' means overlap it is "flat", though
    the averages differ; a metric one side does not log is the one line of RunLacks, not a NaN comparison."""
    runs = ablations.ablation_runs("grpo_tiny", train=False)
    base, knob = runs["base"], runs["clip_ratio"]
    mixed = {"base": base, "clip_ratio": (knob[0], base[1], base[2])}  # one seed with the knob, two without
    assert ablations.verdict(mixed, "clip_ratio") == "flat"
    assert ablations.verdict({"base": knob, "clip_ratio": base}, "clip_ratio") == "down"
    with pytest.raises(ablations.RunLacks, match="actor/kl_loss"):
        ablations.verdict(runs, "kl_path", metric="actor/kl_loss")  # the knob moves KL out of the loss


def test_a_wrong_prediction_names_the_knobs_that_are_off():
    truth = ablations.verdicts("grpo_tiny", POLICY_KNOBS)
    k = next(iter(truth))
    wrong = {**truth, k: {"up": "down", "down": "up", "flat": "up"}[truth[k]]}
    verdict = exercises.check("15.6", wrong)
    assert not verdict and f"off: {k}; the others are right." in verdict.message
    assert exercises.check("15.6", truth)
    null = exercises.check("15.7", {k: "flat" for k in ablations.verdicts("grpo_tiny", REGULARISER_KNOBS)})
    assert not null and f"off: every one ({', '.join(REGULARISER_KNOBS)})." in null.message


@pytest.mark.slow
def test_a_fresh_run_gets_its_own_ablations_in_the_cache(trained_run, tmp_path, monkeypatch):
    from helpers import NO_VAL, TINY

    monkeypatch.setenv("PPOLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(ablations, "STEPS", 3)
    monkeypatch.setattr(ablations, "N_SEEDS", 2)
    run = trained_run("grpo_tiny", [*TINY, *NO_VAL, "trainer.total_training_steps=2"])
    runs = ablations.ablation_runs(run, ("clip_ratio", "temperature"))
    assert set(runs) == {"base", "clip_ratio", "temperature"} and all(len(rs) == 2 for rs in runs.values())
    assert all(str(r.path).startswith(str(tmp_path)) for rs in runs.values() for r in rs)
    assert config_changes(runs["clip_ratio"][1], runs["base"][1]) == {  # the window is the two bounds (0.2 each)
        "actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.clip_ratio_low",
        "actor_rollout_ref.actor.clip_ratio_high"}
    assert ablations.verdict(runs, "clip_ratio") in ablations.VERDICTS
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
    monkeypatch.setattr(ablations, "N_SEEDS", 2)
    monkeypatch.setattr(ablations, "KNOBS", {"clip_ratio": ablations.KNOBS["clip_ratio"]})
    try:
        assert tool.main() == 0
        assert sorted(p.name for p in out.iterdir()) == ["base", "clip_ratio"]
        assert sorted(p.name for p in (out / "base").iterdir()) == ["seed1", "seed2"]
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
