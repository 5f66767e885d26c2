"""Every YAML file ppolab reads (``--preset FILE``, a verl job's config for the doctor), read with bounds.

A YAML file can cost far more than its size: a 30 kB "billion laughs" file of nested aliases expands to billions of
nodes, and 10,000 nested ``[`` overflow the recursive composer. :func:`load_yaml` scans the event stream first (the
parser is iterative: deep nesting cannot overflow it), counting the nodes the aliases would expand to and the
nesting depth, and refuses past the bounds in one line naming the file — before OmegaConf builds anything.

Interpolations are OmegaConf's: ``${oc.create:…}`` parses YAML text at resolve time, past these bounds, and a
resolver is code a file names. :func:`foreign_resolvers` lists the resolver calls outside an allow-list, with their
keys, so a reader can refuse them.
"""
from __future__ import annotations

import io
import os
import re
import stat
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

#: ``${name:`` — a resolver call in an interpolation (a node interpolation ``${a.b}`` has no colon).
_RESOLVER = re.compile(r"\$\{\s*([\w.\-]+)\s*:")


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
        return OmegaConf.load(io.StringIO(text))
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        raise error(f"{path} is not valid YAML ({' '.join(str(e).split())[:160]}){tail}") from None


def _check_events(events: Iterable[Any], path: Path, error: Callable[[str], Exception], tail: str) -> None:
    """Walk the parser's events: the running count of nodes once aliases are expanded (an anchored node's size
    is known at its end event; an alias adds it again), and the depth; raise past a bound."""
    import yaml

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
