"""Reading other programs' configs by dotted path, through mappings and attributes alike.

verl's composed OmegaConf config, AReaL's and OpenRLHF's are read with the same lookup (shared
knowledge of the adapters, so it lives below them). Nothing here imports OmegaConf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: A key that is absent.
MISSING: Any = object()
#: A mandatory value not set yet (OmegaConf's ``???``).
UNSET: Any = object()


def lookup(cfg: Any, path: str, default: Any = None) -> Any:
    """``cfg``'s value at dotted ``path``, through mappings and attributes alike, or ``default``.

    A missing key, a ``None`` on the way, an unresolvable interpolation or a mandatory ``???``
    value all count as absent.
    """
    node = cfg
    for part in path.split("."):
        if node is None:
            return default
        try:
            if isinstance(node, Mapping):
                node = node.get(part, MISSING)
            else:
                node = getattr(node, part, MISSING)
        except Exception:  # OmegaConf: missing mandatory value, bad interpolation
            return default
        if node is MISSING:
            return default
    return node


def raw_value(cfg: Any, path: str) -> Any:
    """The value at ``path``: ``MISSING`` when absent, ``UNSET`` when it is a mandatory value
    not set yet (``???``, which OmegaConf raises on when read)."""
    node = cfg
    for part in path.split("."):
        if node is None:
            return MISSING
        try:
            node = (
                node.get(part, MISSING)
                if isinstance(node, Mapping)
                else getattr(node, part, MISSING)
            )
        except Exception as exc:  # OmegaConf: MissingMandatoryValue, a bad interpolation
            return UNSET if type(exc).__name__ == "MissingMandatoryValue" else MISSING
        if node is MISSING:
            return MISSING
    return UNSET if node == "???" else node


def vars_of(obj: Any) -> dict[str, Any]:
    """An object's attributes (a verl config dataclass's fields), ``{}`` for other objects."""
    try:
        return dict(vars(obj))
    except TypeError:
        return {}
