"""The :class:`Run` reader: a run dir opened for reading — its config, metrics, tokenizer and committed steps.

Layout of a run dir::

    .ppolab-run                 the claim: marks a folder ppolab made; locked by the process writing it (claim.py)
    config.json                 resolved config, batch plan, library versions, fingerprints of the model and data
                                files, and ``resumes`` (each resume's step and changed settings)
    metrics.jsonl               one JSON object per training step (verl metric names; metrics_log.py)
    steps/step_000005.safetensors + .json    the real tensors of a recorded step + decoded texts and plans
                                (step.py; with trainer.record_update_state: also the actor's weights and Adam state
                                before it)
    tokenizer/                  the tokenizer files and chat template the run was trained with (Run.tokenizer)
    checkpoints/step_000020/    adapters, value head, optimizer and RNG state (checkpoints.py)
    summary.json                before/after validation accuracy, written at the end

What a reader sees of a run being trained (the commit rule of :mod:`ppolab.run.recorder`): :attr:`Run.steps` lists
only committed steps — a step whose files are on disk but whose metrics row is not is *being written* (or was left by
a writer that died before committing it) and is invisible; :meth:`Run.step` names it as such in one line, never as
damage. A reader never takes a lock and never blocks the writer; a step record maps its tensors file once (one
version, even when the file is later replaced) and pairs it with the ``.json`` that was on disk with it. A file that
does not parse is reported with its path, never skipped.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from ppolab.course import DATA
from ppolab.run.claim import CLAIM_FILE, claim_holder, pid_alive, read_claim
from ppolab.run.files import (REDO, STEP_FILE, TOKENIZER_DIR, file_stamp, json_kind, read_json, regular_file)
from ppolab.run.identity import files_digest, fingerprint, flatten, folder_files, folder_fingerprint
from ppolab.run.metrics_log import check_metrics_log, shared_metrics_frame
from ppolab.run.step import LazyTensors, RecordInfo, StepRecord, check_record


def _warn_if_newer(path: Path, recorded: Any) -> None:
    """One line when the run was recorded by a newer ppolab than this one: it may hold what this reader does not
    know (opened anyway: most of a run reads the same)."""
    import importlib.metadata as md
    import warnings

    from packaging.version import InvalidVersion, Version

    from ppolab.errors import RunWarning

    try:  # the version the recorder writes (ppolab.train._versions): the installed distribution's
        __version__ = md.version("ppolab")
    except md.PackageNotFoundError:  # a checkout on sys.path, not installed: nothing to compare with
        return
    try:
        newer = recorded is not None and Version(str(recorded)) > Version(__version__)
    except InvalidVersion:
        newer = False
    if newer:
        warnings.warn(f"{path} was recorded by ppolab {recorded}, newer than this ppolab {__version__}: what it "
                      "added may be missing or misread here — upgrade ppolab to read it fully", RunWarning,
                      stacklevel=3)

def _extra_file(folder: Path, expected: str) -> str | None:
    """The name of the one file of ``folder`` whose removal gives the recorded fingerprint ``expected`` (a file a
    user put beside a run's tokenizer files), or None. A folder fingerprint covers every file, so this is the one
    change it can name: the other files are then exactly the recorded ones."""
    files = folder_files(folder)
    if len(files) > 64:  # a tokenizer has a handful of files; a folder of many is not worth the digests
        return None
    return next((f.name for f in files if files_digest([g for g in files if g != f]) == expected), None)


#: The groups every recorded config holds (``to_dict`` writes the whole tree): :meth:`Run.ppo_config` of a config.json
#: without them would put the defaults in their place — another run's settings, silently.
CONFIG_GROUPS = ("data", "actor_rollout_ref", "algorithm", "trainer")


def _check_config_shape(config_file: Path, meta: dict[str, Any]) -> None:
    """:class:`ppolab.errors.FileFormatError` naming ``config_file`` when its entries are not of the shapes the
    recorder writes (an edit, or another program's file)."""
    from ppolab.errors import FileFormatError

    config = meta["config"]
    problem = None
    if not isinstance(config, dict):
        problem = f"its 'config' is a JSON {json_kind(config)}, not the object of settings the recorder writes"
    else:
        for key, kind in (("fingerprints", dict), ("resumes", list), ("batch_plan", dict), ("versions", dict)):
            if meta.get(key) is not None and not isinstance(meta[key], kind):
                problem = (f"its {key!r} is a JSON {json_kind(meta[key])}, not the "
                           f"{'object' if kind is dict else 'array'} the recorder writes")
                break
    if problem:
        raise FileFormatError(f"{config_file}: {problem}; put back the run's own config.json, or {REDO}")


def _no_config(folder: Path) -> str:
    """Why ``folder`` has no config.json: a training that claimed it and is loading its models now, one that stopped
    before writing it, or a folder that is no run at all."""
    claim = read_claim(folder / CLAIM_FILE) if (folder / CLAIM_FILE).is_file() else None
    if claim is None:
        return (f"{folder} is not a ppolab run directory (no config.json). Shipped runs live in data/runs/; make one "
                "with python -m ppolab.train trainer.run_dir=<dir>")
    if claim.get("pid") and "released" not in claim and claim.get("host") == socket.gethostname() \
            and pid_alive(int(claim["pid"])):
        return (f"{folder} is being started by {claim_holder(claim)}: its config.json is written once the models "
                "load — open it again in a moment")
    return (f"{folder} holds no run: the training that claimed it ({claim_holder(claim)}) stopped before it wrote "
            "config.json; train into it again (the same command)")


def cache_slot(cache: dict, identity: tuple, *rest: Any) -> tuple:
    """The key of a module-level cache of numbers derived from a run: ``(identity, *rest)`` with ``identity`` a
    :meth:`Run.identity`. The entries of an earlier version of the same run dir (replaced at that path, or a step
    recorded again) are dropped from ``cache`` here, so they are neither served nor kept in memory."""
    path, config, *step = identity
    for old in [k for k in list(cache) if k[0][0] == path and (k[0][1] != config or (step and len(k[0]) > 2
                                                                              and k[0][2] == step[0]
                                                                              and k[0] != identity))]:
        cache.pop(old, None)
    return (identity, *rest)
#: Parsed run configs, keyed by the recorded config itself (its canonical JSON): a reader opens the same run many
#: times (an exercise resolves its run at each check), and composing a PPOConfig costs about 0.2 s. A run replaced
#: with other settings is another key; the same settings give the same value whatever file they came from.
_PPO_CONFIGS: dict[str, Any] = {}
_PPO_CONFIGS_MAX = 64


class Run:
    """A run directory opened for reading: config, metrics, recorded steps."""

    def __init__(self, path: str | os.PathLike):
        from ppolab.errors import FileFormatError, MissingFileError

        self.path = Path(path).expanduser()  # as trainer.run_dir: "~/runs/x" trains and opens the same folder
        config_file = self.path / "config.json"
        if not self.path.exists():
            import difflib

            near = difflib.get_close_matches(self.path.name, list(SHIPPED_RUNS), n=1)
            where = "" if self.path.is_absolute() else f" (a relative path: looked for in {Path.cwd()})"
            raise MissingFileError(f"{self.path} does not exist{where}"
                                   + (f" — did you mean the shipped run {near[0]!r}?" if near else "")
                                   + f"; a run is a shipped run's name ({', '.join(SHIPPED_RUNS)}) or the "
                                   "trainer.run_dir of a run you trained")
        if not self.path.is_dir():
            raise FileFormatError(f"{self.path} is a file, not a run directory: give the folder the run was "
                                  "trained into (its trainer.run_dir)")
        if not config_file.exists():
            raise MissingFileError(_no_config(self.path))
        self._config_stamp = file_stamp(config_file)  # before reading: a file replaced meanwhile reads as changed
        meta = read_json(config_file)
        if isinstance(meta, dict) and "config" not in meta and ("model_type" in meta or "architectures" in meta):
            raise FileFormatError(f"{self.path} is a model directory (a {meta.get('model_type', 'model')}'s "
                                  "config.json), not a run: train on it with actor_rollout_ref.model.path="
                                  f"{self.path} trainer.run_dir=<dir>, then open <dir>")
        if not isinstance(meta, dict) or "config" not in meta:
            raise FileFormatError(f"{config_file} has no 'config' entry: not written by ppolab's recorder; {REDO}")
        _check_config_shape(config_file, meta)
        self.config: dict[str, Any] = meta.pop("config")
        self.info: dict[str, Any] = meta
        _warn_if_newer(self.path, meta.get("versions", {}).get("ppolab") if isinstance(meta.get("versions"), dict)
                       else None)
        self._cache: dict[int, StepRecord] = {}
        self._ppo_config = None
        self._tokenizer = None
        self._metrics: tuple[Any, Any] | None = None
        self._steps: tuple[Any, list[int], list[int]] | None = None
        if (self.path / "metrics.jsonl").exists():
            check_metrics_log(self.path / "metrics.jsonl")  # a torn line is reported when the run is opened

    def _frame(self):
        """metrics.jsonl parsed once per version of the file (its mtime and size), shared: callers copy it."""
        import pandas as pd

        path = self.path / "metrics.jsonl"
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if self._metrics is None or self._metrics[0] != stamp:
            self._metrics = (stamp, shared_metrics_frame(path) if stamp else pd.DataFrame())
        return self._metrics[1]

    @property
    def metrics(self):
        """A pandas DataFrame, one row per training step, indexed by ``step``."""
        return self._frame().copy()  # a caller may change its frame without changing another's

    def _listing(self) -> tuple[list[int], list[int]]:
        """(committed steps, steps being written): the steps with a file in ``steps/``, split by the commit rule
        (the module docstring) — committed once metrics.jsonl holds their row."""
        folder = self.path / "steps"
        if not folder.exists():
            self.there()  # a run dir moved away lists no steps: say so, not "recorded: []"
            return [], []
        frame = self._frame()
        stamp = (folder.stat().st_mtime_ns, self._metrics[0])
        if self._steps is None or self._steps[0] != stamp:  # listed once per change of the folder or the log
            found = set()
            for p in folder.glob("step_*"):
                number = p.stem.split("_")[1]
                if p.suffix in (".safetensors", ".json") and number.isdigit():
                    found.add(int(number))
            logged = set(int(i) for i in frame.index) if len(frame) else set()
            self._steps = (stamp, sorted(found & logged), sorted(found - logged))
        return list(self._steps[1]), list(self._steps[2])

    def there(self) -> None:
        """:class:`ppolab.errors.MissingFileError` when the run dir is gone from its path since it was opened."""
        if not self.path.is_dir():
            from ppolab.errors import MissingFileError

            raise MissingFileError(f"the run dir {self.path} is no longer there (moved or deleted after load_run) — "
                                   "open it where it is now: ppolab.load_run(<its new path>)")

    def _only_gained_tokenizer(self, now: tuple | None) -> bool:
        """Whether config.json, rewritten since this Run opened it, differs only by the tokenizer's fingerprint the
        recorder adds once ``tokenizer/`` is written (``Recorder.save_tokenizer``, right after the run is claimed): a
        run followed from its first second is the same run. Takes the new stamp when so."""
        if now is None:
            return False
        try:
            meta = read_json(self.path / "config.json")
        except Exception:  # noqa: BLE001 — a file being replaced or damaged: not the same run, as far as a cache knows
            return False
        if not isinstance(meta, dict) or meta.get("config") != self.config:
            return False
        old, new = dict(self.info), {k: v for k, v in meta.items() if k != "config"}
        old_prints, new_prints = old.pop("fingerprints", None) or {}, new.pop("fingerprints", None) or {}
        if old != new or TOKENIZER_DIR in old_prints or {k: v for k, v in new_prints.items()
                                                         if k != TOKENIZER_DIR} != old_prints:
            return False
        self.info["fingerprints"], self._config_stamp = new_prints, now
        return True

    def identity(self, step: int | None = None) -> tuple:
        """What a cache of numbers derived from this run (or from its recorded ``step``) is keyed by: the run dir's
        path and the stat stamps (device, inode, size, mtime, ctime) of the files they were read from —
        ``config.json`` as opened, and the step's two files as :meth:`step` read them. A run replaced at the same
        path, or a step recorded again, has another identity, so a cache never serves it the old numbers; a stat
        or two, no file read. The one helper every cache of ``ppolab.numbers`` and ``ppolab.replay`` keys on. A run
        dir moved away, or replaced since this Run opened it, is an error naming it (its numbers would mix two
        runs)."""
        from ppolab.errors import FileFormatError

        self.there()
        try:
            now = file_stamp(self.path / "config.json")
        except FileNotFoundError:
            now = None
        if now != self._config_stamp and not self._only_gained_tokenizer(now):
            raise FileFormatError(f"the run dir {self.path} was replaced (or resumed) since load_run opened it: its "
                                  "config.json is another file now — open it again: "
                                  f"ppolab.load_run({str(self.path)!r})")
        key: tuple = (str(self.path.resolve()), self._config_stamp)
        if step is not None:
            record = self.step(step)
            key += (record.step, record.stamp)
        return key

    @property
    def steps(self) -> list[int]:
        """Committed training steps with recorded tensors (``step_<k>.safetensors`` and/or ``.json`` whose metrics
        row is logged; :meth:`step` names a missing half). Read again on each use: a run being trained gains steps."""
        return self._listing()[0]

    def no_steps(self) -> str:
        """The one line for a run without a committed recorded step: why (no training step logged yet, or
        ``trainer.record_freq`` records none) and what to do."""
        pending = self.being_written()
        writing = f"; step {pending[-1]} is being written" if pending else ""
        freq = (self.config.get("trainer") or {}).get("record_freq", 1)
        frame = self._frame()
        if isinstance(freq, (int, float)) and freq <= 0:
            return (f"{self.path} has no recorded steps: it was trained with trainer.record_freq={freq}; train with "
                    "trainer.record_freq > 0")
        if not any(k > 0 for k in frame.index):
            return (f"{self.path} has no recorded steps: no training step was logged yet (it is still starting, or "
                    "its training stopped before step 1: the same python -m ppolab.train command trains it again)"
                    + writing)
        return f"{self.path} has no recorded steps (trainer.record_freq={freq})" + writing

    def being_written(self) -> list[int]:
        """Steps whose files are on disk but not yet committed (the commit rule): the step a trainer is writing
        now, or one a writer that died left behind (a resume replaces it)."""
        return self._listing()[1]

    def step(self, k: int | None = None) -> StepRecord:
        """The recorded step ``k`` (default: the last committed one); a step being written, or a missing or
        unreadable file, is an error naming it."""
        from ppolab.errors import FileFormatError, MissingFileError, NoSuchStep, whole_argument

        if k is not None:  # "1", 1.0 or 2**70: one line naming the argument, not a KeyError of a string
            k = whole_argument("step", k, None, "a recorded step's number")
        steps, pending = self._listing()
        if not steps:
            raise FileNotFoundError(self.no_steps())
        k = steps[-1] if k is None else k
        if k not in steps:
            if k in pending:
                from ppolab.errors import StepNotCommitted

                raise StepNotCommitted(f"step {k} of {self.path} is being written (its files are on disk, its "
                                       "metrics row is not in metrics.jsonl yet): open it once it lands — "
                                       f"committed steps: {steps}")
            raise NoSuchStep(f"step {k} was not recorded in {self.path}; recorded steps: {steps}")
        if k not in self._cache:
            base = self.path / "steps" / STEP_FILE.format(k)
            tensors_file, info_file = base.with_suffix(".safetensors"), base.with_suffix(".json")
            for f in (tensors_file, info_file):
                if not f.exists():
                    raise MissingFileError(f"{f} is missing, so step {k} is only half recorded; open another step "
                                           f"(recorded: {steps}) or {REDO}")
                regular_file(f)  # a folder, a pipe or a device there: named as such, never read
            for _ in range(3):  # the pair of one version: the .json read while the mapped file was still in place
                try:
                    tensors = LazyTensors(tensors_file)
                except Exception as e:  # a truncated or foreign file
                    raise FileFormatError(f"{tensors_file} is not a complete safetensors file ({e}); open another "
                                          f"step (recorded: {steps}) or {REDO}") from None
                info_stamp = file_stamp(info_file)
                info = read_json(info_file)
                if not isinstance(info, dict):
                    raise FileFormatError(f"{info_file} holds a JSON {json_kind(info)}, not the object of texts "
                                          f"and plan the recorder writes; open another step (recorded: {steps}) or "
                                          f"{REDO}")
                if tensors._stamp() == tensors.version:  # the .json read while this tensors file was in place
                    break
            else:  # replaced three times while being opened: say so rather than pair two versions
                raise FileFormatError(f"step {k} of {self.path} was rewritten while it was being opened (a resumed "
                                      "run recording it again): open it again in a moment")
            check_record(k, tensors, info, tensors_file, info_file, steps)
            try:
                info = RecordInfo(info, info_file)
            except RecursionError:  # wrapped level by level: a file nested as deep as json parses is no record
                raise FileFormatError(f"{info_file} is nested deeper than a step record (an object of texts and "
                                      f"plan a few levels deep); {REDO}") from None
            self._cache[k] = StepRecord(k, tensors, info, (tensors_file, info_file),
                                        (tensors.version, tensors._size, info_stamp), config_of=self.ppo_config)
        return self._cache[k]

    def tokenizer(self) -> Any:
        """The tokenizer the run was trained with, from its ``tokenizer/`` folder — never another model's. A run
        recorded before runs carried their tokenizer is a :class:`ppolab.errors.MissingFileError` saying so."""
        from ppolab.errors import MissingFileError
        from ppolab.models import load_tokenizer_files

        if self._tokenizer is None:
            folder = self.path / TOKENIZER_DIR
            recorded = (self.info.get("fingerprints") or {}).get(TOKENIZER_DIR)
            if not folder.is_dir() and (recorded is not None or folder.is_symlink() or folder.exists()):
                what = ("a file" if folder.is_file() else "a link that leads to no folder (or loops)"
                        if folder.is_symlink() else "missing" if not folder.exists() else "not a folder")
                model = self.config.get("actor_rollout_ref", {}).get("model", {}).get("path", "?")
                raise MissingFileError(f"{folder} is {what}, where the run keeps the tokenizer files it was trained "
                                       f"with (recorded in config.json; its base model was {model}): put back the "
                                       f"run's own {TOKENIZER_DIR}/ folder, or {REDO}")
            if not folder.is_dir():
                model = self.config.get("actor_rollout_ref", {}).get("model", {}).get("path", "?")
                raise MissingFileError(f"{self.path} has no {TOKENIZER_DIR}/ folder (recorded before runs carried the "
                                       f"tokenizer they were trained with; it was {model}): copy that model's "
                                       f"tokenizer files into {folder}, or {REDO}")
            from ppolab.errors import FileFormatError

            expected = (self.info.get("fingerprints") or {}).get(TOKENIZER_DIR)
            found = folder_fingerprint(folder)
            if expected is not None and found != expected:
                extra = _extra_file(folder, expected)
                if extra is not None:  # the recorded files are all there and whole; one more was put beside them
                    raise FileFormatError(f"{folder / extra} is not one of the tokenizer files the run was recorded "
                                          f"with (without it the folder's fingerprint is the recorded {expected}): "
                                          "move it out of the folder")
                raise FileFormatError(f"{folder} is not the tokenizer the run was trained with (fingerprint {found}, "
                                      f"recorded {expected}): its files were replaced or damaged, and its tokens "
                                      f"would decode to other text; put back the run's own tokenizer files, or "
                                      f"{REDO}")
            try:
                self._tokenizer = load_tokenizer_files(folder)
            except MissingFileError as e:  # its message is a model directory's; this is the run's own folder
                why = str(e).split(";")[0].replace(f"the model directory {folder} has no tokenizer files ", "")
                raise MissingFileError(f"{folder} holds no tokenizer file that loads {why}; put back the run's own "
                                       f"tokenizer files, or {REDO}") from None
            except FileFormatError:
                raise
            except Exception as e:  # a damaged file ends in JSONDecodeError, AttributeError, RecursionError, …
                raise FileFormatError(f"{folder}: its tokenizer files do not load ({type(e).__name__}: "
                                      f"{str(e)[:200]}); put back the run's own tokenizer files, or {REDO}") from None
        return self._tokenizer

    def model_path(self, field: str = "actor_rollout_ref.model.path") -> Path:
        """The model directory the run's ``field`` names (default: the base model), on this machine — the one
        fingerprint rule every reader of a run's models follows (replay, exact distributions, a tokenizer's
        fallback): the recorded path when it exists, else the folder of the same name under this checkout's
        ``data/models`` (a run recorded in another clone) — in both cases only when its fingerprint equals the
        recorded one (``config.json``'s ``fingerprints``). Never a different model: otherwise a
        :class:`ppolab.errors.MissingFileError` naming the recorded path, both fingerprints and what to do."""
        from ppolab.errors import MissingFileError

        recorded = str(flatten(self.config).get(field) or "")
        expected = (self.info.get("fingerprints") or {}).get(field)
        candidates = [Path(recorded).expanduser(), DATA / "models" / Path(recorded).name]
        found = {}
        for candidate in candidates if recorded else []:
            if (candidate / "config.json").is_file():
                found[candidate] = fingerprint(candidate)
                if expected is None and candidate == candidates[0] or found[candidate] == expected:
                    return candidate
        if not found:  # moved, renamed or deleted here, or a run trained on another machine
            why = f"not at that path (moved, renamed or deleted) nor in {DATA / 'models'}"
        else:
            where, got = next(iter(found.items()))
            why = (f"at {where} with other weights or tokenizer files (fingerprint {got}, recorded {expected}: "
                   "retrained or replaced in place)")
        raise MissingFileError(f"{self.path} was trained with {field}={recorded or '?'}, which is {why}: copy "
                               "(or move back) the model directory the run was trained with there (or into "
                               "data/models/) to replay or read full distributions")

    @property
    def resumes(self) -> list[dict[str, Any]]:
        """Each resume of the run: ``at_step`` (the checkpoint it continued from) and ``changed`` (``{key: [old,
        new]}`` of the settings that differ from then on); empty for a run trained in one go."""
        return list(self.info.get("resumes", []))

    @property
    def summary(self) -> dict[str, Any]:
        path = self.path / "summary.json"
        return read_json(path) if path.exists() else {}

    def ppo_config(self):
        """The run's config as a :class:`ppolab.config.PPOConfig` — the one way widgets, exercises and replay read
        a run's settings. Parsed once per Run; each call returns its own copy, so a caller cannot change another's."""
        import copy

        from ppolab.config import from_dict

        if self._ppo_config is None:
            from ppolab.config.schema import ConfigError
            from ppolab.errors import FileFormatError

            missing = [g for g in CONFIG_GROUPS if not isinstance(self.config.get(g), dict)]
            if missing:  # read without them, every setting of theirs would be a default: another run's numbers
                raise FileFormatError(f"{self.path / 'config.json'}: its 'config' lacks the group(s) "
                                      f"{', '.join(missing)} (the recorder writes every setting; read without them, "
                                      f"the run's settings would be the defaults); put back the run's own "
                                      f"config.json, or {REDO}")
            key = json.dumps(self.config, sort_keys=True, default=str)
            try:
                self._ppo_config = _PPO_CONFIGS.get(key) or from_dict(self.config)
            except ConfigError as e:  # a value edited into config.json: the loader names the key, not the file
                message = str(e).removeprefix("dict: ")
                raise FileFormatError(f"{self.path / 'config.json'}: its 'config' does not load ({message}); put "
                                      f"back the recorded value, or {REDO}") from None
            if len(_PPO_CONFIGS) >= _PPO_CONFIGS_MAX:
                _PPO_CONFIGS.pop(next(iter(_PPO_CONFIGS)))
            _PPO_CONFIGS[key] = self._ppo_config  # never handed out: each call below returns a copy
        return copy.deepcopy(self._ppo_config)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, steps recorded: {self.steps})"


#: The demo runs shipped in ``data/runs`` (``python -m ppolab.train ... trainer.run_dir=data/runs/<name>``).
SHIPPED_RUNS = {name: DATA / "runs" / name
                for name in ("grpo_tiny", "ppo_gae_tiny", "grpo_tool_tiny", "grpo_tiny_vllm_bf16", "ppo_fire_tiny",
                             "grpo_temp_tiny")}


def resolve_run(run: Run | str | os.PathLike | None = None, default: str = "grpo_tiny") -> Run:
    """A :class:`Run` from a Run, a shipped run's name (``"grpo_tiny"``, ``"ppo_fire_tiny"``, …), a path, or None
    (the shipped ``default``)."""
    if isinstance(run, Run):
        return run
    if run is None:
        run = default
    if isinstance(run, str) and run in SHIPPED_RUNS:
        return Run(SHIPPED_RUNS[run])
    return Run(run)


def load_run(path: str | os.PathLike) -> Run:
    """Open a run directory written by :class:`Recorder`, or a shipped run by its name (``load_run("grpo_tiny")``,
    from any working directory and from a wheel: :data:`SHIPPED_RUNS`) where no folder of that name is here."""
    if isinstance(path, str) and path in SHIPPED_RUNS and not Path(path).exists():
        return Run(SHIPPED_RUNS[path])
    return Run(path)
