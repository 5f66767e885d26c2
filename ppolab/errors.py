"""Errors and warnings about the user's files, data, rewards and run directories.

Every message names its culprit (the file, the config field, the reward function) and what to do, in one or
two sentences. They subclass the builtin a caller would expect (``ValueError``, ``FileNotFoundError``), so
``except ValueError`` keeps working; ``python -m ppolab.train`` prints a :class:`PpolabError` as one line.
"""
from __future__ import annotations

from ppolab.config.schema import ConfigError


class PpolabError(Exception):
    """A mistake in a file, a data set, a reward function or a run directory; the message names it."""


class RunDirError(PpolabError, ConfigError):
    """``trainer.run_dir`` / ``trainer.resume`` cannot be honoured without mixing or losing a run."""


class DataError(PpolabError, ValueError):
    """A data file that is not parquet, is empty, or holds fewer prompts than a step needs."""


class RewardError(PpolabError, ValueError):
    """A reward function that raised or returned something other than a finite number (or a dict with one)."""


class FileFormatError(PpolabError, ValueError):
    """A file that exists but does not parse (truncated safetensors, torn JSON)."""


class MissingFileError(PpolabError, FileNotFoundError):
    """A file a model directory, run or checkpoint needs is not there."""


class StepNotCommitted(PpolabError, KeyError):
    """``Run.step`` of a step that is being written (ppolab.record's commit rule): not damage — it lands in a
    moment."""

    def __str__(self) -> str:  # KeyError would quote its message
        return str(self.args[0]) if self.args else ""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a KeyboardInterrupt from ``on_step``) during ``ppolab.train``: the run dir was left whole up to
    the last step whose metrics were logged (``run``, a :class:`ppolab.record.Run`; None on ranks other than 0),
    then the interrupt goes on, so a loop of trainings stops instead of starting the next one."""

    def __init__(self, message: str, run=None):
        super().__init__(message)
        self.run = run


class RunWarning(UserWarning):
    """Something about a run a learner should see (an incomplete checkpoint skipped on resume, ...)."""


class RewardWarning(UserWarning):
    """Rewards that train nothing: the same score for every response in the first steps."""
