"""Configuration fields (the policy's sections) checked by the checker's one type engine
(:mod:`precision_plugin._base.boundary.typecheck`), with one message format:
``<dotted.field>: <what is wrong>; <what is allowed>.``

A field's annotation decides its type (``_mismatch``, as for every checked argument); the words
are the ones a user writing JSON/YAML knows (``true or false``, ``an integer``, ``a number``).
Meaning (ranges, finiteness, int64) is said in the same format by :func:`require_field`.
"""

from __future__ import annotations

import math
import typing
from typing import Any

from precision_plugin._base.boundary.typecheck import _describe, _mismatch, _show
from precision_plugin.errors import PrecisionConfigError

#: Largest value of an int64 (torch's growth_interval and step tracker keep counters there).
INT64_MAX = 2**63 - 1

#: How a field's type reads to someone writing a config file.
_CONFIG_WORDS: dict[Any, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    tuple[str, ...]: "a list of strings such as ['model.layers.*.mlp.down_proj']",
}


def _words(hint: Any) -> str:
    return _CONFIG_WORDS.get(hint) or _describe(hint)


def field_error(where: str, problem: str) -> PrecisionConfigError:
    """The one error of a configuration field: ``<where>: <problem>.``"""
    return PrecisionConfigError(f"{where}: {problem.rstrip('.')}.")


def require_field(ok: bool, where: str, value: Any, allowed: str) -> None:
    """Refuse a value of the right type outside what the field allows."""
    if not ok:
        raise field_error(where, f"{_show(value)} is out of range; allowed: {allowed}")


def check_field(value: Any, hint: Any, where: str) -> Any:
    """``value`` checked against the field annotation ``hint`` by the type engine; returns it as
    the field holds it (an int widened to float for a float field, a list as a tuple for a
    ``tuple[str, ...]`` field, strings stripped). Raises ``PrecisionConfigError`` naming ``where``.
    """
    problem = _mismatch(value, hint)
    if problem is not None:
        path, item, _ = problem
        if typing.get_origin(hint) is typing.Literal and not path:
            choices = ", ".join(repr(a) for a in typing.get_args(hint))
            raise field_error(where, f"{value!r} is not allowed; choose one of {choices}")
        if path:  # an item of a list
            raise field_error(
                where, f"every entry must be a non-empty string, got {_show(item)} in {value!r}"
            )
        raise field_error(where, f"expected {_words(hint)}, got {_show(value)}")
    if hint is int and abs(value) > INT64_MAX:
        raise field_error(
            where,
            f"{_show(value)} does not fit in a 64-bit integer, where torch and DeepSpeed keep it; "
            f"allowed: up to {INT64_MAX}",
        )
    if hint is float:
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise field_error(
                where,
                f"{_show(value)} is not a finite number; pass a finite one (inf/nan would never "
                f"trigger or always trigger what this setting controls)",
            )
        return number
    if typing.get_origin(hint) is tuple:
        blank = [v for v in value if not v.strip()]
        if blank:
            raise field_error(
                where,
                f"every entry must be a non-empty string, got {blank[0]!r} in {list(value)!r}",
            )
        return tuple(v.strip() for v in value)
    return value
