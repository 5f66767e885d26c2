"""Rule rewards with verl's custom-reward signature.

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

``gsm8k`` follows ``verl/utils/reward_score/gsm8k.py``: ``strict`` takes the last ``#### <number>``
(commas and ``$`` stripped), ``flexible`` the last number anywhere; a found but wrong answer earns
``format_score``, no answer earns 0. ``arith`` is the strict rule, comparing integers; ``arith_tool`` (the
calculator agent task) the same rule on the text after the last tool response. A user's
function is loaded the way verl reads ``custom_reward_function.path`` / ``.name``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

RewardFn = Callable[..., Any]  # returns a float or a dict with a "score" key

_CLIP_CHARS = 300  # verl only searches the last 300 characters (answers come last; long regexes are slow)
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def gsm8k_extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string, or None when there is none."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    text = solution_str[-_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    for candidate in reversed(_NUMBER.findall(text)):
        if candidate not in ("", "."):
            return candidate
    return None


def gsm8k_compute_score(
    solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` if the extracted answer equals ``ground_truth``, ``format_score`` if wrong, 0 if none."""
    answer = gsm8k_extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == ground_truth else format_score


def arith_compute_score(
    solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0
) -> float:
    """The strict ``#### <number>`` rule; ``#### 085`` and ``#### 85`` both match ``"85"``."""
    answer = gsm8k_extract_solution(solution_str, "strict")
    if answer is None:
        return 0.0
    try:
        correct = int(answer) == int(ground_truth)
    except ValueError:  # "8.5", "1.2.3", "-" are answers, just not integers
        correct = answer == ground_truth
    return score if correct else format_score


_TOOL_RESPONSE_END = "<|/tool_response|>"


def arith_tool_compute_score(
    solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0
) -> float:
    """``arith`` on the final answer of a tool-agent trajectory: only the text after the last
    ``<|/tool_response|>`` counts when the markers are there (decoded with special tokens); the trainer decodes
    without them, where the call and observation digits come first and the last ``#### <number>`` still wins."""
    final = solution_str.rsplit(_TOOL_RESPONSE_END, 1)[-1]
    return arith_compute_score(final, ground_truth, format_score, score)


# Namespaces so callers can write ``rewards.gsm8k.compute_score`` like verl's module layout.
gsm8k = SimpleNamespace(extract_solution=gsm8k_extract_solution, compute_score=gsm8k_compute_score)
arith = SimpleNamespace(compute_score=arith_compute_score)
arith_tool = SimpleNamespace(compute_score=arith_tool_compute_score)

_BY_SOURCE: dict[str, Callable[..., float]] = {
    "arith": arith_compute_score,
    "arith_tool": arith_tool_compute_score,
    "openai/gsm8k": gsm8k_compute_score,
    "gsm8k": gsm8k_compute_score,
}


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """The default reward: picks the rule by ``data_source``; ``kwargs`` go to the rule."""
    fn = _BY_SOURCE.get(data_source)
    if fn is None:
        raise NotImplementedError(
            f"no built-in reward for data_source={data_source!r} (known: {sorted(_BY_SOURCE)}); "
            "set custom_reward_function.path to a file defining compute_score"
        )
    return fn(solution_str, ground_truth, **kwargs)


def score_value(result: float | dict) -> float:
    """The scalar score of a reward call: verl's reward functions return a float or a dict with ``"score"``
    (and extra info, which the score does not depend on)."""
    return float(result["score"] if isinstance(result, dict) else result)


def load_custom_reward_fn(path: str | os.PathLike, name: str = "compute_score") -> RewardFn:
    """Load function ``name`` from the Python file at ``path`` (verl's custom_reward_function)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"custom_reward_function.path: reward function file '{path}' not found")
    # One module name per file, so two custom files never replace each other in sys.modules.
    module_name = "ppolab_custom_reward_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"custom_reward_function.path: cannot import '{path}' as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"custom_reward_function.name: reward function '{name}' not found in '{path}'")
    return fn


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def get_reward_fn(custom_reward_function: Any = None) -> RewardFn:
    """The callable for a ``custom_reward_function`` config (dict, OmegaConf node or object).

    No config or an empty ``path`` gives the built-in ``compute_score``; otherwise the user's
    function, called with ``reward_kwargs`` added as verl does.
    """
    path = _cfg_get(custom_reward_function, "path") if custom_reward_function is not None else None
    if not path:
        return compute_score
    fn = load_custom_reward_fn(path, _cfg_get(custom_reward_function, "name") or "compute_score")
    reward_kwargs = dict(_cfg_get(custom_reward_function, "reward_kwargs") or {})
    if not reward_kwargs:
        return fn

    def with_kwargs(*args: Any, **kwargs: Any) -> float | dict[str, Any]:
        return fn(*args, **kwargs, **reward_kwargs)

    return with_kwargs
