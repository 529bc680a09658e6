"""The k3 term of a log-ratio ``d = log π - log μ``, ``e^d - 1 - d``, once (layer 2).

Computed as ``expm1(d) - d`` (``exp(d) - 1`` would lose a tiny ``d`` to rounding), in one
scalar form (``k3_term``) and one tensor form (``k3_terms``) with the same meaning at the edges:
an infinite ``d`` (one side gives probability 0) and a ``d`` whose ``e^d`` overflows the float
give ``inf``; a NaN ``d`` gives NaN. ``capped_k3_term`` is the one finite variant: its
exponent capped at ``EXPM1_CAP``, for sums that must stay finite (the probe's per-sequence k3
that its drift fit takes).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["EXPM1_CAP", "capped_k3_term", "k3_term", "k3_terms"]

#: The largest ``d`` whose ``expm1(d)`` is a finite float64 (``log(float max)``).
_LARGEST = math.log(1.7976931348623157e308)
#: The cap on ``capped_k3_term``'s exponent: inside ``expm1``'s float64 range (``_LARGEST``,
#: 709.78...), with room for a sum of several thousand capped terms to stay finite.
EXPM1_CAP = 700.0


def k3_term(d: float) -> float:
    """``expm1(d) - d`` for a log-ratio ``d`` (``expm1`` keeps a tiny ``d`` exact): ``inf``
    where that overflows a float64 or ``d`` is infinite, instead of ``math.expm1``'s
    ``OverflowError`` (a near-greedy rollout gives log-ratios of thousands of nats); NaN for a
    NaN ``d``."""
    if math.isinf(d) or d > _LARGEST:
        return math.inf
    return math.expm1(d) - d


def capped_k3_term(d: float) -> float:
    """``expm1(min(d, EXPM1_CAP)) - d``: ``k3_term`` up to ``d = EXPM1_CAP``, and finite for
    every finite ``d`` above it (the exponent stops at the cap, ``-d`` does not), so a sum of
    such terms stays finite where the fit that takes it refuses ``inf``."""
    return math.expm1(min(d, EXPM1_CAP)) - d


def k3_terms(d: torch.Tensor) -> torch.Tensor:
    """``k3_term`` of each entry of the tensor ``d``, in its dtype: ``expm1(d) - d``, ``inf``
    where ``d`` is infinite (where ``expm1(d) - d`` would give ``inf - inf``) or ``expm1(d)``
    overflows the dtype; NaN where ``d`` is NaN."""
    return (d.expm1() - d).masked_fill(d.isinf(), math.inf)
