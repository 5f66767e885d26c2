"""A verl job's config, read without running anything it names: the file (a Hydra output folder's
``.hydra/config.yaml`` or a verl YAML, bounded by :func:`ppolab.config.yaml_file.load_yaml`), Hydra's overrides, and
verl's own verdict on it — ``utils/config.py::validate_config`` run only on a copy whose every ``_target_`` is one of
verl's config classes (:func:`disarm`). What ``ppolab doctor verl`` (:mod:`ppolab.doctor`) and labs 12 and 16 read.

A config someone sent is data: Hydra's ``instantiate`` calls whatever a ``_target_`` names, and its blocklist stops
only ``os.system``-like names, so ``builtins.open`` with mode ``w`` would truncate a file of the user's.
"""
from __future__ import annotations

import contextlib
import difflib
import importlib.util
import io
import warnings
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from ppolab.errors import FileFormatError, MissingFileError

#: What a verl PPO config holds at its top level (verl 0.9.1 ``trainer/config/ppo_trainer.yaml``).
VERL_GROUPS = ("actor_rollout_ref", "algorithm", "data", "trainer")
EXPECTED = ("a verl PPO config: the .hydra/config.yaml of a verl trainer/main_ppo.py run, or a YAML with its "
            f"groups {', '.join(VERL_GROUPS)}")


def find_config(path: str | Path) -> Path:
    """The verl YAML ``path`` names: the file itself, or the one ``.hydra/config.yaml`` in the folder or up to
    three levels below it (Hydra's ``outputs/<date>/<time>/``, the same file through links counted once); several
    or none is an error naming them."""
    p = Path(path).expanduser()
    if not p.exists():
        raise MissingFileError(f"{p} does not exist; give a verl output folder (with .hydra/config.yaml) or a "
                               "verl YAML")
    if p.is_file():
        return p
    from ppolab.run.files import near_files

    found = near_files(p, ".hydra/config.yaml", depth=4)  # a `latest` link to a job already found is no 2nd job
    if not found:
        raise FileFormatError(f"{p} holds no .hydra/config.yaml within three levels: expected {EXPECTED}")
    if len(found) > 1:
        raise FileFormatError(f"{p} holds {len(found)} verl configs — give one of them: "
                              + ", ".join(str(f.parent.parent) for f in found[:5]) + (" …" if len(found) > 5 else ""))
    return found[0]


def read_verl_config(path: str | Path, overrides: Sequence[str] = ()) -> tuple[dict[str, Any], Path]:
    """(the resolved config as plain dicts, the file read): YAML (bounded: :func:`ppolab.config.yaml_file.load_yaml`),
    then ``overrides`` (Hydra's ``key=value``, ``+key=value``, ``++key=value``, ``~key``: :func:`apply_overrides`),
    then interpolations resolved as Hydra would — with ``oc.select`` the only resolver, the one verl's YAMLs use."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ppolab.config.yaml_file import foreign_resolvers, load_yaml

    f = find_config(path)
    conf = load_yaml(f, FileFormatError, f"expected {EXPECTED}")
    if not OmegaConf.is_dict(conf) or not all(g in conf for g in VERL_GROUPS):
        have = ", ".join(list(conf.keys())[:6]) if OmegaConf.is_dict(conf) else type(conf).__name__
        raise FileFormatError(f"{f} is not a verl PPO config (its top level: {have}): expected {EXPECTED}")
    tree = OmegaConf.to_container(conf, resolve=False)
    tree = apply_overrides(tree, overrides, f)
    for key, name in foreign_resolvers(tree, VERL_RESOLVERS)[:1]:
        raise FileFormatError(f"{f}: {key} calls the resolver ${{{name}:…}}; verl's configs call only "
                              f"{', '.join(sorted(VERL_RESOLVERS))}, and the doctor runs no other — write the value "
                              "out")
    try:
        plain = OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    except OmegaConfBaseException as e:
        raise FileFormatError(f"{f}: {' '.join(str(e).split())[:200]} — fix the override or the interpolation "
                              "it names") from None
    for key, value in _leaves(plain):  # an escaped \${…} comes out as an interpolation verl would resolve again
        if isinstance(value, str) and "${" in value:
            raise FileFormatError(f"{f}: {key}={value[:80]!r} still holds an interpolation once resolved (an escaped "
                                  "\\${…}); verl would resolve it again — write the value out")
    return plain, f


#: The resolvers a verl job's config may call (``${name:…}``): verl 0.9.1's trainer/config YAMLs call only
#: ``oc.select``; node interpolations (``${a.b}``) call none.
VERL_RESOLVERS = frozenset({"oc.select"})


def _leaves(tree: Any, prefix: str = ""):
    """(dotted key, value) of every leaf of plain nested dicts and lists (list items as ``key[i]``), and of every
    dict and list before its items: what a check walks, in the file's order."""
    if isinstance(tree, dict):
        if prefix:
            yield prefix[:-1], tree
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(tree, list):
        if prefix:
            yield prefix[:-1], tree
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{prefix[:-1]}[{i}].")
    else:
        yield prefix[:-1], tree


def _keys(tree: Any) -> list[str]:
    """Every dotted key of ``tree`` (groups and leaves, no list items): what an override may name."""
    return [k for k, _ in _leaves(tree) if "[" not in k]


def _free_group(tree: dict[str, Any], key: str) -> bool:
    """Whether ``key``'s parent is a group of ``tree`` that is not one of verl's config dataclasses (no
    ``_target_``): a free mapping such as ``model.override_config``, where Hydra's ``+key`` adds what it likes and
    verl takes it."""
    node: Any = tree
    for part in key.split(".")[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    return "." in key and isinstance(node, dict) and "_target_" not in node


def apply_overrides(tree: dict[str, Any], overrides: Sequence[str], f: Path) -> dict[str, Any]:
    """``tree`` (the job's unresolved config, plain dicts) with Hydra's overrides applied, parsed as ``ppolab train``
    parses them (:func:`ppolab.config.loader.parse_value`): ``key=value`` sets a key of the job or one ppolab
    knows, ``+key=value`` adds a key the job lacks, ``++key=value`` sets or adds, ``~key`` (or ``~key=value``) deletes
    a key of the job. Anything else is :class:`~ppolab.config.ConfigError` in one line naming the override, with the
    nearest key of the job (difflib) — an override is never dropped unseen."""
    import copy

    from ppolab.config import ConfigError
    from ppolab.config.loader import parse_value, valid_keys

    tree = copy.deepcopy(tree)
    ppolab_keys = set(valid_keys())
    for item in overrides:
        if not isinstance(item, str):
            raise ConfigError(f"override {item!r} is not a string: write key=value, e.g. "
                              "actor_rollout_ref.rollout.n=8")
        text = item.strip()
        op = next(p for p in ("++", "+", "~", "") if text.startswith(p))
        body = text[len(op):]
        if "=" not in body and op != "~":
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. actor_rollout_ref.rollout.n=8)")
        key, _, value = body.partition("=")
        key = key.strip()
        have = set(_keys(tree))
        known = have | ppolab_keys
        if not key or key not in known:
            free = op in ("+", "++") and _free_group(tree, key)
            # a free group takes any key, but "+" of one a letter off a key beside it is a typo verl would add and
            # never read (+trainer.total_epoch); "++" adds it all the same, as the way out
            near = _sibling_typo(key, known) if free else difflib.get_close_matches(key, sorted(known), n=1,
                                                                                    cutoff=0.6)
            if not free or op == "+" and near:
                hint = f"did you mean {near[0]}?" if near else f"see the keys of {f.name}"
                anyway = f" (to add {key} all the same, write ++{body.strip()})" if free else ""
                raise ConfigError(f"override {item!r}: {key or '(empty)'} is not a key of {f} nor one ppolab "
                                  f"knows; {hint}{anyway}")
        if op == "+" and key in have:
            raise ConfigError(f"override {item!r}: {key} is already in {f}; write {key}={value} to change it "
                              "(Hydra's + only adds a key the job lacks)")
        if op == "~" and key not in have:
            raise ConfigError(f"override {item!r}: {key} is not in {f}, so there is nothing to delete")
        *parents, last = key.split(".")
        node = tree
        for part in parents:
            if not isinstance(node.get(part, {}), dict):
                raise ConfigError(f"override {item!r}: {part} in {key} is a value in {f}, not a group of keys")
            node = node.setdefault(part, {})
        old = node.get(last)
        group = isinstance(old, dict) and bool(old)
        if op == "~" and ("." not in key or group):
            # verl's trainer reads every top-level key, and its config classes every key of a group
            what, instead = ((f"a group of {len(old)} keys", f"set the keys you mean inside it (e.g. "
                              f"{_a_leaf(old, key)}=…)") if group else ("a top-level key", f"set it ({key}=…)"))
            raise ConfigError(f"override {item!r}: {key} is {what} verl requires, so it cannot be deleted; "
                              f"{instead}")
        if op == "~":
            node.pop(last)
            continue
        new = parse_value(value, item)
        if isinstance(old, dict) and not isinstance(new, dict):
            example = f"{_a_leaf(old, key)}=…" if group else f"+{key}.KEY={value}"
            raise ConfigError(f"override {item!r}: {key} is a group of keys in {f}, and a group cannot be set to "
                              f"a value; set a key inside it (e.g. {example})")
        node[last] = new
    return tree


def _a_leaf(group: dict[str, Any], key: str) -> str:
    """The first plain key under ``group`` (at ``key``) for an example: not a group, not Hydra's ``_target_``."""
    return next((k for k, v in _leaves(group, f"{key}.") if not isinstance(v, (dict, list))
                 and not k.rsplit(".", 1)[-1].startswith("_")), f"{key}.…")


def _sibling_typo(key: str, known: set[str]) -> list[str]:
    """The key beside ``key`` (same group) whose last name is a letter or two off ``key``'s, if any: ``+key`` of it
    in a free group is a typo, not a new key (difflib, a tighter cutoff than a full key's: a free group's new keys
    may well resemble its others)."""
    parent, _, name = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == parent}
    near = difflib.get_close_matches(name, sorted(siblings), n=1, cutoff=0.8)
    return [siblings[near[0]]] if near else []


#: The ``_target_`` values verl's checks may build: every config dataclass verl 0.9.1's own YAMLs name
#: (``verl/trainer/config/{ppo_trainer,_generated_ppo_*_trainer}.yaml`` and the groups they compose: ``actor/``,
#: ``critic/``, ``ref/``, ``rollout/rollout.yaml``, ``engine/``, ``optim/``, ``model/hf_model.yaml``,
#: ``profiler/profiler.yaml``, ``reward/reward.yaml``, ``distillation/distillation.yaml``), exactly — a prefix such
#: as ``verl.`` would let ``verl.utils.fs.copy`` through. Hydra's ``instantiate`` calls whatever it names, and its
#: blocklist stops only ``os.system``-like names: ``builtins.open`` with mode ``w`` truncates a file.
VERL_CONFIG_CLASSES = frozenset(
    [f"verl.trainer.config.{c}" for c in ("AlgoConfig", "CheckpointConfig", "FilterGroupsConfig",
                                          "HybridRolloutSwitchConfig", "KLControlConfig", "config.ModuleConfig")]
    + ["verl.utils.profiler.ProfilerConfig", "verl.utils.skip.SkipManagerConfig"]
    + [f"verl.utils.profiler.config.{c}" for c in ("NPUToolConfig", "NsightToolConfig", "PrecisionDebuggerToolConfig",
                                                   "TorchMemoryToolConfig", "TorchProfilerScheduleConfig",
                                                   "TorchProfilerToolConfig")]
    + ["verl.workers.config.reward.RewardManagerConfig"]
    + [f"verl.workers.config.{c}" for c in (
        "ActorConfig", "AgentLoopConfig", "AutomodelEngineConfig", "AutomodelOptimizerConfig",
        "CheckpointEngineConfig", "CriticConfig", "CustomAsyncServerConfig", "DistillationConfig",
        "DistillationLossConfig", "DistillationTeacherModelConfig", "EngineRouterReplayConfig", "FSDPActorConfig",
        "FSDPCriticConfig", "FSDPEngineConfig", "FSDPOptimizerConfig", "HFModelConfig", "McoreActorConfig",
        "McoreCheckpointConfig", "McoreCriticConfig", "McoreEngineConfig", "McoreOptimizerConfig", "MtpConfig",
        "MultiTurnConfig", "PolicyLossConfig", "PrometheusConfig", "QATEngineConfig", "RewardConfig",
        "RewardModelConfig", "RolloutConfig", "SamplingConfig", "SandboxFusionConfig", "TorchTitanActorConfig",
        "TorchTitanCriticConfig", "TorchtitanEngineConfig", "TorchtitanOptimizerConfig", "TraceConfig",
        "VeOmniActorConfig", "VeOmniCriticConfig", "VeOmniEngineConfig", "VeOmniOptimizerConfig")])
#: Hydra's other instantiate keys: verl's YAMLs use none; ``_args_`` and ``_partial_`` reshape what is called.
HYDRA_KEYS = ("_args_", "_partial_", "_recursive_", "_convert_")
#: Fields whose value makes verl's config dataclasses run code or write files as they are built
#: (``workers/config/model.py::HFModelConfig.__post_init__``: ``import_external_libs(external_lib)``,
#: ``trust_remote_code`` for the model folder's own Python, ``use_shm`` copies the model to /dev/shm): what the
#: copy handed to verl holds instead. The checks the doctor quotes do not read them.
DISARMED = {"external_lib": None, "trust_remote_code": False, "use_shm": False}


def disarm(raw: dict[str, Any]) -> tuple[list[str], list[str], dict[str, Any]]:
    """(what in ``raw`` names code verl's checks would run — one line each, and then verl's checks are not run;
    the fields :data:`DISARMED` changed — one line each; the copy verl's checks may be given). Refused: a
    ``_target_`` that is not one of :data:`VERL_CONFIG_CLASSES`, Hydra's ``_args_``/``_partial_``/…, and an
    ``hdfs://`` path (``utils/fs.py::copy_to_local`` copies it with a shell command, ``utils/hdfs_io.py``)."""
    import copy

    refused, changed = [], []
    safe = copy.deepcopy(raw)
    for key, value in _leaves(safe):
        name = key.rsplit(".", 1)[-1]
        if name == "_target_" and (not isinstance(value, str) or value not in VERL_CONFIG_CLASSES):
            refused.append(f"{key} = {value!r}: not one of verl's config classes — verl's checks would call it")
        elif name in HYDRA_KEYS:
            refused.append(f"{key} = {value!r}: Hydra's {name}, which verl's configs never use, changes what "
                           "verl's checks would call")
        elif isinstance(value, str) and value.startswith("hdfs://"):
            refused.append(f"{key} = {value!r}: verl's checks would copy it with a shell command (hdfs dfs)")
        elif isinstance(value, dict):
            for field, harmless in DISARMED.items():
                if value.get(field) not in (None, harmless):
                    changed.append(f"{key}.{field} = {value[field]!r}: read as {harmless!r} by verl's checks here "
                                   "(the doctor runs no code a config names)")
                    value[field] = harmless
    return refused, changed, safe


def _innermost(e: BaseException) -> BaseException:
    """The exception a wrapper was raised from (Hydra's ``InstantiationException`` wraps the config dataclass's own
    ``__post_init__`` error), so the quote is verl's sentence, not Hydra's."""
    seen = {id(e)}
    while e.__cause__ is not None and id(e.__cause__) not in seen:
        e = e.__cause__
        seen.add(id(e))
    return e


def _while_importing(e: BaseException) -> bool:
    """Whether ``e`` (or what it wraps) was raised by a module's top-level code — an import on the way, such as
    ``validate_config`` importing verl's vLLM helpers where vLLM is not installed: the machine's doing, not the
    config's. verl's checks themselves run in functions."""
    while e is not None:
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_name == "<module>":
                return True
            tb = tb.tb_next
        e = e.__cause__ or e.__context__
    return False


#: The environment that keeps Hugging Face's libraries off the network (huggingface_hub, transformers, datasets).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@contextlib.contextmanager
def offline():
    """The body runs with Hugging Face's hub off: :data:`OFFLINE_ENV` set, and huggingface_hub's flag (read once at
    its import, so imported first) switched on; both put back afterwards. A model id that is not a folder here then
    fails at once instead of being fetched."""
    import os

    from huggingface_hub import constants

    saved_env = {k: os.environ.get(k) for k in OFFLINE_ENV}
    saved_flag = constants.HF_HUB_OFFLINE
    os.environ.update(OFFLINE_ENV)
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved_flag
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _not_here(raw: dict[str, Any], use_critic: bool) -> str | None:
    """The first model path verl's ``validate_config`` would load that is not a folder on this machine: the critic's
    (``critic_config = omega_conf_to_dataclass(config.critic)`` builds its HFModelConfig, which reads the model's
    config.json), or None."""
    if not use_critic:
        return None
    model = (raw.get("critic") or {}).get("model") or {}
    for key in ("path", "tokenizer_path"):
        value = model.get(key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_dir():
            return (f"critic.model.{key} = {value!r} is not a folder on this machine: verl's check loads that model's "
                    "config, and the doctor fetches nothing (copy the model here and point the key at it)")
    return None


def verl_verdict(raw: dict[str, Any]) -> tuple[str, str | None] | None:
    """verl's own verdict on ``raw`` where verl is importable here, else None: ``(version, stop)`` with ``stop``
    None when verl 0.9.1's ``utils/config.py::validate_config`` passes, else its exception in verl's words —
    called as ``trainer/main_ppo.py`` calls it, with ``use_reference_policy`` and ``use_critic`` from
    ``trainer/ppo/utils.py::need_reference_policy`` / ``need_critic``. A config whose check cannot run here (the
    critic's model folder is loaded by ``HFModelConfig`` and is not on this machine; a LoRA rollout on vLLM imports
    verl's vLLM helpers, which need vLLM) gives ``stop`` starting ``"could not run: "`` — a critic named by a hub
id among them: verl is never asked to fetch it, and runs with the hub off (:func:`offline`); a config that names code
    verl would run (:func:`disarm`) gives ``"not run: "`` and verl never sees it. What verl prints on the way (its
    NOTICE and success lines) is not passed on."""
    if importlib.util.find_spec("verl") is None:
        return None
    refused, _, raw = disarm(raw)
    if refused:  # the caller's report names each (diagnose); verl is not even imported
        return "?", f"not run: {refused[0]}"
    from omegaconf import OmegaConf

    sink, version = io.StringIO(), "?"  # "?" until verl itself is imported (an import can fail first)
    try:
        with contextlib.redirect_stdout(sink), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import verl
            from verl.trainer.ppo.utils import need_critic, need_reference_policy
            from verl.utils.config import validate_config

            version = str(getattr(verl, "__version__", "?"))
            conf = OmegaConf.create(raw)
            use_critic = need_critic(conf)
            missing = _not_here(raw, use_critic)
            if missing:
                return version, f"could not run: {missing}"
            with offline():  # whatever else a check loads comes from this machine or fails
                validate_config(conf, use_reference_policy=need_reference_policy(conf), use_critic=use_critic)
    except ImportError as e:  # verl's package is here but not its dependencies (ray, tensordict, …)
        return version, f"could not run: {type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 — verl's checks raise AssertionError and ValueError; anything else is named
        inner = _innermost(e)
        if isinstance(inner, OSError) or _while_importing(e):
            return version, f"could not run: {type(inner).__name__}: {' '.join(str(inner).split())[:200]}"
        return version, f"{type(inner).__name__}: {' '.join(str(inner).split())[:400]}"
    return version, None


class DataParallel(NamedTuple):
    """A role's data-parallel layout in a verl job: ``world`` GPUs (``trainer.n_gpus_per_node × nnodes``), ``dp``
    data-parallel ranks — what the chapter's §11.4 divides a mini-batch by — and ``group``, the model-parallel sizes
    it is divided by (``"Ulysses SP 4"``, ``"TP 8 × PP 12"``; empty: none). ``source`` is the keys read (or, for an
    engine whose sizes ppolab does not read, its name); ``error`` is set where verl cannot lay the job out (``world``
    not a multiple of the group; ``dp`` is then ``world``, so that the arithmetic still shows something);
    ``strategy`` is the role's engine (``fsdp``, ``fsdp2``, ``megatron``, …)."""
    world: int
    dp: int
    group: str = ""
    source: str = ""
    error: bool = False
    strategy: str = "fsdp"


def _int(node: Any, key: str, default: int = 1) -> int:
    value = node.get(key, default) if isinstance(node, dict) else default
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def data_parallel(raw: dict[str, Any], role: str = "actor") -> DataParallel:
    """The data-parallel size of ``role`` ("actor" or "critic") as verl 0.9.1's V1 engine computes it — the
    ``dp_size`` ``trainer/ppo/v1/trainer_base.py`` reads from the role's dispatch info to pad and balance the batch
    and the workers divide every mini-batch by:

    * FSDP (``strategy`` fsdp / fsdp2): world // Ulysses SP (``workers/engine/fsdp/transformer_impl.py::
      get_data_parallel_size``), SP from the engine config — ``actor.fsdp_config`` / ``critic.fsdp`` — and, for the
      actor, the deprecated ``actor.ulysses_sequence_parallel_size`` when it is > 1 (``workers/config/actor.py::
      FSDPActorConfig.__post_init__`` copies it over);
    * Megatron: world // (TP × PP × CP) — Megatron's data-parallel group (``mpu.get_data_parallel_world_size``;
      expert parallelism splits inside it, as ``utils/config.py::validate_config`` computes ``megatron_dp``), 1
      with ``dynamic_context_parallel`` (``workers/engine/megatron/transformer_impl.py``);
    * another engine (veomni, torchtitan, automodel): the GPU count, with the engine named in ``source``."""
    t = raw.get("trainer") or {}
    world = max(1, _int(t, "n_gpus_per_node")) * max(1, _int(t, "nnodes"))
    prefix = "actor_rollout_ref.actor" if role == "actor" else "critic"
    section = (raw.get("actor_rollout_ref") or {}).get("actor") if role == "actor" else raw.get("critic")
    section = section if isinstance(section, dict) else {}
    strategy = str(section.get("strategy") or "fsdp")
    if strategy in ("fsdp", "fsdp2"):
        key = "fsdp_config" if role == "actor" else "fsdp"
        sizes = [("Ulysses SP", _int(section.get(key), "ulysses_sequence_parallel_size"))]
        source = f"{prefix}.{key}.ulysses_sequence_parallel_size"
        if role == "actor" and _int(section, "ulysses_sequence_parallel_size") > 1:
            sizes, source = ([("Ulysses SP", _int(section, "ulysses_sequence_parallel_size"))],
                             f"{prefix}.ulysses_sequence_parallel_size")
    elif strategy == "megatron":
        m = section.get("megatron") if isinstance(section.get("megatron"), dict) else {}
        if m.get("dynamic_context_parallel"):
            return DataParallel(world, 1, "dynamic CP", f"{prefix}.megatron.dynamic_context_parallel",
                                strategy=strategy)
        sizes = [(name, _int(m, k)) for name, k in (("TP", "tensor_model_parallel_size"),
                                                     ("PP", "pipeline_model_parallel_size"),
                                                     ("CP", "context_parallel_size"))]
        source = f"{prefix}.megatron.*_parallel_size"
    else:
        return DataParallel(world, world, "", strategy, strategy=strategy)
    group = 1
    for _, size in sizes:
        group *= max(1, size)
    shown = " × ".join(f"{name} {size}" for name, size in sizes if size > 1)
    if group == 1:
        return DataParallel(world, world, "", source, strategy=strategy)
    if world % group:
        return DataParallel(world, world, shown, source, error=True, strategy=strategy)
    return DataParallel(world, world // group, shown, source, strategy=strategy)
