"""The bitwise-equal metric: the share of tokens whose log-probs are equal bit for bit."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from precision_plugin._base.boundary import checked
from precision_plugin._base.boundary.typecheck import _show
from precision_plugin.errors import PrecisionConfigError


@checked
@dataclass(frozen=True)
class BitwiseEqual:
    """``equal`` of ``total`` tokens carry bit-identical log-probs on both sides."""

    equal: int
    total: int

    @property
    def fraction(self) -> float:
        """``equal / total`` (NaN with no token)."""
        return self.equal / self.total if self.total else float("nan")


def _holds_exactly(value: int) -> bool:
    """Whether a float64 holds the integer ``value`` exactly."""
    try:
        return float(value) == value
    except OverflowError:
        return False


def _doubles(row: Sequence[float], side: str, index: int) -> array:
    """``row`` as float64 values; an integer no float64 holds exactly (past 2**53, or past
    float range) is refused, as its bits would be those of another number."""
    for j, v in enumerate(row):
        if isinstance(v, int) and not _holds_exactly(v):
            raise PrecisionConfigError(
                f"bitwise_equal(): {side}[{index}][{j}] is the integer {_show(v)}, which no "
                f"float64 holds exactly, so it has no bits to compare; pass the log-probs as "
                f"floats."
            )
    return array("d", row)


def _words(values: array) -> memoryview:
    """The float64 bit patterns of ``values`` as unsigned 64-bit integers."""
    return memoryview(values).cast("B").cast("Q")


@checked
def bitwise_equal(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> BitwiseEqual:
    """Count the tokens whose log-probs in ``a`` and ``b`` have the same float64 bits.

    ``a`` and ``b`` hold one list of per-token log-probs per sequence, for the same tokens
    (Python floats; a float32 tensor's values, converted with ``tolist()``, are exact, so
    comparing float64 bits compares their float32 bits). A NaN equals nothing, and ``-0.0``
    differs from ``0.0``. This is a strictly stronger check than a zero mean difference.
    """
    if [len(r) for r in a] != [len(r) for r in b]:
        raise PrecisionConfigError(
            f"bitwise_equal(): 'a' and 'b' hold sequences of different lengths "
            f"({[len(r) for r in a][:4]}... vs {[len(r) for r in b][:4]}...); pass the log-probs "
            f"of the same tokens on both sides."
        )
    equal = total = 0
    for i, (ra, rb) in enumerate(zip(a, b, strict=True)):
        xa, xb = _doubles(ra, "a", i), _doubles(rb, "b", i)
        total += len(xa)
        # x == x leaves out NaN, whose bits may match but which equals nothing.
        equal += sum(
            1 for x, p, q in zip(xa, _words(xa), _words(xb), strict=True) if p == q and x == x
        )
    return BitwiseEqual(equal, total)
