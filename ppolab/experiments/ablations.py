"""Predict the curve: short runs that differ from one base run in one knob each (chapter §3–§7, §10, §15).

Each knob of :data:`KNOBS` is one verl override and the metric whose curve it moves most: a narrower clip ε and
``actor/pg_clipfrac``, more ``ppo_epochs`` and ``actor/ppo_kl``, … The base is a run's own config (the shipped
``grpo_tiny`` or the learner's run) cut to :data:`STEPS` steps without validation or recording; every variant keeps
its seed, data order and first rollouts, so step 1 differs only by the knob. A curve is summarised as the mean of
the metric over steps 2 … STEPS (step 1's rollouts were sampled before any update) and a knob's effect as
:func:`effect` — that mean under the knob over that mean of the base: above 1 the knob raises the curve.

The shipped base's variants ship in ``data/ablations/grpo_tiny/`` (``metrics.jsonl`` and ``config.json`` of each,
written by ``tools/train_ablations.py``); another run's are trained on first use — one process, a few seconds each
on the tiny model — into ``~/.cache/ppolab/ablations/<run name>-<config hash>/`` (``PPOLAB_CACHE`` moves it), never
into the run dir.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppolab.course import DATA
from ppolab.numbers.needs import RunLacks
from ppolab.run.reader import Run, load_run, resolve_run
from ppolab.vocab import clip_bounds

#: Steps of every short run (the base's too).
STEPS = 12
SHIPPED = DATA / "ablations" / "grpo_tiny"


@dataclass(frozen=True)
class Knob:
    """One ablation: the verl ``overrides`` that make it, the ``metric`` whose curve the exercise asks about, and a
    ``label`` (the change, as the figure titles it; ``{was}`` is the base run's own value: :func:`knob_label`)."""
    overrides: tuple[str, ...]
    metric: str
    label: str


KNOBS: dict[str, Knob] = {
    # the window is clip_ratio_low/high where set (verl's defaults set both): all three, so it narrows on any run
    "clip_ratio": Knob(("actor_rollout_ref.actor.clip_ratio=0.05", "actor_rollout_ref.actor.clip_ratio_low=0.05",
                        "actor_rollout_ref.actor.clip_ratio_high=0.05"), "actor/pg_clipfrac", "clip ε {was} → 0.05"),
    "ppo_epochs": Knob(("actor_rollout_ref.actor.ppo_epochs=4",), "actor/ppo_kl", "ppo_epochs {was} → 4"),
    "loss_agg_mode": Knob(("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum",), "actor/grad_norm",
                          "loss_agg_mode {was} → seq-mean-token-sum"),
    "bypass_mode": Knob(("algorithm.rollout_correction.bypass_mode=true",), "actor/pg_clipfrac",
                        "decoupled → bypass mode (π_rollout as the anchor)"),
    "kl_loss_coef": Knob(("actor_rollout_ref.actor.kl_loss_coef=0.1",), "actor/kl_loss", "kl_loss_coef {was} → 0.1"),
    "kl_path": Knob(("actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=true",
                     "algorithm.kl_ctrl.kl_coef=0.001"), "critic/score/mean",
                    "KL in the loss → KL in the reward (β 0.001)"),
    "entropy_coeff": Knob(("actor_rollout_ref.actor.entropy_coeff=0.01",), "actor/entropy",
                          "entropy_coeff {was} → 0.01"),
    "temperature": Knob(("actor_rollout_ref.rollout.temperature=0.7",), "actor/entropy",
                        "rollout temperature {was} → 0.7"),
}
#: What every short run changes in the base's config besides its length (STEPS): no validation, nothing recorded.
SHORT = ("trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.record_freq=-1", "trainer.save_freq=-1",
         "trainer.resume=false")


def _cache_dir(r: Run) -> Path:
    if r.path.resolve() == (DATA / "runs" / "grpo_tiny").resolve():
        return SHIPPED
    key = json.dumps([r.config, STEPS, {k: v.overrides for k, v in KNOBS.items()}], sort_keys=True, default=str)
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    base = Path(os.environ.get("PPOLAB_CACHE", Path.home() / ".cache" / "ppolab"))
    return base / "ablations" / f"{r.path.name}-{digest}"


#: Written last into a short run trained into the cache: a folder without it (a run killed midway, or one left by
#: a ppolab that did not write it) is never read as a result — it is trained again.
DONE = "ablation.json"


def _complete(path: Path, shipped: bool) -> bool:
    """Whether ``path`` holds a whole short run: the shipped set's folders as shipped, a cache folder only with
    its :data:`DONE` marker."""
    return (path / "metrics.jsonl").is_file() and (shipped or (path / DONE).is_file())


def _train(r: Run, name: str, overrides: tuple[str, ...], out: Path) -> Path:
    """Train the short run ``name`` into ``out`` atomically: into a temporary sibling folder, renamed into place
    once it finished (with its :data:`DONE` marker) — a run interrupted midway leaves no folder at ``out``, and its
    temporary folder is removed."""
    import shutil
    import tempfile

    from ppolab.run.files import honour_umask, write_json
    from ppolab.train import train

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        honour_umask(tmp, folder=True)
        train(r.ppo_config(), [*overrides, *SHORT, f"trainer.total_training_steps={STEPS}",
                               "trainer.n_gpus_per_node=null", f"trainer.run_dir={tmp}",
                               f"trainer.experiment_name={name}"], progress=False)
        write_json(tmp / DONE, {"knob": name, "overrides": list(overrides), "steps": STEPS})
        if out.exists() and not _complete(out, False):  # what a killed run of an older ppolab left at that name
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished the same run first: its folder is as good as this one
            if not _complete(out, False):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def ablation_runs(run: Run | str | os.PathLike | None = None, knobs: tuple[str, ...] | None = None,
                  train: bool = True) -> dict[str, Run]:
    """``{"base": …, knob: …}``: the short base run and one short run per knob (default every knob the run's config
    can take), read from the shipped set or the cache, trained there when missing (``train=False``: raise
    :class:`RunLacks` instead). A knob the run's config makes meaningless — ``kl_loss_coef`` without the loss-side
    KL, ``entropy_coeff`` where it is already on — is left out."""
    r = resolve_run(run)
    wanted = [k for k in (knobs or KNOBS) if applies(r, k)]
    root = _cache_dir(r)
    out = {}
    for name in ("base", *wanted):
        path = root / name
        if not _complete(path, root == SHIPPED):  # a folder a killed run left is no result: trained again
            if not train or root == SHIPPED:
                raise RunLacks(f"the short ablation run {name!r} (ppolab.experiments.ablations.ablation_runs "
                               "trains it)", r)
            _train(r, name, () if name == "base" else KNOBS[name].overrides, path)
        out[name] = load_run(path)
    return out


def applies(run: Run | str | os.PathLike | None, knob: str) -> bool:
    """Whether ``knob`` changes something in ``run``'s config (a knob that sets what the run already has does not)."""
    a = resolve_run(run).ppo_config().actor_rollout_ref
    if knob == "kl_loss_coef":
        return a.actor.use_kl_loss and a.actor.kl_loss_coef != 0.1
    if knob == "kl_path":
        return a.actor.use_kl_loss
    if knob == "entropy_coeff":
        return a.actor.entropy_coeff == 0
    if knob == "temperature":
        return a.rollout.temperature != 0.7
    if knob == "clip_ratio":
        return clip_bounds(a.actor) != (0.05, 0.05)
    if knob == "ppo_epochs":
        return a.actor.ppo_epochs != 4
    if knob == "loss_agg_mode":
        return a.actor.loss_agg_mode != "seq-mean-token-sum"
    return True


def knob_label(run: Run | str | os.PathLike | None, knob: str) -> str:
    """The knob's change as it applies to ``run`` (the base of the short runs): its label with the base's own value
    — ``ppo_epochs 1 → 4`` on a base that trains one epoch, not the shipped base's ``2 → 4``."""
    a = resolve_run(run).ppo_config().actor_rollout_ref
    low, high = clip_bounds(a.actor)
    was = {"clip_ratio": f"{low}" if low == high else f"({low}, {high})", "ppo_epochs": a.actor.ppo_epochs,
           "loss_agg_mode": a.actor.loss_agg_mode, "kl_loss_coef": a.actor.kl_loss_coef,
           "entropy_coeff": a.actor.entropy_coeff, "temperature": a.rollout.temperature}.get(knob, "")
    return KNOBS[knob].label.format(was=was)


def curve(r: Run, metric: str) -> list[float]:
    """The metric's logged values at steps 1 … STEPS (NaN where not logged)."""
    m = r.metrics
    return [float(m.loc[s, metric]) if metric in m.columns and s in m.index else float("nan")
            for s in range(1, STEPS + 1)]


def effect(runs: dict[str, Run], knob: str) -> float:
    """mean over steps 2 … STEPS of the knob's metric under the knob, over the same mean of the base."""
    metric = KNOBS[knob].metric
    mine, base = curve(runs[knob], metric)[1:], curve(runs["base"], metric)[1:]
    if base and all(v == 0 for v in base):  # (NaN ≠ 0: a metric not logged stays NaN, as before)
        # a factor over 0 is no number: the one line the lab shows instead (the phrase is translated there)
        raise RunLacks("a base curve that is not 0 at every step (the base run's curve is 0 at every step: no "
                       "relative effect to show)", runs["base"])
    return (sum(mine) / len(mine)) / (sum(base) / len(base))


def effects(run: Any = None, knobs: tuple[str, ...] | None = None) -> dict[str, float]:
    """:func:`effect` of every knob of ``knobs`` the run can take."""
    runs = ablation_runs(run, knobs)
    return {k: effect(runs, k) for k in runs if k != "base"}
