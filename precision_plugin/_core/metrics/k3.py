"""One token's k3 term, ``e^d - 1 - d``, safe at any log-ratio (layer 2, pure Python)."""

from __future__ import annotations

import math

__all__ = ["k3_term"]

#: The largest ``d`` whose ``expm1(d)`` is a finite float64 (``log(float max)``).
_LARGEST = math.log(1.7976931348623157e308)


def k3_term(d: float) -> float:
    """``expm1(d) - d`` for a log-ratio ``d`` (``expm1`` keeps a tiny ``d`` exact): ``inf``
    where that overflows a float64 or ``d`` is infinite, instead of ``math.expm1``'s
    ``OverflowError`` (a near-greedy rollout gives log-ratios of thousands of nats)."""
    if math.isinf(d) or d > _LARGEST:
        return math.inf
    return math.expm1(d) - d
