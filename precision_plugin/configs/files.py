"""Reading a config file the way its program parses it, then strictly, naming the file.

YAML is parsed by the program's own loader: OmegaConf's (verl, AReaL: PyYAML's SafeLoader, a
key given twice refused, ``1e-6`` a float) or PyYAML's ``safe_load`` (SGLang, slime); both read
``yes``/``on`` as true (YAML 1.1), and a quoted ``"false"`` as a string. A ``.json`` file is
JSON. Every error names the file: not found, not readable, not UTF-8, not YAML/JSON, nested
too deeply, not a mapping, and then whatever the dialect refuses (``verl:
actor_rollout_ref.rollout.dtpye in ppo.yaml is not a setting verl has (did you mean ...)``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from precision_plugin.boundary import checked
from precision_plugin.configs.reader import Dialect
from precision_plugin.errors import PrecisionConfigError

#: Deeper than this no program's config nests; deeper YAML/JSON is refused, never a
#: RecursionError.
MAX_DEPTH = 64


def _omegaconf_loader() -> Any:
    """The YAML loader of OmegaConf (``omegaconf._utils.get_yaml_loader``, 2.3) when OmegaConf is
    installed, else the same rules: PyYAML's SafeLoader (YAML 1.1 booleans: ``yes``/``on`` are
    true), a key given twice refused, ``1e-6`` a float, no timestamps."""
    try:
        from omegaconf._utils import get_yaml_loader
    except ImportError:
        return replica_loader()
    return get_yaml_loader()


def replica_loader() -> Any:
    """OmegaConf 2.3's YAML loader rebuilt (for where OmegaConf is not installed; the verl
    contract test compares the two)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            keys = set()
            for key_node, _ in node.value:
                if key_node.value in keys:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value}",
                        key_node.start_mark,
                    )
                keys.add(key_node.value)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            r"""^(?:[-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
            |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
            |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
            |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
            |[-+]?\.(?:inf|Inf|INF)
            |\.(?:nan|NaN|NAN))$""",
            re.X,
        ),
        list("-+0123456789."),
    )
    Loader.yaml_implicit_resolvers = {
        key: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for key, resolvers in Loader.yaml_implicit_resolvers.items()
    }
    return Loader


def _depth(data: Any) -> int:
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
            items = node.values() if isinstance(node, dict) else node
            stack.extend((item, depth + 1) for item in items)
    return deepest


def parse_file(path: str | os.PathLike[str], dialect: Dialect) -> Any:
    """The parsed contents of the YAML or JSON file ``path``, by ``dialect``'s program's rules;
    every failure a ``PrecisionConfigError`` naming the file."""
    import yaml

    name = os.fspath(path)
    where = f"{dialect.program}: {name!r}"
    try:
        text = Path(name).expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PrecisionConfigError(
            f"{where} does not exist; pass the config file's path."
        ) from None
    except IsADirectoryError:
        raise PrecisionConfigError(f"{where} is a folder, not a config file.") from None
    except UnicodeDecodeError:
        raise PrecisionConfigError(
            f"{where} is not UTF-8 text; pass the YAML or JSON file."
        ) from None
    except OSError as exc:
        raise PrecisionConfigError(f"{where} cannot be read ({exc.strerror or exc}).") from None
    try:
        if name.endswith(".json"):
            data = json.loads(text)
        elif dialect.style in ("omegaconf", "structured"):
            data = yaml.load(text, Loader=_omegaconf_loader())
        else:
            data = yaml.safe_load(text)
    except RecursionError:
        data = None
        deep = True
    except json.JSONDecodeError as exc:
        raise PrecisionConfigError(
            f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})."
        ) from None
    except yaml.YAMLError as exc:
        raise PrecisionConfigError(
            f"{where} is not valid YAML ({' '.join(str(exc).split())})."
        ) from None
    else:
        deep = _depth(data) > MAX_DEPTH
    if deep:
        raise PrecisionConfigError(
            f"{where} nests deeper than {MAX_DEPTH} levels, which no {dialect.program} config "
            f"does; write it flat."
        )
    if not isinstance(data, dict):
        raise PrecisionConfigError(
            f"{where} holds a {type(data).__name__}, not the mapping of settings a "
            f"{dialect.program} config is."
        )
    return data


@checked
def load(path: str | os.PathLike[str], dialect: Dialect) -> dict[str, Any]:
    """Parse the config file ``path`` as ``dialect``'s program does and read it strictly
    ([`Dialect.read_mapping`][precision_plugin.configs.Dialect.read_mapping], the file named
    in every message); returns the parsed mapping, for the adapter's check."""
    data = parse_file(path, dialect)
    dialect.read_mapping(data, Path(os.fspath(path)).name)
    return data
