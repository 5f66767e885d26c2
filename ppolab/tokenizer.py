"""A character-level tokenizer for the arithmetic task, saved in Hugging Face format.

One token per character of the task (digits, ``+-*#?``, space and the letters of ``What is``) plus
special tokens. The pipeline (NFC, Qwen2's split regex, byte-level pre-tokenizer and decoder, a BPE
model without merges) is the one ``Qwen2Tokenizer`` rebuilds from ``tokenizer.json``, so the
tokenizer encodes the same ids whether it is loaded with ``PreTrainedTokenizerFast`` or with
``AutoTokenizer`` (which picks ``Qwen2Tokenizer`` for a Qwen2 config in transformers 5).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
ROLES = ("system", "user", "assistant")
ROLE_TOKENS = tuple(f"<|{r}|>" for r in ROLES)
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS, *ROLE_TOKENS)
CHARS = "0123456789+-*#? Whatis"

# The tool-enabled tokenizer (``build_tokenizer(tools=True)``, the tiny-arith-tool model) appends these after
# the ids above, so every id of the plain tokenizer keeps its meaning: the calculator's call and response
# markers, then the characters a calculator call or an error observation may contain beyond ``CHARS``.
TOOL_CALL, TOOL_CALL_END = "<|tool_call|>", "<|/tool_call|>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<|tool_response|>", "<|/tool_response|>"
TOOL_TOKENS = (TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END)
TOOL_CHARS = "()bcdefgjklmnopqruvwxyz:.,"

# Each message is its role marker followed by its text; an assistant turn ends with EOS, so the
# generation that follows add_generation_prompt is exactly the response.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# Qwen2Tokenizer's pre-tokenizer regex: kept identical so both loaders split text the same way.
_QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _byte_level(ch: str) -> str:
    """The byte-level symbol of one of ``CHARS``: printable ASCII maps to itself, space to 'Ġ'."""
    return "\u0120" if ch == " " else ch


def build_tokenizer(model_max_length: int = 128, tools: bool = False) -> PreTrainedTokenizerFast:
    """Build the character tokenizer (ids: specials first, then ``CHARS`` in order).

    ``tools=True`` appends ``TOOL_TOKENS`` (special: ``skip_special_tokens`` drops them) and ``TOOL_CHARS``
    after those ids; the chat template is the same.
    """
    specials = SPECIAL_TOKENS + (TOOL_TOKENS if tools else ())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab[_byte_level(ch)] = len(vocab)
    if tools:
        for t in TOOL_TOKENS:
            vocab[t] = len(vocab)
        for ch in TOOL_CHARS:
            vocab.setdefault(_byte_level(ch), len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        padding_side="left",
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out: str | os.PathLike) -> None:
    """Save ``tokenizer.json`` + ``tokenizer_config.json`` (with the chat template inside).

    ``tokenizer_class`` is written as ``PreTrainedTokenizerFast`` so that transformers 4.x's
    ``AutoTokenizer`` loads ``tokenizer.json`` as is; the template is kept inline for the same reason.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("backend", None)
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)
