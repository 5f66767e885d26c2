"""A recorded step: its tensors read lazily, its JSON checked, and its update plan — every optimizer step's facts.

``steps/step_<k>.safetensors`` holds the real tensors of training step k after the nine stages (the batch) and the
update's histories (:data:`HISTORIES`); ``step_<k>.json`` its decoded texts, metadata and the plan each worker
executed. :class:`StepRecord` pairs the two; :meth:`StepRecord.plan` and :meth:`StepRecord.opt_step` are the one
way a reader learns what an optimizer step trained on (rows, micro-batches, the global counts its loss was divided
by) — no reader rebuilds them.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ppolab.run.checkpoints import UPDATE_STATE, optimizer_state, tensors_digest
from ppolab.run.files import REDO, json_kind

#: Recorded tensors that are histories of the update (optimizer step, N, R), not part of the step's batch: π_θ's
#: log-probs and entropy and the critic's vpreds at every optimizer step (``ppolab.worker.UpdateHistory``).
HISTORIES = ("actor_log_probs", "actor_entropy", "critic_vpreds")

#: safetensors' dtype names → torch dtypes (the ones the recorder writes, and the rest of the format's common ones).
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


class LazyTensors(Mapping):
    """The tensors of one ``steps/step_<k>.safetensors``, each read on first use. Opening reads only the header
    (and checks the file is complete); the first tensor read maps the file privately (``UntypedStorage.from_file``:
    no file descriptor kept, memory only for the pages read) and every later read comes from that mapping — one
    version of the file, even when the writer replaces it afterwards (a rename leaves the mapped file as it was).
    A file replaced between opening and the first read is an error, never a mix of two versions.
    A read-only mapping: name → tensor, each loaded once."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            self.version, self._size = (st.st_dev, st.st_ino, st.st_mtime_ns), st.st_size
            if self._size < 8:
                raise ValueError(f"{self._size} bytes, shorter than a safetensors header")
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= self._size - 8:
                raise ValueError(f"a header of {n} bytes in a file of {self._size}")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError(f"a header that is a JSON {json_kind(header)}, not an object")
        metadata = header.pop("__metadata__", None)
        #: the header's metadata (the recorder writes the step number there): str → str, {} when none
        self.metadata = metadata if isinstance(metadata, dict) else {}
        self._start = 8 + n
        self._entries: dict[str, tuple[torch.dtype, list[int], int, int]] = {}
        for name, e in header.items():
            try:
                dtype_name, shape, (begin, end) = e["dtype"], list(e["shape"]), e["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise ValueError(f"tensor {name!r} has no dtype, shape and data_offsets") from None
            if dtype_name not in _SAFETENSORS_DTYPES:
                raise ValueError(f"dtype {dtype_name} of {name!r}")
            whole = lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 0  # noqa: E731
            if not (all(map(whole, shape)) and whole(begin) and whole(end) and begin <= end):
                raise ValueError(f"tensor {name!r} has shape {shape} and bytes {begin}–{end}")
            if self._start + end > self._size:
                raise ValueError(f"tensor {name!r} (bytes {begin}–{end}) is past the end of the file's "
                                 f"{self._size} bytes")
            dtype = _SAFETENSORS_DTYPES[dtype_name]
            if math.prod(shape) * dtype.itemsize != end - begin:
                raise ValueError(f"tensor {name!r} of shape {shape} ({dtype_name}) needs "
                                 f"{math.prod(shape) * dtype.itemsize} bytes, its header gives it {end - begin}")
            self._entries[name] = (dtype, shape, begin, end)
        self._names = list(self._entries)
        self._bytes: torch.Tensor | None = None
        self._loaded: dict[str, torch.Tensor] = {}

    def _stamp(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return st.st_dev, st.st_ino, st.st_mtime_ns

    def _mapped(self) -> torch.Tensor:
        """The file's bytes, mapped once — the version whose header was read (checked before and after mapping)."""
        if self._bytes is None:
            from ppolab.errors import FileFormatError

            if self._stamp() == self.version:
                storage = torch.UntypedStorage.from_file(str(self.path), shared=False, nbytes=self._size)
                if self._stamp() == self.version:
                    self._bytes = torch.empty(0, dtype=torch.uint8).set_(storage)
            if self._bytes is None:
                raise FileFormatError(f"{self.path} was replaced since its step was opened (a resumed run recorded "
                                      "the step again): open the run again (ppolab.load_run) to read the new one")
        return self._bytes

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._loaded:
            if name not in self._entries:
                from ppolab.errors import RecordEntryError

                raise RecordEntryError(f"{self.path} holds no tensor {name!r} (it holds {', '.join(self._names)}): "
                                       f"the step was recorded without it, or the file was replaced; {REDO}")
            dtype, shape, begin, end = self._entries[name]
            if end == begin:
                t = torch.empty(shape, dtype=dtype)
            else:  # a copy: the tensor must not keep the mapping (nor share it with the next reader)
                t = self._mapped()[self._start + begin:self._start + end].clone().view(dtype).reshape(shape)
            self._loaded[name] = t
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def real_rows_of(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Boolean (N,) of a recorded batch's real trajectories: not ``is_pad`` (every row where nothing was padded)."""
    t = tensors
    return ~t["is_pad"].bool() if "is_pad" in t else torch.ones(t["responses"].shape[0], dtype=torch.bool)


@dataclass(frozen=True)
class OptimizerStepRecord:
    """Optimizer step ``index`` of ``role``'s update at a recorded step (:meth:`StepRecord.opt_step`): ``step`` is
    the plan's :class:`ppolab.update_plan.OptimizerStep` — ``epoch``, ``mini_batch``, every rank's share in loader
    order (``rows()``), ``micro_batches[rank]``, and the global counts (``info()``) its micro-batch losses were
    divided by."""

    record: StepRecord
    role: str
    index: int
    step: Any

    @property
    def label(self) -> str:
        """"opt step k (epoch e, mini-batch m)", in the learner's language."""
        from ppolab.i18n import tr

        return tr("opt step {k} (epoch {e}, mini-batch {m})").format(k=self.index, e=self.step.epoch,
                                                                     m=self.step.mini_batch)

    def rows(self) -> list[int]:
        """The recorded rows this optimizer step trained on (every rank's, padding rows included), in row order."""
        return sorted(self.step.rows())

    def seq_lens(self, rank: int = 0) -> list[int]:
        """Token counts of ``rank``'s share of this optimizer step, in the order its data loader gave the rows — what
        its micro-batches were cut from: prompt + attended response tokens per row, as dynamic batching counts them
        (:meth:`ppolab.batch.Batch.seq_lens`; chapter §11.5)."""
        from ppolab.batch import Batch

        lens = Batch(dict(self.record.tensors)).seq_lens()
        return [lens[i] for i in self.step.rows(rank)]

    def batch(self) -> dict[str, torch.Tensor]:
        """Its rows' tensors (n_rows, R), ready for the ``ppolab.algos`` losses: ``rows`` (indices),
        ``response_mask`` of the real rows (0 on padding rows), and — the actor: ``old_log_probs``, ``advantages``,
        ``entropy``, ``ref_log_prob`` where recorded, and ``log_prob`` (= ``actor_log_probs[k]``, the old log-prob
        at masked positions so no NaN leaks into a seq-mean mode); the critic: ``values``, ``returns`` and
        ``vpreds`` (= ``critic_vpreds[k]``, V_old at masked positions)."""
        t = self.record.tensors
        rows = torch.tensor(self.rows(), dtype=torch.long)
        mask = (t["response_mask"].float() * self.record.real_rows().float().unsqueeze(-1))[rows]
        out: dict[str, torch.Tensor] = {"rows": rows}
        for key in (("old_log_probs", "advantages", "entropy", "ref_log_prob") if self.role == "actor"
                    else ("values", "returns")):
            if key in t:
                out[key] = t[key][rows].float()
        out["response_mask"] = mask
        if self.role == "actor":
            lp = torch.nan_to_num(t["actor_log_probs"][self.index][rows], nan=0.0)
            out["log_prob"] = torch.where(mask > 0, lp, out["old_log_probs"])
        else:
            # past a micro-batch's own width the recording holds NaN (mask 0): V_old there, as lab 09 and the
            # value-clip explorer put it, so no masked NaN can leak into the loss
            vp = torch.nan_to_num(t["critic_vpreds"][self.index][rows], nan=0.0)
            out["vpreds"] = torch.where(mask > 0, vp, out["values"])
        return out


@dataclass
class StepRecord:
    """One recorded training step: ``tensors`` (name → tensor) and ``info`` (texts, batch plan, …)."""

    step: int
    tensors: Mapping[str, torch.Tensor]
    info: dict[str, Any] = field(default_factory=dict)
    #: (tensors file, JSON file) it was read from — what an error about the record names; None: built in memory
    files: tuple[Path, Path] | None = None
    #: stat stamps of the two files as read (:meth:`Run.identity`): a cache of numbers derived from the step keys
    #: on them, so a step recorded again (or a run replaced) is never served the old numbers
    stamp: tuple = ()
    #: the run's parsed config (a zero-argument callable: :meth:`Run.ppo_config`): what a plan the step did not
    #: record is planned from; None for a record built in memory with its plans
    config_of: Any = field(default=None, repr=False, compare=False)
    _plans: dict = field(default_factory=dict, repr=False, compare=False)

    def plan(self, role: str = "actor") -> Any:
        """The update plan ``role``'s worker ("actor" or "critic") executed at this step — every optimizer step's
        rows, each rank's micro-batches and the global counts its loss was normalised by
        (:class:`ppolab.update_plan.UpdatePlan`). Read from the record; for a run recorded before plans were kept,
        planned once from this step's own recorded batch and the run's config, which ``plan.recorded`` and
        ``plan.note()`` say. The one way a reader gets an optimizer step's facts; a step the role did not update at
        (a critic warm-up, a run without a critic) is a :class:`ppolab.errors.RecordEntryError`."""
        from ppolab.errors import RecordEntryError
        from ppolab.update_plan import PLANS_KEY, recorded_plan

        if role not in self._plans:
            recorded = role in (self.info.get(PLANS_KEY) or {})
            history = "actor_log_probs" if role == "actor" else "critic_vpreds"
            if not recorded and (history not in self.tensors or self.config_of is None):
                raise RecordEntryError(f"{self.info_file}: step {self.step} has no {role} update (no {history})")
            self._plans[role] = recorded_plan(self, None if recorded else self.config_of(), role)
        return self._plans[role]

    def opt_step(self, k: int, role: str = "actor") -> OptimizerStepRecord:
        """Optimizer step ``k`` of ``role``'s update at this step, as the worker executed it (:meth:`plan`): its
        place, rows, micro-batches, global counts and label, and its tensors (:meth:`OptimizerStepRecord.batch`)."""
        from ppolab.errors import whole_argument

        plan = self.plan(role)
        k = whole_argument("opt_step", k, range(len(plan.steps)), f"an optimizer step of the {role}'s update at "
                                                                      f"step {self.step}")
        return OptimizerStepRecord(self, role, k, plan.steps[k])

    @property
    def info_file(self) -> str:
        """How an error names the step's JSON file."""
        return str(self.files[1]) if self.files else f"the record of step {self.step}"

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def real_rows(self) -> torch.Tensor:
        """Boolean (N,) of the real trajectories (the synthetic padding samples of stage 3 excluded)."""
        return real_rows_of(self.tensors)

    def batch_tensors(self) -> dict[str, torch.Tensor]:
        """The step's batch after the nine stages: every recorded tensor but the update histories
        (:data:`HISTORIES`)."""
        return {k: v for k, v in self.tensors.items() if k not in HISTORIES and not k.startswith(UPDATE_STATE)}

    def update_state(self) -> dict[str, Any] | None:
        """The actor's state before this step's update, when the run kept it (``trainer.record_update_state``):
        ``{"weights": {"actor.<i>": tensor}, "optimizer": state_dict, "scheduler": state_dict}`` — the actor's
        weights in ``actor_parameters()`` order and what ``Worker.load_state_dict`` takes, as copies (the optimizer
        keeps the tensors it is given and steps them in place: the record must stay as recorded). None when not
        recorded."""
        from ppolab.errors import FileFormatError

        meta = self.info.get("update_state")
        if meta is None:
            return None
        tensors_file = self.files[0] if self.files else f"the tensors of step {self.step}"
        if not isinstance(meta, dict) or not {"optimizer", "scheduler"} <= set(meta):
            raise FileFormatError(f"{self.info_file}: its 'update_state' is not the object of 'optimizer' and "
                                  f"'scheduler' the recorder writes; {REDO}")
        weights, optim = {}, {}
        for key in self.tensors:
            if key.startswith(UPDATE_STATE + "weights."):
                weights[key[len(UPDATE_STATE + "weights."):]] = self.tensors[key].clone()
            elif key.startswith(UPDATE_STATE + "optim."):
                optim[key[len(UPDATE_STATE + "optim."):]] = self.tensors[key].clone()
        recorded = meta.get("digest")  # runs recorded before digests were kept: the replay's log-prob check
        if recorded is not None:
            found = tensors_digest({f"{UPDATE_STATE}weights.{k}": v for k, v in weights.items()}
                                   | {f"{UPDATE_STATE}optim.{k}": v for k, v in optim.items()})
            if found != recorded:
                raise FileFormatError(f"{tensors_file}: its update state (the actor's weights and Adam state "
                                      f"before step {self.step}) is not the one {self.info_file} recorded "
                                      f"(digest {found[:12]}…, recorded {str(recorded)[:12]}…): copied in from "
                                      f"another step or damaged — a replay from it would measure another update; "
                                      f"put back the step's own file, or {REDO}")
        if not weights:
            raise FileFormatError(f"{tensors_file} holds no update-state weights ({UPDATE_STATE}weights.*) though "
                                  f"{self.info_file} records an update state; {REDO}")
        try:
            optimizer = optimizer_state(optim, meta["optimizer"])
        except (KeyError, ValueError, TypeError) as e:
            raise FileFormatError(f"{self.info_file}: its 'update_state.optimizer' does not match the tensors "
                                  f"{UPDATE_STATE}optim.* of {tensors_file} ({type(e).__name__}: {e}); "
                                  f"{REDO}") from None
        return {"weights": weights, "optimizer": optimizer, "scheduler": meta["scheduler"]}

    @property
    def texts(self) -> dict[str, list[str]]:
        """Decoded ``prompts`` and ``responses`` of every row."""
        return self.info.get("texts", {})


class RecordInfo(dict):
    """A recorded step's JSON (a ``dict``, its objects and arrays too): a key or list item a reader needs and the file
    lacks is a :class:`ppolab.errors.RecordEntryError` naming the file and the entry — still a ``KeyError`` /
    ``IndexError``; ``get`` and ``in`` behave as a dict's."""

    def __init__(self, data: Mapping[str, Any], file: Path | str, where: str = ""):
        super().__init__((k, _wrapped(v, file, f"{where}.{k}" if where else str(k))) for k, v in data.items())
        self.file, self.where = file, where

    def __missing__(self, key: Any):
        from ppolab.errors import RecordEntryError

        raise RecordEntryError(f"{self.file} has no entry {self.where + '.' if self.where else ''}{key} (the "
                               f"recorder writes it): the file was edited or damaged; {REDO}")


class RecordList(list):
    """A list of :class:`RecordInfo`: an index past its end names the file and the entry."""

    def __init__(self, data: list, file: Path | str, where: str):
        super().__init__(_wrapped(v, file, f"{where}[{i}]") for i, v in enumerate(data))
        self.file, self.where = file, where

    def __getitem__(self, i):
        try:
            return super().__getitem__(i)
        except IndexError:
            from ppolab.errors import RecordEntryError

            raise RecordEntryError(f"{self.file}: {self.where} has {len(self)} entries, no [{i}] (the recorder "
                                   f"writes one per row): the file was edited or damaged; {REDO}") from None


def _wrapped(value: Any, file: Path | str, where: str) -> Any:
    if isinstance(value, dict):
        return RecordInfo(value, file, where)
    if isinstance(value, list):
        return RecordList(value, file, where)
    return value


def check_record(k: int, tensors: LazyTensors, info: dict[str, Any], tensors_file: Path, info_file: Path,
                  steps: list[int]) -> None:
    """:class:`ppolab.errors.FileFormatError` naming the file when step ``k``'s pair disagrees with itself: a file
    that records another step (copied over this one), per-row lists of another length than the tensors' rows."""
    from ppolab.errors import FileFormatError

    todo = f"put back the step's own file, open another step (recorded: {steps}), or {REDO}"
    if "step" in info and info["step"] != k:
        raise FileFormatError(f"{info_file} records step {info['step']!r}, not {k}: copied in from another step's "
                              f"file or edited; {todo}")
    if "step" in tensors.metadata and tensors.metadata["step"] != str(k):
        raise FileFormatError(f"{tensors_file} records step {tensors.metadata['step']}, not {k} (its header): copied "
                              f"in from another step's file; {todo}")
    if "responses" not in tensors:
        return
    rows = tensors._entries["responses"][1][0] if tensors._entries["responses"][1] else 0
    texts = info.get("texts")
    lists = {f"texts.{n}": v for n, v in texts.items()} if isinstance(texts, dict) else {}
    lists["data_source"] = info.get("data_source")
    for name, value in lists.items():
        if isinstance(value, list) and len(value) != rows:
            raise FileFormatError(f"{info_file}: its {name} has {len(value)} entries, the step's "
                                  f"{tensors_file.name} {rows} rows (one each): the file was edited or damaged; "
                                  f"{todo}")


