"""Predict the curve: short runs that differ from one base run in one knob each, on three seeds (chapter §3–§7,
§10, §15).

Each knob of :data:`KNOBS` is one verl override and the metric whose curve it moves: a narrower clip ε and
``actor/pg_clipfrac``, more ``ppo_epochs`` and ``actor/ppo_kl``, … The base is a run's own config (the shipped
``grpo_tiny`` or the learner's run) cut to :data:`STEPS` steps without validation or recording, trained on the run's
own seed and the next ones (:func:`seeds`: ``trainer.seed``; the data order stays the run's). Under one seed every
variant keeps the base's first rollouts, so step 1 differs only by the knob; across seeds the sampling differs, so
the spread of the seeds is the noise a knob's change must clear.

A run's curve is summarised as the mean of the metric over steps 2 … STEPS (step 1's rollouts were sampled before
any update). Each seed pairs a run with the knob and a base that shares its first rollouts, so a knob's effect on one
seed is the difference of the two means, and its :func:`verdict` reads the seeds' differences: ``up`` when every
seed's is above 0 and their mean is larger than their spread (largest − smallest), ``down`` likewise below 0,
``flat`` otherwise. The pairing is what makes a small effect visible: seeds differ from each other by more than a
weak knob moves one of them. A ratio of means is no verdict: several of these metrics sit near 0 on the base (a clip
fraction of 2e-3), where a ratio says more about the denominator than about the knob.

Bypass mode (§2.2) makes π_rollout the anchor in place of π_old: a no-op where the two agree (the hf engine at the
trainer's dtype). On such a run its pair is trained on a bf16 rollout (``rollout.dtype=bfloat16``, a real
rollout/trainer gap, labelled): base and knob both sample in bf16, and only the anchor differs.

The shipped base's runs ship in ``data/ablations/grpo_tiny/<name>/seed<k>/`` (``metrics.jsonl`` and ``config.json``
of each, written by ``tools/train_ablations.py``); another run's are trained on first use — one process, 10–30 s
each on the tiny model — into ``~/.cache/ppolab/ablations/<run name>-<config hash>/`` (``PPOLAB_CACHE``
moves it), never into the run dir.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppolab.course import DATA
from ppolab.i18n import tr
from ppolab.numbers.needs import RunLacks
from ppolab.run.reader import Run, load_run, resolve_run
from ppolab.vocab import clip_bounds

#: Steps of every short run (the base's too).
STEPS = 12
#: Seeds of every short run: the base run's own ``trainer.seed`` and the next ones (:func:`seeds`).
N_SEEDS = 3
SHIPPED = DATA / "ablations" / "grpo_tiny"
#: Verdicts of :func:`verdict`.
VERDICTS = ("up", "down", "flat")
#: The outcome curves the lab draws beside each knob's own metric.
OUTCOMES = ("critic/score/mean", "response_length/mean")


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
    "bypass_mode": Knob(("algorithm.rollout_correction.bypass_mode=true",), "actor/ppo_kl",
                        "decoupled → bypass mode (π_rollout as the anchor)"),
    "kl_loss_coef": Knob(("actor_rollout_ref.actor.kl_loss_coef=1.0",), "actor/kl_loss", "kl_loss_coef {was} → 1.0"),
    "kl_path": Knob(("actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=true",
                     "algorithm.kl_ctrl.kl_coef=0.1"), "critic/rewards/mean",
                    "KL in the loss → KL in the reward (β 0.1)"),
    "entropy_coeff": Knob(("actor_rollout_ref.actor.entropy_coeff=0.1",), "actor/entropy",
                          "entropy_coeff {was} → 0.1"),
    "temperature": Knob(("actor_rollout_ref.rollout.temperature=0.7",), "actor/entropy",
                        "rollout temperature {was} → 0.7"),
}
#: What every short run changes in the base's config besides its length (STEPS): no validation, nothing recorded.
SHORT = ("trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.record_freq=-1", "trainer.save_freq=-1",
         "trainer.resume=false")
#: The labelled mismatch bypass mode is trained on where the run's rollout agrees with its trainer.
BF16_ROLLOUT = ("actor_rollout_ref.rollout.dtype=bfloat16",)


def seeds(run: Run | str | os.PathLike | None = None) -> tuple[int, ...]:
    """The seeds of the short runs: the run's own ``trainer.seed`` and the next :data:`N_SEEDS` − 1."""
    first = resolve_run(run).ppo_config().trainer.seed
    return tuple(first + i for i in range(N_SEEDS))


def _rollout_agrees(r: Run) -> bool:
    """Whether the run's rollout computes π_old itself: the hf engine at the trainer's dtype (bypass is a no-op)."""
    a = r.ppo_config().actor_rollout_ref
    return a.rollout.name == "hf" and (a.rollout.dtype or a.model.dtype) == a.model.dtype


def setting(run: Run | str | os.PathLike | None, knob: str) -> tuple[str, ...]:
    """What both sides of ``knob``'s pair get on ``run`` — its base and its run with the knob: the bf16 rollout
    (:data:`BF16_ROLLOUT`) for bypass mode on a run whose rollout agrees with its trainer, else nothing."""
    return BF16_ROLLOUT if knob == "bypass_mode" and _rollout_agrees(resolve_run(run)) else ()


def base_name(run: Run | str | os.PathLike | None, knob: str) -> str:
    """The name of ``knob``'s base among :func:`ablation_runs`: ``base``, or ``<knob>.base`` for a knob with its own
    :func:`setting`."""
    return f"{knob}.base" if setting(run, knob) else "base"


def _cache_dir(r: Run) -> Path:
    if r.path.resolve() == (DATA / "runs" / "grpo_tiny").resolve():
        return SHIPPED
    key = json.dumps([r.config, STEPS, N_SEEDS, BF16_ROLLOUT, {k: v.overrides for k, v in KNOBS.items()}],
                     sort_keys=True, default=str)
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


def plan(run: Run | str | os.PathLike | None = None,
         knobs: tuple[str, ...] | None = None) -> dict[str, tuple[str, ...]]:
    """``{name: overrides}`` of every short run :func:`ablation_runs` reads for ``knobs`` on ``run`` (each trained on
    every seed of :func:`seeds`): ``base``, each knob the run can take, and a knob's own base where it has a
    :func:`setting`."""
    r = resolve_run(run)
    out: dict[str, tuple[str, ...]] = {"base": ()}
    for k in (knobs or KNOBS):
        if applies(r, k):
            if setting(r, k):
                out[base_name(r, k)] = setting(r, k)
            out[k] = (*setting(r, k), *KNOBS[k].overrides)
    return out


def ablation_runs(run: Run | str | os.PathLike | None = None, knobs: tuple[str, ...] | None = None,
                  train: bool = True) -> dict[str, tuple[Run, ...]]:
    """``{name: (run of seed 1, seed 2, …)}`` for every name of :func:`plan` — the base, one entry per knob the
    run's config can take (default every knob) and a knob's own base —, read from the shipped set or the cache,
    trained there when missing (``train=False``: raise :class:`RunLacks` instead). A knob the run's config makes
    meaningless — ``kl_loss_coef`` without the loss-side KL, ``entropy_coeff`` where it is already on — is left out."""
    r = resolve_run(run)
    root = _cache_dir(r)
    out = {}
    for name, overrides in plan(r, knobs).items():
        rs = []
        for seed in seeds(r):
            path = root / name / f"seed{seed}"
            if not _complete(path, root == SHIPPED):  # a folder a killed run left is no result: trained again
                if not train or root == SHIPPED:
                    raise RunLacks(f"the short ablation run {name!r} of seed {seed} "
                                   "(ppolab.experiments.ablations.ablation_runs trains it)", r)
                _train(r, name, (*overrides, f"trainer.seed={seed}"), path)
            rs.append(load_run(path))
        out[name] = tuple(rs)
    return out


def applies(run: Run | str | os.PathLike | None, knob: str) -> bool:
    """Whether ``knob`` changes something in ``run``'s config (a knob that sets what the run already has does not)."""
    a = resolve_run(run).ppo_config().actor_rollout_ref
    if knob == "kl_loss_coef":
        return a.actor.use_kl_loss and a.actor.kl_loss_coef != 1.0
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
    — ``ppo_epochs 1 → 4`` on a base that trains one epoch, not the shipped base's ``2 → 4`` — and, for a knob with
    its own :func:`setting`, what both sides of its pair share."""
    a = resolve_run(run).ppo_config().actor_rollout_ref
    low, high = clip_bounds(a.actor)
    was = {"clip_ratio": f"{low}" if low == high else f"({low}, {high})", "ppo_epochs": a.actor.ppo_epochs,
           "loss_agg_mode": a.actor.loss_agg_mode, "kl_loss_coef": a.actor.kl_loss_coef,
           "entropy_coeff": a.actor.entropy_coeff, "temperature": a.rollout.temperature}.get(knob, "")
    label = tr(KNOBS[knob].label).format(was=was)
    return label + (tr(", both on a bf16 rollout") if setting(run, knob) else "")


def curve(r: Run, metric: str) -> list[float]:
    """The metric's logged values at steps 1 … STEPS (NaN where not logged)."""
    m = r.metrics
    return [float(m.loc[s, metric]) if metric in m.columns and s in m.index else float("nan")
            for s in range(1, STEPS + 1)]


def pair(runs: dict[str, tuple[Run, ...]], knob: str) -> tuple[tuple[Run, ...], tuple[Run, ...]]:
    """(the knob's runs, their bases) seed by seed, from :func:`ablation_runs`: its own base where the knob has one
    (``<knob>.base``), else ``base``."""
    return runs[knob], runs[f"{knob}.base"] if f"{knob}.base" in runs else runs["base"]


def differences(runs: dict[str, tuple[Run, ...]], knob: str, metric: str | None = None) -> list[list[float]]:
    """Each seed's curve of ``metric`` (default the knob's own) under the knob minus its base's, at steps 1 … STEPS."""
    metric = metric or KNOBS[knob].metric
    mine, base = pair(runs, knob)
    return [[a - b for a, b in zip(curve(m, metric), curve(t, metric))] for m, t in zip(mine, base)]


def verdict(runs: dict[str, tuple[Run, ...]], knob: str, metric: str | None = None) -> str:
    """``up``, ``down`` or ``flat``: each seed's mean of ``metric`` (default the knob's own) over steps 2 … STEPS
    under the knob minus its base's — ``up`` when every difference is above 0 and their mean exceeds their spread
    (largest − smallest), ``down`` likewise below 0, ``flat`` otherwise."""
    metric = metric or KNOBS[knob].metric
    d = [sum(x[1:]) / len(x[1:]) for x in differences(runs, knob, metric)]  # step 1 precedes any update
    if any(v != v for v in d):  # NaN: the metric is not logged on one side
        raise RunLacks(f"the metric {metric} logged by both the base and the run with {knob}", pair(runs, knob)[1][0])
    spread, mean = max(d) - min(d), sum(d) / len(d)
    if min(d) > 0 and mean > spread:
        return "up"
    if max(d) < 0 and -mean > spread:
        return "down"
    return "flat"


def verdicts(run: Any = None, knobs: tuple[str, ...] | None = None) -> dict[str, str]:
    """:func:`verdict` of every knob of ``knobs`` the run can take."""
    runs = ablation_runs(run, knobs)
    return {k: verdict(runs, k) for k in runs if k in KNOBS}
