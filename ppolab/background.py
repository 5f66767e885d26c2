"""``train_in_background``: :func:`ppolab.train` in a thread, so a notebook can open the run while it trains.

The cell returns at once with a :class:`BackgroundTraining`; the explorers follow the run's newest committed step
(``ppolab.widgets.follow``) while the trainer writes the next one — readers and writer meet only through the run
directory and its commit rule (:mod:`ppolab.run.recorder`), so what a learner sees while it trains is what they see
after.
"""
from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

#: Trainings still running: asked to stop, and waited for, when the interpreter exits (a thread inside torch at
#: shutdown aborts the process).
_RUNNING: "weakref.WeakSet[BackgroundTraining]" = weakref.WeakSet()


class BackgroundTraining:
    """A training running in a daemon thread (made by :func:`train_in_background`).

    ``run_dir``: where it writes (known before training starts); :meth:`run` opens it once its ``config.json``
    exists; :meth:`stop` ends it after the step in progress (the run dir stays whole, like Ctrl-C); :meth:`join`
    waits for the end and returns the finished :class:`ppolab.run.reader.Run` — or raises what stopped training.
    ``done`` says whether the thread has ended, ``steps`` how many steps have finished, ``error`` what ended it
    (None while it trains or after a clean end) — a reward call past ``custom_reward_function.timeout_s`` included:
    off the main thread it cannot be interrupted, so :mod:`ppolab.rewards` abandons it and the training ends with
    the same :class:`ppolab.errors.RewardError` a foreground ``ppolab.train`` raises.
    """

    def __init__(self, cfg, on_step=None):
        self.config, self.run_dir = cfg, Path(cfg.trainer.run_dir)
        self.steps, self.error, self.result = 0, None, None
        self._on_step, self._stop = on_step, threading.Event()
        self._thread = threading.Thread(target=self._train, name=f"ppolab.train {self.run_dir.name}", daemon=True)

    def _train(self) -> None:
        from ppolab.errors import TrainingInterrupted
        from ppolab.train import train

        def on_step(step, metrics, record):
            self.steps = step
            if self._on_step is not None:
                self._on_step(step, metrics, record)
            if step > 0 and self._stop.is_set():  # the trainer's own clean stop (after a step, not the validation
                # before training): the steps logged so far stay the run
                raise KeyboardInterrupt

        try:
            self.result = train(self.config, on_step=on_step, progress=False)
        except TrainingInterrupted as e:
            self.result = e.run
        except BaseException as e:  # kept for join(), which raises it in the caller's thread
            self.error = e

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def run(self, timeout: float = 300.0):
        """The run being trained, as a :class:`ppolab.run.reader.Run` (read again on each use: it gains steps) — once
        the trainer has written its ``config.json`` (after the models load); waits at most ``timeout`` s."""
        from ppolab.run.reader import Run

        deadline = time.monotonic() + timeout
        while not (self.run_dir / "config.json").exists():
            if self.done:
                self.join()  # raises what stopped it before it wrote anything
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.run_dir} has no config.json after {timeout:.0f} s: the models are still "
                                   "loading; call run() again")
            time.sleep(0.1)
        return Run(self.run_dir)

    def stop(self, timeout: float | None = None):
        """Stop after the step in progress and wait for it (at most ``timeout`` s); returns the run as it stands."""
        self._stop.set()
        self._thread.join(timeout)
        return self.result

    def join(self, timeout: float | None = None):
        """Wait for the training to end; return its :class:`ppolab.run.reader.Run` or raise what stopped it."""
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.result

    def __repr__(self) -> str:
        state = "failed" if self.error is not None else "done" if self.done else "training"
        return f"BackgroundTraining({str(self.run_dir)!r}, {state}, steps={self.steps})"


@atexit.register
def _stop_all() -> None:
    for training in list(_RUNNING):
        training.stop()


def train_in_background(config: Any = None, overrides: Any = None, *, on_step=None) -> BackgroundTraining:
    """Start :func:`ppolab.train` (same ``config``, ``overrides`` and ``on_step``) in a background thread and return
    at once. The config is resolved here, so a bad override raises in the calling cell; without
    ``trainer.run_dir`` the run goes to ``runs/<experiment_name>-<time>`` (named before training starts, so the
    lab can open it). Then ``training.run()`` opens the run, ``ppolab.widgets.follow(explorer, training.run())``
    follows its newest step, ``training.stop()`` ends it cleanly."""
    from ppolab.train import check_train_arguments, resolve_config

    check_train_arguments(config, overrides, on_step, False)
    cfg = resolve_config(config, overrides)
    if not cfg.trainer.run_dir:
        name = f"runs/{cfg.trainer.experiment_name}-{time.strftime('%Y%m%d-%H%M%S')}"
        cfg = resolve_config(cfg, [f"trainer.run_dir={os.path.abspath(name)}"])
    training = BackgroundTraining(cfg, on_step)
    _RUNNING.add(training)
    training._thread.start()
    return training
