"""The one drift fit: the random walk ``S ~ Normal(drift·L, variance·L)`` of sequences'
log-ratio sums ``S`` against their lengths ``L``, from the sequences themselves (``drift_fit``,
``drift_per_1k``) or from sums that add up across processes (``fit_drift``, which
[`metrics_from_sums`][precision_plugin._core.metrics.mismatch.metrics_from_sums] calls). Public
path:
[`precision_plugin._core.metrics.mismatch`][precision_plugin._core.metrics.mismatch] (re-exported
there).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from precision_plugin._base.boundary import checked
from precision_plugin._core.metrics.inputs import _LENGTHS, _PER_SEQUENCE, _SUMS, TokenCounts


@checked(_PER_SEQUENCE, lengths=_LENGTHS, sums=_SUMS)
def drift_fit(lengths: TokenCounts, sums: Any) -> tuple[float, float, float]:
    """``(drift, stderr, variance)`` per token of sequences' log-ratios ``S_i`` (sums of
    log π − log μ) and lengths ``L_i``, under the random walk ``S ~ Normal(drift·L, variance·L)``.

    ``drift = Σ S / Σ L`` (the token mean of log π − log μ, i.e. −k1; weighted least squares),
    ``variance = Σ (S − drift·L)² / L / (n − 1)`` and ``stderr = sqrt(variance / Σ L)``; the
    last two NaN below two sequences, all three NaN without a token. ``lengths`` and ``sums``
    are sequences of numbers or 1-D tensors; sequences of length 0 are left out.
    """
    x = torch.as_tensor(lengths, dtype=torch.float64).reshape(-1)
    y = torch.as_tensor(sums, dtype=torch.float64).reshape(-1)
    keep = x > 0
    x, y = x[keep], y[keep]
    return fit_drift(
        x.numel(), float(x.sum()), float(y.sum()), lambda d: float(((y - d * x) ** 2 / x).sum())
    )


def fit_drift(
    sequences: float, length: float, total: float, residual: Callable[[float], float]
) -> tuple[float, float, float]:
    """The one drift fit, from ``sequences`` (n), ``length`` (Σ L), ``total`` (Σ S) and
    ``residual(drift)`` (Σ (S − drift·L)² / L): ``(drift, stderr, variance)`` with
    ``drift = Σ S / Σ L``, ``variance = residual / (n − 1)``, ``stderr = sqrt(variance / Σ L)``;
    the last two NaN below two sequences, all three NaN without a token.
    [`drift_fit`][precision_plugin._core.metrics.mismatch.drift_fit] computes the residual from the
    sequences, [`metrics_from_sums`][precision_plugin._core.metrics.mismatch.metrics_from_sums] from
    sums that add up across processes."""
    if length <= 0:
        return math.nan, math.nan, math.nan
    drift = total / length
    if sequences < 2:
        return drift, math.nan, math.nan
    variance = max(residual(drift), 0.0) / (sequences - 1)
    return drift, math.sqrt(variance / length), variance


@checked(_PER_SEQUENCE, lengths=_LENGTHS, sums=_SUMS)
def drift_per_1k(lengths: TokenCounts, sums: Any) -> tuple[float, float]:
    """The drift per 1,000 tokens (``1000 · Σ S / Σ L``, that is −1000·k1) and its standard
    error, from [`drift_fit`][precision_plugin._core.metrics.mismatch.drift_fit]."""
    drift, stderr, _ = drift_fit(lengths, sums)
    return 1000.0 * drift, 1000.0 * stderr
