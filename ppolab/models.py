"""The models: load a local Hugging Face causal LM (the shipped tiny model, or e.g. Qwen2.5-0.5B-Instruct), and
the one forward pass every stage runs on it.

Nothing here reaches a model hub: only local directories are accepted. :func:`forward_response` returns per-token
log-probs, entropy and/or values for the response positions, aligned by the one-token shift (chapter §9); the
roles that share a model (actor, reference, critic) are :mod:`ppolab.roles`.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast, Qwen2Config
from transformers.utils import logging as hf_logging

from ppolab.algos import calculate_sum_pi_squared_from_logits, entropy_from_logits, logprobs_from_logits, scale_logits
from ppolab.algos.fused_head import fused_head_logprobs_entropy
from ppolab.algos.logprob import chunked_logprobs_entropy, logit_rows_per_pass, use_chunked_logits
from ppolab.algos.remove_padding import pack_rows, pad_responses
from ppolab.course import COURSE_ROOT, DATA

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()

REPO_ROOT = COURSE_ROOT  # the checkout, or the wheel's ppolab/_course (ppolab/course.py)
SHIPPED_MODEL = DATA / "models" / "tiny-arith"
SHIPPED_ARITH = DATA / "arith"

#: One model built at a time in this process. transformers' ``from_pretrained`` swaps process-wide state for the
#: length of a load (torch's default dtype, ``torch.nn.init``'s functions, weight tying, ``torch.linspace``, the meta
#: device) and puts back on exit what it found on entry: two loads interleaved in threads put back each other's
#: patches (a model left on the meta device, then every later load broken), and a model built beside a load (a LoRA
#: adapter's seeded init) is built with the patched functions. Re-entrant: ``ppolab.worker.build_models`` holds it
#: across its loads, its ``torch.manual_seed`` and its adapters' init.
MODEL_LOCK = threading.RLock()

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def _model_dir(path: str | os.PathLike) -> Path:
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise FileNotFoundError(
            f"no local model directory at '{path}' (a folder with config.json, weights and tokenizer files). "
            f"Models load from local folders only, never from a hub; the shipped tiny model is "
            f"data/models/tiny-arith ({SHIPPED_MODEL})."
        )
    return p


#: Files one of which a directory needs to hold a tokenizer (fast tokenizer, BPE, sentencepiece, WordPiece).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model", "vocab.txt")
_REBUILD = ("re-run python -m ppolab.sft to rebuild the shipped tiny model, or copy the complete model "
            "directory there again")


def _rebuild(p: Path) -> str:
    """What to do about a damaged model directory: the shipped tiny model is rebuilt by ``ppolab.sft``; a user's own
    is saved again whole (``model.save_pretrained(DIR)`` and ``tokenizer.save_pretrained(DIR)``)."""
    try:
        shipped = Path(p).resolve() == SHIPPED_MODEL.resolve()
    except OSError:
        shipped = False
    if shipped:
        return _REBUILD
    return ("copy the complete model directory there again (config.json, weights and tokenizer files: "
            "model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR) write them all)")


#: The other files a tokenizer reads beside :data:`TOKENIZER_FILES`.
TOKENIZER_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")


def _check_tokenizer_files(p: Path) -> None:
    from ppolab.errors import MissingFileError
    from ppolab.run.files import regular_file

    for name in (*TOKENIZER_FILES, *TOKENIZER_EXTRAS):  # a pipe or device there would be skipped (is_file), and
        if (p / name).exists() or (p / name).is_symlink():  # the tokenizer loaded without it: named instead
            regular_file(p / name, todo="a model directory's files are plain files; " + _rebuild(p))
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        raise MissingFileError(f"the model directory {p} has no tokenizer files (none of "
                               f"{', '.join(TOKENIZER_FILES)}); {_rebuild(p)}")


def _check_weight_files(p: Path) -> None:
    """A missing or truncated ``model.safetensors`` (or shard) is named before transformers reads it."""
    from safetensors import safe_open

    from ppolab.errors import FileFormatError, MissingFileError

    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as e:
            raise FileFormatError(f"{index} does not parse ({e}); {_rebuild(p)}") from None
        files = [p / s for s in shards]
    elif (p / "model.safetensors").is_file() or not list(p.glob("pytorch_model*.bin")):
        files = [p / "model.safetensors"]
    else:
        return  # a PyTorch .bin checkpoint: transformers reads it (and names it) itself
    for f in files:
        if f.exists():
            from ppolab.run.files import regular_file

            regular_file(f, todo="a model directory's files are plain files; " + _rebuild(p))  # never read
        if not f.is_file():
            raise MissingFileError(f"{f} is missing: the model directory has no weights; {_rebuild(p)}")
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except Exception as e:  # safetensors raises its own error type for a truncated or foreign file
            raise FileFormatError(f"{f} is not a complete safetensors file ({e}); {_rebuild(p)}") from None


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer of a local model dir, left-padded for generation, with a pad token.

    A ``tokenizer_class`` of ``PreTrainedTokenizerFast`` is honoured as written (``AutoTokenizer``
    would swap in ``Qwen2Tokenizer`` for a Qwen2 config); anything else goes through ``AutoTokenizer``.
    """
    return load_tokenizer_files(_model_dir(path))


def load_tokenizer_files(p: str | os.PathLike) -> Any:
    """:func:`load_tokenizer` of a folder of tokenizer files alone (a run dir's ``tokenizer/``: no model config)."""
    p = Path(p)
    _check_tokenizer_files(p)
    cfg_file = p / "tokenizer_config.json"
    cls = json.loads(cfg_file.read_text()).get("tokenizer_class") if cfg_file.is_file() else None
    loader = PreTrainedTokenizerFast if cls == "PreTrainedTokenizerFast" else AutoTokenizer
    tok = loader.from_pretrained(p, local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or 'auto', got {dtype!r}")
    return _DTYPES[dtype]


def load_tokenizer_and_model(
    path: str | os.PathLike, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu"
) -> tuple[Any, torch.nn.Module]:
    """``(tokenizer, model)`` from a local directory; the model is in eval mode on ``device``. Thread-safe: loads
    run one at a time (:data:`MODEL_LOCK`)."""
    with MODEL_LOCK:
        return _load_tokenizer_and_model(path, dtype, device)


def _load_tokenizer_and_model(path: str | os.PathLike, dtype: str | torch.dtype, device: str | torch.device
                              ) -> tuple[Any, torch.nn.Module]:
    p = _model_dir(path)
    tok = load_tokenizer(p)
    _check_weight_files(p)
    # transformers >= 4.56 calls it dtype; older versions torch_dtype.
    key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, **{key: _dtype(dtype)})
    model.to(device).eval()
    gc = model.generation_config
    if gc.pad_token_id is None:
        gc.pad_token_id = tok.pad_token_id
    if gc.eos_token_id is None:
        gc.eos_token_id = tok.eos_token_id
    warn_dropout(model.config, path)
    return tok, model


def model_skeleton(source: Any) -> torch.nn.Module | None:
    """The causal LM that ``source`` (a local model directory, or a transformers config) builds, on the meta device:
    its modules and their settings with no weight read or allocated (well under a second for a 0.5B model), so a
    config mistake is found before the load. None when transformers cannot build it from the config alone (the load
    then names the problem itself)."""
    import copy

    try:
        if isinstance(source, (str, os.PathLike)):
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(_model_dir(source), local_files_only=True)
        else:
            config = copy.deepcopy(source)
        # torch.device as a context is thread-local (torch's function-mode stack); dtype=None keeps transformers
        # from setting torch's process-wide default dtype; the lock keeps a load in another thread from patching
        # the functions the build calls (MODEL_LOCK)
        with MODEL_LOCK, torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=None)
    except Exception:  # noqa: BLE001 — not buildable from its config alone: the real load reports it
        return None


def dropout_in_use(config: Any) -> dict[str, float]:
    """The dropout probabilities of ``config`` (keys naming dropout or pdrop, > 0) that its causal LM uses, decided
    by its modules: each such key gets a value of its own, the model is built on the meta device
    (:func:`model_skeleton`), and a key counts when its value turns up in a module — a Dropout's ``p`` or the float
    an attention passes to its attention function (Llama's, Qwen2's, GPT-NeoX's ``attention_dropout``). A
    sequence-classification head's ``classifier_dropout`` is left out: a causal LM never builds that head. A config
    transformers cannot build is taken at its word (every such key)."""
    on = {k: v for k, v in config.to_dict().items()
          if ("dropout" in k or "pdrop" in k) and isinstance(v, float) and v > 0}
    if not on:
        return on
    import copy

    probe = copy.deepcopy(config)
    marks = {k: 0.01 + (i + 1) * 2.0 ** -20 for i, k in enumerate(on)}  # exact in binary: compared with ==
    for k, mark in marks.items():
        setattr(probe, k, mark)
    skeleton = model_skeleton(probe)
    if skeleton is None:
        return on
    seen = {v for m in skeleton.modules() for v in vars(m).values() if isinstance(v, float)}
    return {k: v for k, v in on.items() if marks[k] in seen}


def warn_dropout(config: Any, path: str | os.PathLike) -> None:
    """One ConfigNotice when the model's causal LM uses dropout (GPT-2's default 0.1; :func:`dropout_in_use`): the
    update's forward runs in train mode (as verl's actor does), so π_θ differs from π_old already at the first
    optimizer step — the ratio is not exactly 1 there and tokens clip with no update yet (chapter §3, lab 04)."""
    import warnings

    from ppolab.config.schema import ConfigNotice

    on = dropout_in_use(config)
    if on:
        warnings.warn(f"{path}: the model has dropout ({', '.join(f'{k}={v:g}' for k, v in sorted(on.items()))}): "
                      "the update's forward runs in train mode, so the ratio π_θ/π_old is not 1 even at the first "
                      "optimizer step (chapter §3) and tokens are clipped before any update; set "
                      f"{' and '.join(sorted(on))} to 0 in its config.json to train as the labs describe",
                      ConfigNotice, stacklevel=3)


def tiny_qwen2_config(
    tokenizer: Any, hidden: int = 128, layers: int = 2, heads: int = 4, intermediate: int | None = None,
    max_positions: int = 64,
) -> Qwen2Config:
    """A small Qwen2 config for ``tokenizer`` (tied embeddings, no GQA)."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def generation_config_for(tokenizer: Any) -> GenerationConfig:
    """Plain defaults (no top-k 50, no sampling) with the tokenizer's special ids."""
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct last name parts of the layers LoRA can wrap (``q_proj``, ``up_proj``, …), sorted."""
    kinds = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d)
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                   if name and (isinstance(m, kinds) or type(m).__name__ == "Conv1D")})


def check_target_modules(model: torch.nn.Module, target_modules: Any,
                         key: str = "actor_rollout_ref.model.target_modules") -> None:
    """Refuse LoRA ``target_modules`` entries that name no layer of ``model`` (peft would silently wrap only the
    others: a typo trains on fewer layers than asked), listing the layers it has. ``"all-linear"`` is peft's to
    resolve."""
    from ppolab.config import ConfigError

    if isinstance(target_modules, str):  # "all-linear" (config validation refuses any other string)
        return
    wrappable = set(linear_module_names(model))
    names = [n for n, _ in model.named_modules() if n]
    layers = f"its layers LoRA can wrap: {', '.join(sorted(wrappable))} (or 'all-linear')"
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or "the model"
    missing = [t for t in target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        raise ConfigError(f"{key}: {', '.join(map(repr, missing))} {'is' if len(missing) == 1 else 'are'} not a "
                          f"layer of {path}; {layers}")
    unwrappable = [t for t in target_modules if t.rsplit(".", 1)[-1] not in wrappable]
    if unwrappable:  # a norm or a whole block: peft refuses it deep inside get_peft_model
        raise ConfigError(f"{key}: {', '.join(map(repr, unwrappable))} in {path} "
                          f"{'is not a layer' if len(unwrappable) == 1 else 'are not layers'} LoRA can wrap (a "
                          f"linear or embedding layer); {layers}")


def check_vocab_fits(model: torch.nn.Module, tokenizer: Any, key: str, path: Any) -> None:
    """Refuse a model whose embedding has fewer rows than ``tokenizer`` has ids (an ``IndexError`` in the middle of
    a step otherwise), naming the config key."""
    from ppolab.config import ConfigError

    rows, ids = model.get_input_embeddings().num_embeddings, len(tokenizer)
    if rows < ids:
        raise ConfigError(f"{key}={str(path)!r}: its embedding has {rows} rows but the actor's tokenizer has {ids} "
                          f"token ids, so token ids ≥ {rows} would index past it; give a model built on the actor's "
                          "tokenizer (the same vocabulary)")


def check_packing_supported(keys: list[str]) -> None:
    """Refuse, before any weight loads, packed rows (``keys``: the ``use_remove_padding`` keys set) where this
    transformers' mask builder cannot tell packed sequences apart: without ``find_packed_sequence_indices`` a packed
    row would be one long sequence, each response attending to the rows before it."""
    from ppolab.config import ConfigError

    masking = getattr(transformers, "masking_utils", None)
    if keys and not hasattr(masking, "find_packed_sequence_indices"):
        raise ConfigError(f"{', '.join(keys)}=true needs a transformers whose attention masks follow packed position "
                          f"ids (transformers {transformers.__version__} has no masking_utils."
                          f"find_packed_sequence_indices): upgrade transformers, or set {keys[0]}=false")


# ====================================================================== the forward pass
@dataclass
class ResponseOutputs:
    """Per-token outputs on the response positions, each (bs, R) or None."""

    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: cumsum(mask) − 1, clamped at 0 (as HF ``generate`` does)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def forward_response(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    temperature: float,
    want_log_probs: bool = True,
    want_entropy: bool = False,
    value_head: nn.Module | None = None,
    want_sum_pi_squared: bool = False,
    chunked: bool | None = None,
    fused: bool | None = None,
    remove_padding: bool = False,
) -> ResponseOutputs:
    """Run ``model`` on prompt ‖ response and read the response positions.

    Shapes: input_ids, attention_mask (bs, P + R) with prompts left-padded and responses right-padded;
    R = ``response_length``. The logits at position t predict token t+1, so the response tokens are
    predicted by the last R+1 positions minus the final one (the one-token shift, chapter §9). Logits
    are divided by the temperature before log-probs and entropy (verl `prepare_model_outputs`). Values are the value
    head on the hidden state at the same shifted positions (the value of the state *before* each token).

    ``chunked``: the path for a real vocabulary (151,936 tokens), where the logits are the largest tensor of the
    step. Where the head allows it (:func:`_fusable_head`) and Σπ² is not asked for, log-probs and entropy come from
    the decoder's hidden states and the head's weight over vocabulary chunks, never making the logits
    (:func:`ppolab.algos.fused_head.fused_head_logprobs_entropy`); otherwise from the model's logits a slice of
    positions at a time (:func:`ppolab.algos.logprob.chunked_logprobs_entropy`), with no full-size float32 copy.
    None decides by size (above ``CHUNK_LOGITS_THRESHOLD`` logits, or from ``CHUNK_VOCAB`` tokens at any batch),
    which the shipped tiny model never reaches — its runs keep the plain formulas below, bit for bit.
    ``fused=False`` keeps a chunked forward on the logits (a bench's or a test's comparison); None fuses where the
    head allows it. Without gradients
    (a reading, an inference pass) the rows go through the model a few at a time
    (:func:`ppolab.algos.logprob.logit_rows_per_pass`), so no pass holds more than 2^27 logits (512 MiB in fp32);
    the shipped model never needs more than one pass.

    ``remove_padding`` (verl ``actor_rollout_ref.model.use_remove_padding``, ``critic.model.use_remove_padding``):
    the rows' real tokens go through the model packed end to end in one row, position ids restarting with each
    sequence (:func:`_forward_packed`); the same outputs to float rounding, with no slot spent on padding, and 0
    in the padded slots of the (bs, R) results.
    """
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if chunked is None and vocab:
        chunked = use_chunked_logits(input_ids.shape[0], response_length, int(vocab))
    wanted = (want_log_probs or want_entropy) and not want_sum_pi_squared
    head = _fusable_head(model) if chunked and wanted and fused is not False else None
    if remove_padding:
        return _forward_packed(model, head, input_ids, attention_mask, response_length, temperature, want_log_probs,
                               want_entropy, value_head, want_sum_pi_squared, bool(chunked))
    if head is not None:  # the fused path makes no logits at all: no pass needs to be split by rows
        return _forward_fused(model, head, input_ids, attention_mask, response_length, temperature, want_log_probs,
                              want_entropy, value_head)
    per_pass = logit_rows_per_pass(response_length + 1, int(vocab)) if vocab else input_ids.shape[0]
    if not torch.is_grad_enabled() and input_ids.shape[0] > per_pass:
        parts = [forward_response(model, input_ids[s:s + per_pass], attention_mask[s:s + per_pass], response_length,
                                  temperature, want_log_probs, want_entropy, value_head, want_sum_pi_squared, chunked,
                                  fused)
                 for s in range(0, input_ids.shape[0], per_pass)]
        return ResponseOutputs(**{f: None if getattr(parts[0], f) is None else torch.cat([getattr(p, f) for p in parts])
                                  for f in ("log_probs", "entropy", "values", "sum_pi_squared")})
    out = _forward(model, input_ids, attention_mask, response_length, hidden=value_head is not None)
    result = ResponseOutputs()
    responses = input_ids[:, -response_length:]
    if chunked is None:
        chunked = use_chunked_logits(input_ids.shape[0], response_length, out.logits.shape[-1])
    if want_log_probs or want_entropy or want_sum_pi_squared:
        log_probs, result.entropy, result.sum_pi_squared = _read_logits(out.logits, responses, temperature, chunked,
                                                                        want_entropy, want_sum_pi_squared)
        result.log_probs = log_probs if want_log_probs else None
    if value_head is not None:
        hidden = out.hidden_states[-1][:, -response_length - 1 : -1, :]
        result.values = value_head(hidden.to(value_head.weight.dtype)).squeeze(-1)
    return result


def _read_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float | torch.Tensor, chunked: bool,
                 want_entropy: bool, want_sum_pi_squared: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(log π(label), entropy, Σπ²) of logits (B, T' ≥ T, V) read at their first T positions, labels (B, T) — the
    model's logits as they are (model dtype, no temperature): a chunk of positions at a time where ``chunked``,
    else through one float32 copy scaled by the temperature. The entropy and Σπ² None unless asked for."""
    if chunked:
        return chunked_logprobs_entropy(logits, labels, temperature, want_entropy, want_sum_pi_squared)
    scaled = scale_logits(logits[:, :labels.shape[1], :].float(), temperature)
    return (logprobs_from_logits(scaled, labels), entropy_from_logits(scaled) if want_entropy else None,
            calculate_sum_pi_squared_from_logits(scaled) if want_sum_pi_squared else None)  # already scaled


def _fusable_head(model: nn.Module) -> nn.Linear | None:
    """The model's LM head where log-probs and entropy can be computed from the hidden states without making the
    logits (:func:`ppolab.algos.fused_head.fused_head_logprobs_entropy`): a plain ``nn.Linear`` head (tied or
    not; not a LoRA-wrapped one) of a causal LM whose forward is decoder → head with nothing in between — no logit
    soft-capping or scaling (Gemma 2, Cohere) — and whose decoder is reachable. Else None: the logits path."""
    get_head, get_decoder = getattr(model, "get_output_embeddings", None), getattr(model, "get_decoder", None)
    if get_head is None or get_decoder is None:
        return None
    try:
        head, decoder = get_head(), get_decoder()
    except (AttributeError, NotImplementedError):
        return None
    cfg = getattr(model, "config", None)
    if type(head) is not nn.Linear or decoder is None or decoder is model:
        return None
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        return None
    return head


def _forward_fused(model: nn.Module, head: nn.Linear, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   response_length: int, temperature: float, want_log_probs: bool, want_entropy: bool,
                   value_head: nn.Module | None) -> ResponseOutputs:
    """:func:`forward_response` through the decoder alone: its last hidden states at the R positions that score the
    response (the one-token shift) go to the fused head computation, and to the value head where there is one."""
    out = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    hidden = out.last_hidden_state[:, -response_length - 1: -1, :]
    log_probs, entropy = fused_head_logprobs_entropy(hidden, head.weight, input_ids[:, -response_length:],
                                                     temperature, want_entropy, head.bias)
    result = ResponseOutputs(log_probs=log_probs if want_log_probs else None, entropy=entropy)
    if value_head is not None:
        result.values = value_head(hidden.to(value_head.weight.dtype)).squeeze(-1)
    return result


def _forward_packed(model: nn.Module, head: nn.Linear | None, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    response_length: int, temperature: float, want_log_probs: bool, want_entropy: bool,
                    value_head: nn.Module | None, want_sum_pi_squared: bool, chunked: bool) -> ResponseOutputs:
    """:func:`forward_response` on packed rows (:func:`ppolab.algos.remove_padding.pack_rows`): the real tokens end
    to end, no attention mask, position ids restarting at 0 per sequence — from which transformers' mask builder
    makes the block-diagonal causal mask (``find_packed_sequence_indices``) for sdpa and eager attention on CPU and
    GPU, and flash-attention's variable-length kernel reads the same position ids. A micro-batch of up to 4,096
    tokens is one packed row, verl's layout; a larger one is cut into rows of that many, so an attention that
    computes every pair of a row stays bounded. The LM head (or the fused head, or the value head) runs on the
    positions that score a real response token (verl computes the head on every packed token; the outputs read are
    the same)."""
    packed = pack_rows(input_ids, attention_mask, response_length)
    if torch.is_tensor(temperature) and temperature.dim() == 1:  # one per row → one per packed position scored
        temperature = temperature[:, None].expand(packed.real.shape)[packed.real]
    width = packed.input_ids.shape[1]
    result = ResponseOutputs()
    if head is not None:  # the fused path: decoder only, the head's weight applied in vocabulary chunks
        out = model.get_decoder()(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
        hidden = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])[packed.scoring]
        log_probs, entropy = fused_head_logprobs_entropy(hidden, head.weight, packed.labels, temperature,
                                                         want_entropy, head.bias)
        result.log_probs = pad_responses(log_probs, packed.real) if want_log_probs else None
        result.entropy = pad_responses(entropy, packed.real) if entropy is not None else None
    else:  # the model's own head, on the slots some packed row scores at (one row: exactly the scoring slots)
        slots, where = torch.unique(packed.scoring % width, return_inverse=True)
        out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                    output_hidden_states=value_head is not None, logits_to_keep=slots)
        hidden = None
        if value_head is not None:
            last = out.hidden_states[-1]
            hidden = last.reshape(-1, last.shape[-1])[packed.scoring]
        if want_log_probs or want_entropy or want_sum_pi_squared:
            logits = out.logits[packed.scoring // width, where].unsqueeze(1)  # (n, 1, V): positions as rows
            log_probs, entropy, spi2 = (None if x is None else x.squeeze(1) for x in _read_logits(
                logits, packed.labels.unsqueeze(1), temperature, chunked, want_entropy, want_sum_pi_squared))
            result.log_probs = pad_responses(log_probs, packed.real) if want_log_probs else None
            result.entropy = pad_responses(entropy, packed.real) if entropy is not None else None
            result.sum_pi_squared = pad_responses(spi2, packed.real) if spi2 is not None else None
    if value_head is not None:
        result.values = pad_responses(value_head(hidden.to(value_head.weight.dtype)).squeeze(-1), packed.real)
    return result


def _forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
             hidden: bool = False):
    """The model on prompt ‖ response, keeping the logits of the last R + 1 positions (the first R score the
    response tokens: the one-token shift)."""
    return model(input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=position_ids_from_mask(attention_mask), output_hidden_states=hidden,
                 logits_to_keep=response_length + 1, use_cache=False)


def shifted_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   response_length: int) -> torch.Tensor:
    """(bs, R, V) raw logits (model dtype, no temperature) that score each response token — the same forward and
    one-token shift as :func:`forward_response`, for readings over the full distribution (chapter §7.3)."""
    return _forward(model, input_ids, attention_mask, response_length).logits[:, :-1, :]


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them (verl
    ``actor_rollout_ref.model.enable_gradient_checkpointing``): memory per layer drops to its input, for ~30% more
    compute. Non-reentrant checkpointing (``use_reentrant=False``) back-propagates into LoRA weights without the
    embedding output having to require grad, which the reentrant variant needs with a frozen base. HF applies it only
    in train mode; Qwen2 has no dropout, so train mode changes no number."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x's name; the old one warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class ValueHead(nn.Linear):
    """V(s) = w·h + b on the last hidden state (verl's critic: a token-classification head, 1 label)."""

    def __init__(self, hidden_size: int, seed: int = 0):
        super().__init__(hidden_size, 1)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.weight.copy_(torch.randn(self.weight.shape, generator=g) * 0.02)
            self.bias.zero_()
