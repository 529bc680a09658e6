"""The bitwise-equal metric: the share of tokens whose log-probs are equal bit for bit."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from precision_plugin.boundary import checked
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


def _bits(value: float) -> bytes:
    # float32 bits: both sides' log-probs are float32 values carried as Python floats; -0.0 and
    # 0.0 differ here, as they do bit for bit.
    return struct.pack("<f", value)


@checked
def bitwise_equal(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> BitwiseEqual:
    """Count the tokens whose log-probs in ``a`` and ``b`` have the same float32 bits.

    ``a`` and ``b`` hold one list of per-token log-probs per sequence, for the same tokens. A NaN
    equals nothing. This is a strictly stronger check than a zero mean difference.
    """
    if [len(r) for r in a] != [len(r) for r in b]:
        raise PrecisionConfigError(
            f"bitwise_equal(): 'a' and 'b' hold sequences of different lengths "
            f"({[len(r) for r in a][:4]}... vs {[len(r) for r in b][:4]}...); pass the log-probs "
            f"of the same tokens on both sides."
        )
    equal = total = 0
    for ra, rb in zip(a, b, strict=True):
        for x, y in zip(ra, rb, strict=True):
            total += 1
            equal += x == x and _bits(x) == _bits(y)
    return BitwiseEqual(equal, total)
