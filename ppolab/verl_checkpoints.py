"""A verl job's checkpoints, read for their weights: what lab 18's per-tensor view compares between two of them.

verl 0.9.1's ``FSDPCheckpointManager.save_checkpoint`` (``utils/checkpoint/fsdp_checkpoint_manager.py``) writes
``<trainer.default_local_dir>/global_step_<N>/actor/``:

* ``model_world_size_<W>_rank_<r>.pt``, ``optim_…``, ``extra_state_…`` — each rank's shards, ``torch.save``
  pickles. Never read here: unpickling runs whatever code the file names.
* ``huggingface/`` — the model's config and tokenizer, and with ``hf_model`` in
  ``actor_rollout_ref.actor.checkpoint.save_contents`` (default ``[model, optimizer, extra]``) the full weights,
  written by ``save_pretrained``: ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` with
  ``model.safetensors.index.json``.
* ``lora_train_meta.json`` — ``{"r", "lora_alpha", "task_type"}`` of a LoRA run.

A peft adapter folder (``adapter_model.safetensors`` with ``adapter_config.json``: what
``actor_rollout_ref.model.lora_adapter_path`` loads, and what peft's ``save_pretrained`` writes) is read as well.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from ppolab.course import DATA
from ppolab.errors import FileFormatError, MissingFileError
from ppolab.run.files import read_json

#: Two checkpoints of a short grpo_tiny run in verl's layout (tools/make_verl_checkpoints.py): what lab 18 opens.
EXAMPLE = DATA / "verl_checkpoints" / "grpo_tiny"
#: The environment variable a lab reads for the learner's own job: its checkpoint folder
#: (``trainer.default_local_dir``, holding ``global_step_<N>/``) or two checkpoints separated by ``os.pathsep``.
ENV = "PPOLAB_VERL_CHECKPOINTS"
_STEP = re.compile(r"^global_step_(\d{1,12})$")

#: What a checkpoint path may be, said in every error.
EXPECTED = ("a verl checkpoint: global_step_<N>/ or its actor/ folder with huggingface/model*.safetensors "
            "(actor_rollout_ref.actor.checkpoint.save_contents with hf_model), or a peft adapter folder "
            "(adapter_model.safetensors)")
#: The words of the refusal of a checkpoint that holds pickles only.
PICKLES_ONLY = ("holds verl's torch.save shards only ({names}); ppolab never unpickles a file (unpickling runs the "
                "code it names) — save the job with actor_rollout_ref.actor.checkpoint.save_contents="
                "[model,optimizer,extra,hf_model] for safetensors weights")


def checkpoint_pair(path: str | Path | None = None) -> tuple[Path, Path]:
    """The two checkpoints a lab compares: the first and the last ``global_step_<N>/`` of the checkpoint folder
    ``path`` (``trainer.default_local_dir``), or two paths joined by ``os.pathsep``; None: ``$PPOLAB_VERL_CHECKPOINTS``
    when set, else :data:`EXAMPLE`. Fewer than two checkpoints is one line naming the folder."""
    given = path if path is not None else os.environ.get(ENV) or EXAMPLE
    parts = str(given).split(os.pathsep)
    if len(parts) == 2:
        return Path(parts[0]).expanduser(), Path(parts[1]).expanduser()
    folder = Path(given).expanduser()
    if not folder.is_dir():
        raise MissingFileError(f"{folder} is not a folder; give a verl checkpoint folder (trainer.default_local_dir, "
                               f"with global_step_<N>/ inside) or two checkpoints joined by {os.pathsep!r}")
    steps = sorted((int(m.group(1)), f) for f in folder.iterdir() if f.is_dir() and (m := _STEP.match(f.name)))
    if len(steps) < 2:
        raise FileFormatError(f"{folder} holds {len(steps)} global_step_<N>/ folder(s); two checkpoints are compared "
                              "— give a job that saved at least twice (trainer.save_freq)")
    return steps[0][1], steps[-1][1]


def weight_files(path: str | Path) -> tuple[list[Path], dict]:
    """The safetensors files of the checkpoint ``path`` names and what it says about LoRA (``{"r", "lora_alpha"}``
    or ``{}``): ``path`` is ``global_step_<N>/``, its ``actor/``, the ``huggingface/`` folder, a peft adapter folder
    or one ``.safetensors`` file. A checkpoint of pickles only, or none of these, is one line naming the path."""
    p = Path(path).expanduser()
    if not p.exists():
        raise MissingFileError(f"{p} does not exist; give {EXPECTED}")
    if p.is_file():
        if p.suffix != ".safetensors":
            raise FileFormatError(f"{p} is not a .safetensors file; give {EXPECTED}")
        return [p], {}
    for folder in (p, p / "actor", p / "huggingface", p / "actor" / "huggingface"):
        if (folder / "adapter_model.safetensors").is_file():
            cfg = _json(folder / "adapter_config.json") if (folder / "adapter_config.json").is_file() else {}
            return [folder / "adapter_model.safetensors"], _lora(cfg, folder / "adapter_config.json")
        files = sorted(folder.glob("model*.safetensors"))
        if files:
            meta = next((m for m in (folder / "lora_train_meta.json", folder.parent / "lora_train_meta.json")
                         if m.is_file()), None)
            return files, _lora(_json(meta), meta) if meta else {}
    pickles = sorted(f.name for d in (p, p / "actor") if d.is_dir() for f in d.glob("model_world_size_*_rank_*.pt"))
    if pickles:
        raise FileFormatError(f"{p} " + PICKLES_ONLY.format(names=", ".join(pickles[:2])
                                                             + (" …" if len(pickles) > 2 else "")))
    # another trainer's checkpoint (DeepSpeed's mp_rank_00_model_states.pt, a pytorch_model.bin): pickles too
    other = sorted(f.name for d in (p, p / "actor") if d.is_dir() for f in d.iterdir()
                   if f.suffix in (".pt", ".pth", ".bin", ".ckpt", ".pkl"))
    if other:
        raise FileFormatError(f"{p} holds pickled weights only ({', '.join(other[:2])}{' …' if len(other) > 2 else ''})"
                              "; ppolab never unpickles a file (unpickling runs the code it names) — give a "
                              "checkpoint saved as safetensors")
    raise FileFormatError(f"{p} holds no weights ppolab can read; give {EXPECTED}")


def _json(f: Path) -> dict:
    out = read_json(f, "it comes from the checkpoint's writer — copy it again")
    if not isinstance(out, dict):
        raise FileFormatError(f"{f} holds a {type(out).__name__}, not a JSON object")
    return out


def _lora(cfg: dict, f: Path) -> dict:
    if "r" not in cfg:
        return {}
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if not (isinstance(r, int) and r > 0 and isinstance(alpha, (int, float)) and alpha > 0):
        raise FileFormatError(f"{f}: r = {r!r}, lora_alpha = {alpha!r}; expected a positive rank and alpha")
    return {"r": r, "lora_alpha": alpha}


def read_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Every tensor of the checkpoint ``path`` names (float32, on the CPU) and its LoRA settings
    (:func:`weight_files`). A file that is not whole safetensors is one line naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files, lora = weight_files(path)
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors = load_file(str(f))
        except (SafetensorError, OSError, ValueError) as e:
            raise FileFormatError(f"{f} is not a whole safetensors file ({str(e).splitlines()[0][:80]}); copy the "
                                  "checkpoint again") from None
        out.update({k: v.float() for k, v in tensors.items()})
    return out, lora
