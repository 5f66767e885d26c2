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


class RecordEntryError(FileFormatError, KeyError, IndexError):
    """A recorded step (or other run file) that lacks an entry its reader needs — a key of its JSON, a tensor, an
    item of a list shorter than the record's rows: damage, named with the file. Still a ``KeyError`` /
    ``IndexError``, so ``dict.get`` / ``Mapping.get`` and ``in`` keep their meaning."""

    def __str__(self) -> str:  # KeyError would quote its message
        return str(self.args[0]) if self.args else ""


class ArgumentError(PpolabError, ValueError, TypeError):
    """An argument of the wrong type or out of range (``opt_step=0.5``, ``step="1"``, ``step=2**70``): the message
    names the argument and its valid values. Both a ``ValueError`` and a ``TypeError``, as a caller may expect
    either."""


class NoSuchStep(ArgumentError, KeyError):
    """``Run.step(k)`` of a step the run did not record: the message names it and the recorded steps (still the
    ``KeyError`` it always was)."""

    def __str__(self) -> str:  # KeyError would quote its message
        return str(self.args[0]) if self.args else ""


class MissingFileError(PpolabError, FileNotFoundError):
    """A file a model directory, run or checkpoint needs is not there."""


class StepNotCommitted(PpolabError, KeyError):
    """``Run.step`` of a step that is being written (the commit rule of ppolab.run.recorder): not damage — it lands in a
    moment."""

    def __str__(self) -> str:  # KeyError would quote its message
        return str(self.args[0]) if self.args else ""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a KeyboardInterrupt from ``on_step``) during ``ppolab.train``: the run dir was left whole up to
    the last step whose metrics were logged (``run``, a :class:`ppolab.run.reader.Run`; None on ranks other than 0),
    then the interrupt goes on, so a loop of trainings stops instead of starting the next one."""

    def __init__(self, message: str, run=None):
        super().__init__(message)
        self.run = run


class RunWarning(UserWarning):
    """Something about a run a learner should see (an incomplete checkpoint skipped on resume, ...)."""


class RewardWarning(UserWarning):
    """Rewards that train nothing: the same score for every response in the first steps."""


def flag_argument(name: str, value, what: str):
    """``value`` when it is True, False or None (an optional switch: None keeps the run's own setting); else
    :class:`ArgumentError` in one line — ``remove_padding="no"`` would otherwise count as true."""
    if value is None or isinstance(value, bool):
        return value
    raise ArgumentError(f"{name}={value!r} is not True, False or None: {name} is {what}")


def whole_argument(name: str, value, valid, what: str) -> int:
    """``value`` as an ``int`` when it is a whole number (an int or numpy integer, never a bool, float or string)
    among ``valid`` (a ``range`` or a list of ints; None: any whole number, the caller checks the range); else
    :class:`ArgumentError` naming the argument, ``what`` it counts and the valid values — the one check every
    reader of a step or optimizer step index makes, so ``opt_step=0.5``, ``"0"``, ``-1`` and ``2**70`` each get
    one line instead of a TypeError, a KeyError of a string or an OverflowError deep inside."""
    import operator

    if valid is None:
        shown = ""
    elif isinstance(valid, range):
        shown = "none" if not len(valid) else (f"{valid[0]} … {valid[-1]}" if len(valid) > 1 else f"{valid[0]}")
    else:
        shown = str(list(valid)) if valid else "none"
    shown = f", one of {shown}" if shown else ""
    if isinstance(value, bool):
        index = None
    else:
        try:
            index = operator.index(value)  # ints and numpy integers; a float or a string is not an index
        except TypeError:
            index = None
    if index is None:
        raise ArgumentError(f"{name}={value!r} is not a whole number: {name} is {what}{shown}")
    if valid is not None and index not in valid:
        raise ArgumentError(f"{name}={value!r} is out of range: {name} is {what}{shown}")
    return int(index)
