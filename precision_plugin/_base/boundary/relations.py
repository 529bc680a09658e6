"""Checks across parameters (:class:`Relation`), run once each parameter passed its own check:
``lengths`` and ``sums`` of different lengths are one error naming both, not an ``IndexError``
(or a ``zip()`` error) deep inside."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from precision_plugin._base.constraints import Invalid


@dataclass(frozen=True)
class Relation:
    """A check across parameters, run once each of them passed its own check (on the values
    the validators return): ``check(values)`` gets ``{name: value}`` of those passed and not
    ``None`` (two at least) and raises :class:`Invalid` saying how they disagree."""

    params: tuple[str, ...]
    allowed: str
    check: Callable[[dict[str, Any]], None] = field(repr=False)


def _sizes(values: dict[str, Any], size: Callable[[Any], Any]) -> str | None:
    found = {name: size(value) for name, value in values.items()}
    if len(set(found.values())) < 2:
        return None
    return ", ".join(f"{name}: {value}" for name, value in found.items())


def same_length(*params: str, fix: str) -> Relation:
    """``params`` hold as many items each (one per sequence, per field...); ``fix`` is shown."""

    def check(values: dict[str, Any]) -> None:
        differ = _sizes(values, len)
        if differ is not None:
            raise Invalid(f"differ in length ({differ}); {fix}")

    return Relation(params, f"{' and '.join(params)} of the same length", check)


def _row_lengths(value: Any) -> list[int]:
    """The length of each row of a ``(B, T)`` tensor or array, or of nested sequences."""
    if hasattr(value, "ndim") and hasattr(value, "shape"):
        if value.ndim != 2:
            return [int(n) for n in value.shape]
        rows, width = (int(n) for n in value.shape)
        return [width] * rows
    rows = value.tolist() if hasattr(value, "tolist") else value
    return [len(row) if hasattr(row, "__len__") else -1 for row in rows]


def _rows_shown(value: Any, lengths: list[int]) -> str:
    if hasattr(value, "ndim") and hasattr(value, "shape"):
        return f"shape {tuple(int(n) for n in value.shape)}"
    more = ", ..." if len(lengths) > 4 else ""
    return f"{len(lengths)} rows of {', '.join(map(str, lengths[:4]))}{more} tokens"


def same_rows(*params: str, fix: str) -> Relation:
    """``params`` (``(B, T)`` tables, or one sequence of values per row) hold as many rows each,
    each row as long as the others' (the same tokens on every side); ``fix`` is shown."""

    def check(values: dict[str, Any]) -> None:
        lengths = {name: _row_lengths(value) for name, value in values.items()}
        if len({tuple(v) for v in lengths.values()}) > 1:
            differ = "; ".join(
                f"{name}: {_rows_shown(values[name], v)}" for name, v in lengths.items()
            )
            raise Invalid(f"differ in shape ({differ}); {fix}")

    return Relation(params, f"{', '.join(params)} of one shape", check)


def same_shape(*params: str, fix: str) -> Relation:
    """``params`` (tensors, after their validators) have one shape; ``fix`` is shown."""

    def check(values: dict[str, Any]) -> None:
        differ = _sizes(values, lambda value: tuple(value.shape))
        if differ is not None:
            raise Invalid(f"differ in shape ({differ}); {fix}")

    return Relation(params, f"{' and '.join(params)} of one shape", check)
