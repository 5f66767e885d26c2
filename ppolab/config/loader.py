"""Load a run config: defaults ← YAML preset ← verl-style ``key=value`` overrides; resolve; validate.

>>> cfg = load_config("grpo_tiny", ["actor_rollout_ref.actor.clip_ratio_low=0.1", "trainer.logger=[console]"])

Paths in the shipped presets are written ``${ppolab_root:}/data/...``: ``ppolab_root`` is an OmegaConf
resolver returning the repository root (the folder holding the ``ppolab`` package), so the presets work from
any working directory. Paths in your own YAML or overrides are used as written (relative to the working
directory); you may use ``${ppolab_root:}`` there too. The trainer, not :func:`validate`, checks that paths
exist.

Semantic checks live in :func:`validate`: errors raise :class:`ConfigError`; legal but usually unintended
combinations come back as notices, which :func:`load_config` emits once each as :class:`ConfigNotice`.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import inspect
import os
import re
import typing
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Union

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ppolab.config.actor import check_loss_agg_mode
from ppolab.config.schema import ConfigError, ConfigNotice, PPOConfig
from ppolab.course import COURSE_ROOT

from ppolab.config.validation import check_config, registry_names  # noqa: F401

PRESET_DIR = Path(__file__).parent / "presets"
_A, _R, _REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
PPOLAB_ROOT = COURSE_ROOT  # the checkout, or the wheel's ppolab/_course (ppolab/course.py)


def _ppolab_root() -> str:
    """``${ppolab_root:}``: the repository root, so shipped presets find ``data/`` from any directory."""
    return str(PPOLAB_ROOT)


# OmegaConf 2.4 renamed register_new_resolver to register_resolver (the old name warns); in 2.3
# register_resolver is the legacy API without ``replace``. Pick by signature, not by name.
_register = OmegaConf.register_resolver
if "replace" not in inspect.signature(_register).parameters:
    _register = OmegaConf.register_new_resolver
_register("ppolab_root", _ppolab_root, replace=True)

Overrides = Union[str, list[str], tuple[str, ...], Mapping[str, Any], None]


# ------------------------------------------------------------------------------------- schema introspection


@functools.cache
def _schema() -> tuple[dict[str, Any], frozenset[str]]:
    """(dotted leaf key → type hint, set of dotted group keys), walked from the dataclass tree once."""
    leaves: dict[str, Any] = {}
    groups: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key, tp = prefix + f.name, hints[f.name]
            if dataclasses.is_dataclass(tp):
                groups.add(key)
                walk(tp, key + ".")
            else:
                leaves[key] = tp

    walk(PPOConfig, "")
    return leaves, frozenset(groups)


def valid_keys() -> list[str]:
    """Every dotted leaf key of the config tree, sorted (what overrides and YAML files may set)."""
    return sorted(_schema()[0])


def _type_name(tp: Any) -> str:
    """A short human name of a field's type for error messages: int, float or null, list[str], ..."""
    if tp is Any:
        return "any value"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_type_name(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


#: verl keys that V1 never hands an engine, so ppolab has no field for them: the reason, instead of a guess.
_UNWIRED_VERL_KEYS = {
    "critic.ppo_infer_micro_batch_size_per_gpu": "verl's CriticConfig has it, but the V1 trainer does not pass it to "
    "the critic engine (chapter §11.6), which micro-batches by critic.ppo_infer_max_token_len_per_gpu: set that",
    "critic.forward_micro_batch_size_per_gpu": "a field of verl's legacy critic path, which V1 does not read "
    "(chapter §11.6); the critic engine micro-batches by critic.ppo_infer_max_token_len_per_gpu: set that",
}


def _suggest(key: str) -> str:
    """' — did you mean a.b.c?' for an unknown key: same field name elsewhere first, then close spellings."""
    if key in _UNWIRED_VERL_KEYS:
        return f": {_UNWIRED_VERL_KEYS[key]}"
    leaves = valid_keys()
    last = key.rsplit(".", 1)[-1]
    same_name = [k for k in leaves if k.rsplit(".", 1)[-1] == last]
    close = difflib.get_close_matches(key, leaves, n=3, cutoff=0.6)
    picks = list(dict.fromkeys(same_name + close))[:3]
    return f"; did you mean {' or '.join(picks)}?" if picks else "; see ppolab.config.valid_keys()"


# ------------------------------------------------------------------------------------ sources → nested dict


def _parse_override(item: str) -> tuple[str, Any]:
    """'a.b=value' → ('a.b', parsed value) with OmegaConf's YAML grammar (1e-3 is a float, [x,y] a list)."""
    if isinstance(item, str) and item.strip().startswith("~"):
        raise ConfigError(f"override {item!r}: deleting keys (~key) is not supported; set the field instead")
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, value = item.split("=", 1)
    body = key.strip().lstrip("+")
    op = key.strip()[: len(key.strip()) - len(body)]
    if len(op) > 2:
        raise ConfigError(f"override {item!r}: {op} is not an override prefix (Hydra's are +, ++ and ~); write "
                          f"{body}={value}")
    return body, parse_value(value, item)


def check_plus_overrides(overrides: Iterable[Any]) -> None:
    """:class:`ConfigError`, in the doctor's words, for ``+key=value`` of a key verl's config already holds: Hydra
    refuses that ``+`` on verl's command line, so ``ppolab train`` does not drop it unseen. (What-ifs on a recorded
    config, :func:`override_tree`, take any ``+``.)"""
    for item in overrides:
        key, eq, value = item.partition("=") if isinstance(item, str) else ("", "", "")
        key = key.strip()
        if eq and key.startswith("+") and not key.startswith("++") and key[1:] in _verl_job_keys():
            raise ConfigError(f"override {item!r}: {key[1:]} is already in verl's config; write {key[1:]}={value} "
                              "to change it (Hydra's + only adds a key the job lacks)")


@functools.cache
def _verl_job_keys() -> frozenset[str]:
    """The dotted keys of a composed verl config (the doctor's shipped example job): where Hydra's ``+key=`` is an
    error, as the doctor says. Every key is in ppolab's schema, so ``+`` matters only for what verl lacks
    (``+critic.ppo_infer_max_token_len_per_gpu``); without the example (a trimmed install) no ``+`` is refused."""
    from ppolab.course import DATA
    from ppolab.config.yaml_file import load_yaml

    path = DATA / "verl_jobs" / "ppo_fire_tiny" / ".hydra" / "config.yaml"
    if not path.is_file():
        return frozenset()
    tree = OmegaConf.to_container(load_yaml(path, ConfigError), resolve=False)
    keys, todo = set(), [("", tree)]
    while todo:
        prefix, node = todo.pop()
        for k, v in node.items():
            keys.add(prefix + str(k))
            if isinstance(v, dict):
                todo.append((f"{prefix}{k}.", v))
    return frozenset(keys)


def parse_value(value: str, override: str | None = None) -> Any:
    """OmegaConf's YAML reading of an override value; a list YAML cannot read ([${x:}/a]) is split by hand. A value
    nested thousands deep or an int of 5,000 digits is :class:`ConfigError` naming ``override`` (or the value)."""
    try:
        try:
            return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value}"]), resolve=False)["v"]
        except yaml.YAMLError:
            text = value.strip()
            if text.startswith("[") and text.endswith("]"):
                items = re.split(r",(?![^{]*\})", text[1:-1])
                return [parse_value(item, override or value) for item in items if item.strip()]
            return text
    except ConfigError:
        raise
    except (RecursionError, ValueError) as e:  # OmegaConf's recursive reading; int()'s digit limit
        why = "nests too deep" if isinstance(e, RecursionError) else str(e).split(";")[0]
        raise ConfigError(f"override {(override or value)[:80]!r}: its value cannot be read ({why}); a config "
                          "value is a number, a string or a short list") from None


def _set(tree: dict, key: str, value: Any) -> dict:
    """Put ``value`` at dotted ``key`` of the nested dict ``tree`` (creating parents); returns ``tree``."""
    node = tree
    *parents, last = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return tree


def _insert(tree: dict, key: str, value: Any, source: str) -> None:
    """Check ``key`` against the schema and put ``value`` into ``tree`` (dicts given to groups recurse)."""
    leaves, groups = _schema()
    if key in groups:
        if value is None:  # an empty YAML block ("critic:" with everything commented out)
            return
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: {key} is a group of fields, not a value; set one of its fields, "
                              f"e.g. {next(k for k in valid_keys() if k.startswith(key + '.'))}=...")
        for sub, v in value.items():
            _insert(tree, f"{key}.{sub}", v, source)
        return
    if key not in leaves:
        if isinstance(value, Mapping) and value:  # report the first full key the user wrote
            sub, v = next(iter(value.items()))
            return _insert(tree, f"{key}.{sub}", v, source)
        raise ConfigError(f"{source}: unknown config key {key}{_suggest(key)}")
    if typing.get_origin(leaves[key]) is list and isinstance(value, str):
        value = [value]  # data.train_files=a.parquet means a one-element list, as in verl
    if not _shape_fits(leaves[key], value):  # OmegaConf would raise a bare TypeError or accept it silently
        raise ConfigError(f"{source}: {key}={value!r} is not valid: expected {_type_name(leaves[key])}")
    _set(tree, key, value)


def _shape_fits(tp: Any, value: Any) -> bool:
    """Whether ``value``'s container shape fits the type hint ``tp``: no mapping for a list or scalar, no
    nested list or mapping inside a list of scalars (the types of scalars are OmegaConf's to check)."""
    if tp is Any or value is None or isinstance(value, str) and value.startswith("${"):
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        return any(_shape_fits(a, value) for a in args if a is not type(None))
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and Ellipsis not in args and len(value) != len(args):
            return False  # OmegaConf 2.4 checks a fixed tuple's length itself, 2.3 (what Hydra 1.3 pins) does not
        inner = [a for a in args if a is not Ellipsis]
        return all(_shape_fits(inner[0] if origin is list or len(inner) == 1 else inner[min(i, len(inner) - 1)], v)
                   for i, v in enumerate(value)) if inner else True
    if origin in (dict, Mapping) or tp in (dict,):
        return isinstance(value, Mapping)
    return not isinstance(value, (Mapping, list, tuple))


def to_tree(source: str, data: Union[Mapping, Iterable[str]]) -> dict:
    tree: dict = {}
    pairs = data.items() if isinstance(data, Mapping) else (_parse_override(s) for s in data)
    for key, value in pairs:
        _insert(tree, str(key), value, source)
    return tree


def override_tree(overrides: Iterable[str]) -> dict:
    """``["a.b=1", …]`` as the nested dict ``ppolab train`` reads from its command line: each value in OmegaConf's YAML
    grammar, each key checked against the schema (an unknown key is :class:`ConfigError` naming its nearest valid
    key; no ``=``, or ``~key``, is one line too). The one parser of overrides: what-ifs on a recorded config use it."""
    return to_tree("override", [overrides] if isinstance(overrides, str) else list(overrides))


def merge_tree(base: dict, extra: Mapping) -> dict:
    """``base`` with every leaf of ``extra`` (a nested dict, e.g. :func:`override_tree`'s) set into it, in place."""
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge_tree(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _lookup(tree: dict, key: str) -> Any:
    node: Any = tree
    for part in re.sub(r"\[\d+\]", "", key).split("."):
        if not isinstance(node, Mapping) or part not in node:
            return "?"
        node = node[part]
    return node


def _flat(tree: dict, prefix: str = "") -> list[str]:
    """Dotted leaf keys present in a nested tree built by :func:`_insert`."""
    groups = _schema()[1]
    out = []
    for k, v in tree.items():
        key = prefix + k
        out.extend(_flat(v, key + ".") if key in groups else [key])
    return out


def _merges(base: Any, key: str, value: Any) -> bool:
    """Whether setting the single leaf ``key`` to ``value`` merges cleanly into ``base``."""
    try:
        OmegaConf.merge(base, OmegaConf.create(_set({}, key, value)))
    except (OmegaConfBaseException, TypeError):
        return False
    return True


def compose(sources: list[tuple[str, dict]]) -> PPOConfig:
    """Merge nested dicts over the structured defaults in order; wrap OmegaConf errors as ConfigError."""
    from ppolab.config.yaml_file import check_interpolations

    merged = OmegaConf.structured(PPOConfig)
    leaves, _ = _schema()
    for source, tree in sources:
        # a recorded config.json or an override is resolved here too: bound its ${…} as load_yaml bounds a file's
        check_interpolations(tree, lambda m: ConfigError(f"{source}: {m}"))
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(tree))
        except (OmegaConfBaseException, TypeError) as e:  # TypeError: incompatible container types
            key = re.sub(r"\[\d+\]$", "", str(getattr(e, "full_key", "") or ""))
            if key not in leaves:  # some errors (tuple length) carry no key: find the leaf that fails alone
                key = next((k for k in _flat(tree) if not _merges(merged, k, _lookup(tree, k))), key)
            if key in leaves:
                expected = _type_name(leaves[key])
                if leaves[key] is Any:  # a free-form field: say what kind of value it holds now
                    now = OmegaConf.select(merged, key)
                    now = OmegaConf.to_container(now) if OmegaConf.is_config(now) else now
                    expected = f"a value like its current {now!r}"
                raise ConfigError(f"{source}: {key}={_lookup(tree, key)!r} is not valid: expected "
                                  f"{expected}") from None
            raise ConfigError(f"{source}: {e}") from None
    try:
        # ActorConfig checks loss_agg_mode in __post_init__; check first so the message has the full key.
        check_loss_agg_mode(merged.actor_rollout_ref.actor.loss_agg_mode, f"{_A}.loss_agg_mode")
        cfg = OmegaConf.to_object(merged)
    except (ValueError, OmegaConfBaseException) as e:
        raise ConfigError(str(e)) from None
    assert isinstance(cfg, PPOConfig)
    _tuples(cfg)
    return cfg.resolve()


def _tuples(cfg: PPOConfig) -> None:
    """Turn the lists OmegaConf 2.3 leaves in tuple-typed fields (``optim.betas``) into tuples, as 2.4 does: the same
    config whichever OmegaConf a verl environment (Hydra 1.3 pins < 2.4) brings."""
    for key, tp in _schema()[0].items():
        kinds = typing.get_args(tp) if typing.get_origin(tp) is Union else (tp,)
        if not any(typing.get_origin(k) is tuple for k in kinds):
            continue
        *parents, leaf = key.split(".")
        node: Any = cfg
        for part in parents:
            node = getattr(node, part, None)
        if isinstance(getattr(node, leaf, None), list):
            setattr(node, leaf, tuple(getattr(node, leaf)))


# ------------------------------------------------------------------------------------------------ public


def list_presets() -> list[str]:
    """Names of the shipped presets (``ppolab/config/presets/*.yaml``)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _preset_file(preset: Union[str, os.PathLike]) -> Path:
    text = os.fspath(preset)
    if isinstance(preset, os.PathLike) or "/" in text or os.sep in text or text.endswith((".yaml", ".yml")):
        path = Path(text).expanduser()
        if not path.exists() and not path.is_symlink():  # a FIFO or /dev/zero exists: load_yaml names it
            raise ConfigError(f"config file {text!r} does not exist")
        return path
    path = PRESET_DIR / f"{text}.yaml"
    if not path.is_file():
        close = difflib.get_close_matches(text, list_presets(), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(f"unknown preset {text!r}{hint} (available: {', '.join(list_presets())}; "
                          "or give a path to a YAML file)")
    return path


def load_config(preset: Union[str, os.PathLike, None] = "grpo_tiny", overrides: Overrides = None,
                world_size: int = 1) -> PPOConfig:
    """Defaults ← preset (shipped name or YAML path) ← overrides (``key=value`` list or nested/dotted dict).

    Returns the resolved dataclass tree after :func:`validate` (for ``world_size`` data-parallel ranks);
    notices are emitted once each as :class:`ConfigNotice` warnings. Raises :class:`ConfigError`.
    """
    sources: list[tuple[str, dict]] = []
    if preset is not None:
        from ppolab.config.yaml_file import foreign_resolvers, load_yaml

        path = _preset_file(preset)
        raw = OmegaConf.to_container(load_yaml(path, ConfigError), resolve=False) or {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{path}: the top level must be a mapping of config groups")
        for key, name in foreign_resolvers(raw, {"ppolab_root", "oc.select", "oc.env"})[:1]:
            # oc.create / oc.decode would parse YAML text when the config resolves, past load_yaml's bounds
            raise ConfigError(f"{path}: {key} calls the resolver ${{{name}:…}}; a config file may call only "
                              "${ppolab_root:}, ${oc.select:…} and ${oc.env:…} — write the value out")
        sources.append((f"preset {path.name}", to_tree(f"preset {path.name}", raw)))
    if overrides:
        if isinstance(overrides, str):
            overrides = [overrides]
        sources.append(("override", to_tree("override", overrides)))
    cfg = compose(sources)
    for notice in dict.fromkeys(validate(cfg, world_size=world_size)):
        warnings.warn(notice, ConfigNotice, stacklevel=2)
    return cfg


def validate(cfg: PPOConfig, world_size: int = 1) -> list[str]:
    """Check ``cfg`` for ``world_size`` data-parallel ranks; raise :class:`ConfigError` listing every problem.

    Does not modify ``cfg`` (inherited critic fields are checked on a resolved copy). Returns notices: legal
    combinations that are usually unintended (both KL paths on, sum-norm without a scale factor, ...).
    """
    try:
        errors, notices = check_config(copy.deepcopy(cfg).resolve(), world_size)
    except TypeError as e:  # a dataclass built by hand with a wrong-typed field
        raise ConfigError(f"a field has the wrong type ({e}); load_config/from_dict check types") from None
    if len(errors) == 1:
        raise ConfigError(errors[0], errors)
    if errors:
        raise ConfigError(f"{len(errors)} config errors:\n  - " + "\n  - ".join(errors), errors)
    return notices


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def to_dict(cfg: PPOConfig) -> dict:
    """The config as plain nested dicts/lists/scalars (JSON-able), e.g. for a run record."""
    return _plain(cfg)


def from_dict(d: Mapping[str, Any]) -> PPOConfig:
    """Rebuild a config from :func:`to_dict` output (keys and types checked, resolved, not validated).

    Not validated so that a recorded run stays loadable after validation rules tighten.
    """
    return compose([("dict", to_tree("dict", d))])


def to_yaml(cfg: PPOConfig) -> str:
    """The full config as YAML (block style, schema order)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)
