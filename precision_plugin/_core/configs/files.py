"""Reading a config file the way its program parses it, then strictly, naming the file.

YAML is parsed by the program's own loader: OmegaConf's (verl, AReaL: PyYAML's SafeLoader, a
key given twice refused, ``1e-6`` a float) or PyYAML's ``safe_load`` (SGLang, slime); both read
``yes``/``on`` as true (YAML 1.1), and a quoted ``"false"`` as a string. A ``.json`` file is
JSON. The file is read by the one reader (:mod:`precision_plugin._base.userfiles`), so every error
names the file: not found, not a regular file, too big, not UTF-8 (with the byte's offset),
not YAML/JSON, an alias bomb, nested too deeply, a mapping that contains itself, a list as a
key, not a mapping, and then whatever the dialect refuses (``verl:
actor_rollout_ref.rollout.dtpye in ppo.yaml is not a setting verl has (did you mean ...)``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from precision_plugin._base import userfiles
from precision_plugin._base.boundary import checked
from precision_plugin._core.configs.reader import Dialect
from precision_plugin.errors import PrecisionConfigError


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


def parse_file(path: str | os.PathLike[str], dialect: Dialect) -> Any:
    """The parsed contents of the YAML or JSON file ``path``, by ``dialect``'s program's rules,
    read through the one reader (:mod:`precision_plugin._base.userfiles`: a regular file within the
    size limit, UTF-8, YAML aliases within the node budget, depth and cycles checked); every
    failure a ``PrecisionConfigError`` naming the file."""
    import yaml

    name = os.fspath(path)
    where = f"{dialect.program}:"
    if name.endswith(".json"):
        data = userfiles.read_json(name, where)
    else:
        loader = _omegaconf_loader() if dialect.style in ("omegaconf", "structured") else None
        data = userfiles.read_yaml(name, where, loader or yaml.SafeLoader)
    if not isinstance(data, dict):
        raise PrecisionConfigError(
            f"{where} {userfiles.shown(name)} holds a {type(data).__name__}, not the mapping of "
            f"settings a {dialect.program} config is."
        )
    return data


@checked
def load(path: str | os.PathLike[str], dialect: Dialect) -> dict[str, Any]:
    """Parse the config file ``path`` as ``dialect``'s program does and read it strictly
    ([`Dialect.read_mapping`][precision_plugin._core.configs.Dialect.read_mapping], the file named
    in every message); returns the parsed mapping, for the adapter's check."""
    data = parse_file(path, dialect)
    dialect.read_mapping(data, Path(os.fspath(path)).name)
    return data
