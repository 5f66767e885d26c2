"""Every YAML file ppolab reads (``--preset FILE``, a verl job's config for the doctor), read with bounds.

A YAML file can cost far more than its size: a 30 kB "billion laughs" file of nested aliases expands to billions of
nodes, and 10,000 nested ``[`` overflow the recursive composer. :func:`load_yaml` scans the event stream first (the
parser is iterative: deep nesting cannot overflow it), counting the nodes the aliases would expand to and the
nesting depth, and refuses past the bounds in one line naming the file — before OmegaConf builds anything.

Interpolations are OmegaConf's: ``${oc.create:…}`` parses YAML text at resolve time, past these bounds, and a
resolver is code a file names. :func:`foreign_resolvers` lists the resolver calls outside an allow-list, with their
keys, so a reader can refuse them. Node interpolations cost too: OmegaConf resolves ``${a}`` afresh at each use, so
ten levels of ten ``${…}`` each in a 4 kB file ask for 10^10 copies; :func:`check_interpolations` counts them on the
unresolved tree (memoised, so the count itself is cheap) and :func:`load_yaml` refuses a file past its bounds.
"""
from __future__ import annotations

import io
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

#: Bytes a YAML file may hold: a verl Hydra output config is ~30 kB, a ppolab preset under 5 kB.
MAX_BYTES = 16 * 2**20
#: Nodes the file may hold once its aliases are expanded: a composed verl 0.9.1 config has ~2,000 (Hydra's output
#: config has no aliases at all); a billion-laughs file asks for 10^9.
MAX_NODES = 1_000_000
#: Nesting depth of mappings and sequences: verl's deepest key is 6 levels; OmegaConf's recursive construction
#: overflows Python's stack near a few hundred.
MAX_DEPTH = 64

#: ``${…}`` references a config value may expand at resolve time, counted through what each names (OmegaConf
#: resolves a reference afresh at each use, so 10 references to a value of 10 references cost 100): verl 0.9.1's
#: composed config makes ~100 in all, each 1–2 deep; ten levels of ten references each ask for 10^10.
MAX_INTERPOLATIONS = 10_000
#: References chained through one another (a → b → c …): OmegaConf's recursive resolution overflows Python's stack
#: near a few hundred; verl's chains are 2 long.
MAX_CHAIN = 64

#: ``${name:`` — a resolver call in an interpolation (a node interpolation ``${a.b}`` has no colon).
_RESOLVER = re.compile(r"\$\{\s*([\w.\-]+)\s*:")
#: Each ``${``, with the resolver it calls (if any) and the key that follows (up to what a key cannot hold).
_REFERENCE = re.compile(r"\$\{\s*(?:([\w.\-]+)\s*:)?\s*([^\s,{}$:\\'\"]*)(\$?)")


def load_yaml(path: str | os.PathLike, error: Callable[[str], Exception], todo: str = "") -> Any:
    """The OmegaConf container of the YAML file ``path`` (``OmegaConf.load``'s reading), once the file is a regular
    file of at most :data:`MAX_BYTES`, parses, and expands to at most :data:`MAX_NODES` nodes within
    :data:`MAX_DEPTH` levels; otherwise ``error(message)`` is raised, its message naming the file, what is wrong and
    ``todo`` (appended after a colon)."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    tail = f": {todo}" if todo else ""
    try:
        st = path.stat()
    except OSError as e:
        raise error(f"{path} cannot be read ({e.strerror}){tail}") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block, /dev/zero never ends
        raise error(f"{path} is not a regular file (a folder, device, pipe or socket){tail}") from None
    if st.st_size > MAX_BYTES:
        raise error(f"{path} is {st.st_size / 2**20:.0f} MB, more than the {MAX_BYTES // 2**20} MB a YAML config "
                    f"may hold{tail}") from None
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_BYTES + 1).decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path} cannot be read as UTF-8 text ({' '.join(str(e).split())[:120]}){tail}") from None
    try:
        _check_events(yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)), path, error, tail)
        conf = _load(text)
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        raise error(f"{path} is not valid YAML ({' '.join(str(e).split())[:160]}){tail}") from None
    check_interpolations(OmegaConf.to_container(conf, resolve=False), lambda m: error(f"{path}: {m}{tail}"))
    return conf


def _load(text: str) -> Any:
    """``OmegaConf.load`` of ``text``, its ValueError (``!!int`` of 5,000 digits) a YAMLError for the caller to name."""
    import yaml
    from omegaconf import OmegaConf

    try:
        return OmegaConf.load(io.StringIO(text))
    except ValueError as e:
        raise yaml.YAMLError(str(e)) from None


def _check_events(events: Iterable[Any], path: Path, error: Callable[[str], Exception], tail: str) -> None:
    """Walk the parser's events: the running count of nodes once aliases are expanded (an anchored node's size
    is known at its end event; an alias adds it again), and the depth; raise past a bound."""
    import yaml

    digits = sys.get_int_max_str_digits() or 10**9  # 0: no limit
    sizes: dict[str, int] = {}
    open_nodes: list[list] = []  # [anchor, node count so far] of each open mapping/sequence
    total = 0
    for ev in events:
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            open_nodes.append([ev.anchor, 1])
            total += 1
            if len(open_nodes) > MAX_DEPTH:
                raise error(f"{path} nests more than {MAX_DEPTH} levels deep (line {ev.start_mark.line + 1}); a "
                            f"config is a few levels deep{tail}")
            continue
        if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, n = open_nodes.pop()
        elif isinstance(ev, yaml.ScalarEvent):
            anchor, n = ev.anchor, 1
            total += 1
            if not ev.style and len(ev.value) > digits and re.fullmatch(r"[-+]?[\d_]+", ev.value):
                raise error(f"{path} line {ev.start_mark.line + 1} holds a whole number of {len(ev.value):,} "
                            f"digits, more than Python reads ({digits:,}): no config value is that long{tail}")
        elif isinstance(ev, yaml.AliasEvent):
            anchor, n = None, sizes.get(ev.anchor, 1)
            total += n
        else:
            continue
        if anchor is not None:
            sizes[anchor] = n
        if open_nodes:
            open_nodes[-1][1] += n
        if total > MAX_NODES:
            raise error(f"{path} expands to more than {MAX_NODES:,} nodes through its aliases (*name): a YAML alias "
                        f"bomb, not a config; write the values out{tail}")


def foreign_resolvers(tree: Any, allowed: Iterable[str], prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted key, resolver name)`` of every ``${name:…}`` in the string values of the plain nested ``tree``
    (an unresolved container) whose resolver is not in ``allowed``, in the tree's order."""
    allowed = frozenset(allowed)
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    out = []
    for k, v in items:
        key = f"{prefix}{k}" if isinstance(tree, dict) else f"{prefix[:-1]}[{k}]"
        if isinstance(v, (dict, list)):
            out += foreign_resolvers(v, allowed, key + ".")
        elif isinstance(v, str):
            out += [(key, name) for name in _RESOLVER.findall(v) if name not in allowed]
    return out


def check_interpolations(tree: Any, error: Callable[[str], Exception]) -> None:
    """Raise ``error(message)``, the message naming the dotted key, when the ``${…}`` references in the string values
    of the plain nested ``tree`` (an unresolved container) would expand past :data:`MAX_INTERPOLATIONS` (in one value
    or in all) or :data:`MAX_BYTES` characters in one value, chain past :data:`MAX_CHAIN`, or build a key from another
    interpolation (``${${k}}``: no reading of the file knows its target) — before OmegaConf resolves anything. A
    reference to a mapping or list costs what its values cost; a relative one (``${.x}``, ``${oc.select:..x}``)
    counts from the value's parent, as OmegaConf does; a missing target or a cycle is OmegaConf's to name."""
    memo: dict[tuple, tuple[int, int]] = {}
    active: set[tuple] = set()

    def node(path: tuple) -> Any:
        here: Any = tree
        for part in path:
            if isinstance(here, dict) and part in here:
                here = here[part]
            elif isinstance(here, list) and part.isdigit() and int(part) < len(here):
                here = here[int(part)]
            else:
                return None
        return here

    def cost(path: tuple, value: Any, depth: int) -> tuple[int, int]:
        """(references resolved, characters) of ``value`` at ``path`` once resolved; ``depth``: the frames above."""
        key = ".".join(path)
        if depth > MAX_CHAIN:  # OmegaConf's recursive resolution would overflow the stack
            raise error(f"{key} is reached through interpolations chained more than {MAX_CHAIN} deep: write the "
                        "value out")
        if isinstance(value, (dict, list)):
            refs = size = 0
            for k, v in (value.items() if isinstance(value, dict) else enumerate(value)):
                n, chars = cost(path + (str(k),), v, depth + 1)
                refs, size = refs + n, size + chars
            return refs, size
        if not isinstance(value, str) or "${" not in value:
            return 0, len(str(value))
        if path in memo or path in active:
            return memo.get(path, (0, 0))
        active.add(path)
        refs, size = 0, len(value)
        for m in _REFERENCE.finditer(value):
            resolver, target, dynamic = m.groups()
            if dynamic or (not target and resolver in (None, "oc.select")):
                raise error(f"{key}={value[:80]!r} builds an interpolation's key from another interpolation "
                            "(${${…}}); write the key out")
            refs += 1
            if resolver in (None, "oc.select"):
                up = len(target) - len(target.lstrip("."))  # ${.x}: a sibling; ${..x}: the parent's sibling
                where = (path[:-up] if up else ()) + tuple(re.findall(r"[^.\[\]]+", target))
                n, chars = cost(where, node(where), depth + 1)
                refs, size = refs + n, size + chars
            if refs > MAX_INTERPOLATIONS or size > MAX_BYTES:
                raise error(f"{key} expands to more than {MAX_INTERPOLATIONS:,} ${{…}} references or "
                            f"{MAX_BYTES // 2**20} MB through the values they name (each use a fresh copy): an "
                            "interpolation bomb, not a config; write the values out")
        active.discard(path)
        memo[path] = refs, size
        return refs, size

    total = 0
    for path, value in _strings(tree, ()):
        total += cost(path, value, len(path))[0]
        if total > MAX_INTERPOLATIONS:
            raise error(f"its ${{…}} references expand more than {MAX_INTERPOLATIONS:,} times in all, passing the "
                        f"bound at {'.'.join(path)} (each use a fresh copy of what it names): an interpolation bomb, "
                        "not a config; write the values out")


def _strings(tree: Any, path: tuple):
    """(path, value) of every string leaf of plain nested dicts and lists holding ``${``."""
    if isinstance(tree, (dict, list)):
        for k, v in (tree.items() if isinstance(tree, dict) else enumerate(tree)):
            yield from _strings(v, path + (str(k),))
    elif isinstance(tree, str) and "${" in tree:
        yield path, tree
