"""The language the labs' widgets and exercise checks speak: English by default, Chinese on request.

    from ppolab.i18n import set_language; set_language("zh")

Every user-visible string of ``ppolab.widgets`` and of the exercise checks goes through :func:`tr`: the
English text is the key, ``ppolab/i18n_zh.json`` maps it to Chinese. A readout that holds numbers is a whole
template, translated before it is filled — ``tr("{label}: pg_clipfrac = {f:.4f} ({n}/{m} tokens)").format(...)`` —
so its Chinese has its own word order and punctuation (``tests/test_zh_terms.py`` renders every template; a
``tr(f"…")`` fails ``tests/test_i18n.py``). A string that is not a key as a whole (an exception's text shown in a
readout) is translated piece by piece: every key found in it as whole words is replaced, longest first.
Config keys and metric names (``clip_ratio``, ``actor/pg_clipfrac``) are never keys, so they stay English.

Torch-free on purpose: the Chinese labs set the language before anything heavy is imported.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["LANGUAGES", "Sign", "get_language", "set_language", "sign_text", "tr", "missing"]

#: The languages :func:`set_language` accepts.
LANGUAGES = ("en", "zh")

_TABLE = Path(__file__).with_name("i18n_zh.json")
_lang = "en"
_missing: set[str] = set()  # English strings asked for in zh that have no entry (tests read it)


def set_language(lang: str) -> None:
    """Switch the widgets and exercise checks built from now on to ``lang`` ("en" or "zh")."""
    global _lang
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}; choose one of {', '.join(map(repr, LANGUAGES))}")
    _lang = lang


def get_language() -> str:
    """The current language, "en" or "zh"."""
    return _lang


@lru_cache(maxsize=1)
def _zh() -> dict[str, str]:
    return json.loads(_TABLE.read_text(encoding="utf-8"))


# A key that starts (ends) with a letter only matches where no identifier character, '/', '.' or '-' is next to
# it: "ratio" is translated in "ratio = 1.2" but not inside clip_ratio, actor/ratio or log-ratio.
_EDGE = r"A-Za-z0-9_/.\-"


@lru_cache(maxsize=1)
def _pieces() -> re.Pattern:
    before, after = f"(?<![{_EDGE}])", f"(?![{_EDGE}])"
    parts = [(before if k[0].isalpha() else "") + re.escape(k) + (after if k[-1].isalpha() else "")
             for k in sorted(_zh(), key=len, reverse=True) if k]
    return re.compile("|".join(parts))


def tr(text: str, *, may_stay: bool = False) -> str:
    """``text`` in the current language: unchanged in English; in Chinese its table entry, else ``text`` with
    every key found in it replaced (see the module docstring). A string in which nothing was found is returned
    unchanged and remembered in :func:`missing` — unless ``may_stay``: a text that may hold no prose at all
    (a formula of config keys and numbers, some of which carry a few words)."""
    if _lang == "en" or not text:
        return text
    table = _zh()
    if text in table:
        return table[text]
    out = _pieces().sub(lambda m: table[m.group(0)], text) if table else text
    if out == text and not may_stay:
        _missing.add(text)
    return out


def missing() -> set[str]:
    """The English strings :func:`tr` was asked to translate into Chinese and could not (a copy)."""
    return set(_missing)


class Sign(str):
    """A line of English filled from a template (a ``str``: what tests and exercises compare) that keeps the
    template and its fields, so :func:`sign_text` can show it as one whole sentence in the current language — the
    warning signs of ``ppolab.numbers.metrics.warning_signs`` and ``ppolab.rewards.reward_warning_signs``."""

    template: str
    fields: dict[str, Any]

    def __new__(cls, template: str, **fields: Any) -> Sign:
        line = super().__new__(cls, template.format(**fields))
        line.template, line.fields = template, fields
        return line

    def __reduce__(self):  # copies rebuild from the template, not from the filled text
        return _sign, (self.template, self.fields)

    def __str__(self) -> str:  # print(sign) and a printed list of signs speak the notebook's language;
        return sign_text(self)  # == and the str value stay the English line

    def __repr__(self) -> str:
        return repr(sign_text(self))


def _sign(template: str, fields: dict[str, Any]) -> Sign:
    return Sign(template, **fields)


def sign_text(line: str) -> str:
    """``line`` in the current language: a :class:`Sign` through its whole template, any other line by :func:`tr`."""
    if isinstance(line, Sign):
        return tr(line.template).format(**line.fields)
    return tr(line)
