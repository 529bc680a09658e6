"""Intervals for the consequence figures: how sure each figure is, from how many sequences.

Every interval is two-sided at ``COVERAGE`` and comes from ``scipy.stats`` (no hand-written
quantiles). One method per kind of figure; ``tests/unit/test_interval_calibration.py``
simulates sequences from known distributions and checks each one's coverage:

====================== ==================================================================
figure                 interval
====================== ==================================================================
a share (mask, clip)   Clopper-Pearson, the exact binomial interval
                       (``scipy.stats.binomtest(k, n).proportion_ci(method="exact")``):
                       never below its level for any ``n``, conservative for small ``n``
per-token variance     ``variance_normal``: the chi-square interval with ``n − 1`` degrees of
(normal model)         freedom; exact when the sequence log-ratios are normal, and too
                       narrow when they have heavier tails (bf16's do)
per-token variance     ``variance_robust``: the chi-square interval with the degrees of
(what the figures use) freedom of a sample variance from a distribution with excess kurtosis
                       ``κ`` (``Var(s²)/σ⁴ = 2/(n − 1) + κ/n``), ``κ`` the sample's
                       bias-corrected excess kurtosis but at least a Laplace's (3): it holds
                       for tails up to a Laplace's or a Student t with 5 degrees of freedom
                       and is conservative for normal ones (about 99 % for 90 %)
ESS of a batch of N    the expected self-normalised ESS of ``N`` sequences under the fitted
                       random walk, at each end of the robust variance interval (it falls as
                       the variance grows); a seeded Monte Carlo over ``N`` lognormal weights
====================== ==================================================================

A share over tokens (the TIS clip) treats the tokens as independent, as the growth model does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import special, stats

from precision_plugin.boundary import checked

#: Two-sided coverage of every interval.
COVERAGE = 0.90
#: The excess kurtosis of a Laplace distribution: the robust variance interval assumes tails at
#: least this heavy (bf16's sequence log-ratios measured 2.8 on the embedded model).
LAPLACE_EXCESS_KURTOSIS = 3.0
#: Weights drawn per expected-ESS evaluation (replicates × batch size), and the replicate bounds.
ESS_DRAWS = 250_000
ESS_REPLICATES = (64, 2000)
#: The Monte Carlo's seed: the same figures on every run and machine.
ESS_SEED = 0

NAN = (math.nan, math.nan)


def z_value(coverage: float = COVERAGE) -> float:
    """The standard normal quantile of a two-sided ``coverage`` interval (1.645 for 90 %)."""
    return float(stats.norm.ppf(0.5 + coverage / 2.0))


@checked
def clopper_pearson(k: int, n: int, coverage: float = COVERAGE) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a share ``k / n``; NaN without a trial."""
    if n <= 0:
        return NAN
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=coverage, method="exact")
    return float(ci.low), float(ci.high)


def chi2_ppf(p: float, dof: float) -> float:
    """The ``p`` quantile of the chi-square distribution with ``dof`` degrees of freedom."""
    return float(stats.chi2.ppf(p, dof))


@checked
def variance_normal(variance: float, n: int, coverage: float = COVERAGE) -> tuple[float, float]:
    """The chi-square interval of a variance estimated with ``n − 1`` degrees of freedom from
    ``n`` normal values; NaN below two."""
    return _chi2_interval(variance, float(n - 1), coverage) if n >= 2 else NAN


@checked
def excess_kurtosis(residuals: Sequence[float]) -> float:
    """The bias-corrected sample excess kurtosis (``G2``; 0 for a normal); NaN below four."""
    z = np.asarray(residuals, dtype=np.float64)
    if z.size < 4 or not np.all(np.isfinite(z)) or float(np.ptp(z)) == 0.0:
        return math.nan
    return float(stats.kurtosis(z, fisher=True, bias=False))


@checked
def variance_robust(
    variance: float, residuals: Sequence[float], coverage: float = COVERAGE
) -> tuple[float, float]:
    """The interval of a per-token variance that holds for heavy-tailed log-ratios (see the
    module docstring); ``residuals``: the sequences' standardised residuals
    ``(S_i − drift·L_i) / √L_i``. NaN below two sequences."""
    n = len(residuals)
    if n < 2:
        return NAN
    low, high = robust_bounds(variance, excess_kurtosis(residuals), n, coverage)
    return float(low), float(high)


def robust_bounds(variance: Any, kurtosis: Any, n: int, coverage: float = COVERAGE) -> Any:
    """``variance_robust``'s bounds from the variance(s) and excess kurtosis(es) of samples of
    ``n`` (NumPy arrays or floats, element-wise): the calibration test's vectorised path."""
    k = np.where(np.isfinite(kurtosis), kurtosis, LAPLACE_EXCESS_KURTOSIS)
    k = np.maximum(k, LAPLACE_EXCESS_KURTOSIS)
    dof = np.maximum(2.0 / (2.0 / (n - 1) + k / n), 1.0)
    tail = (1.0 - coverage) / 2.0
    v = np.asarray(variance, dtype=np.float64)
    return v * dof / stats.chi2.ppf(1.0 - tail, dof), v * dof / stats.chi2.ppf(tail, dof)


def _chi2_interval(variance: float, dof: float, coverage: float) -> tuple[float, float]:
    if not math.isfinite(variance):
        return NAN
    tail = (1.0 - coverage) / 2.0
    return variance * dof / chi2_ppf(1.0 - tail, dof), variance * dof / chi2_ppf(tail, dof)


@checked
def expected_batch_ess(means: Sequence[float], sds: Sequence[float]) -> float:
    """The expected self-normalised ESS ``(Σ w)² / (N Σ w²)`` of a batch of ``N = len(means)``
    sequences whose log-ratios are ``Normal(means[i], sds[i]²)`` (seeded Monte Carlo in log
    space, so no weight overflows); NaN for an empty batch or a non-finite parameter."""
    m = np.asarray(means, dtype=np.float64)
    s = np.asarray(sds, dtype=np.float64)
    n = m.size
    if n == 0 or not (np.all(np.isfinite(m)) and np.all(np.isfinite(s))):
        return math.nan
    if n == 1:
        return 1.0
    low, high = ESS_REPLICATES
    reps = int(min(high, max(low, ESS_DRAWS // n)))
    z = np.random.default_rng(ESS_SEED).standard_normal((reps, n))
    x = m + s * z
    log_ess = 2.0 * special.logsumexp(x, axis=1) - special.logsumexp(2.0 * x, axis=1)
    return float(np.minimum(np.exp(log_ess - math.log(n)), 1.0).mean())


@checked
def batch_ess(variance: float, length: float, batch: int, drift: float = 0.0) -> float:
    """The expected ESS of ``batch`` sequences of ``length`` tokens each, ``S ~ Normal(drift·L,
    variance·L)`` (a drift common to the batch does not change it)."""
    if not (math.isfinite(variance) and variance >= 0):
        return math.nan
    sd = math.sqrt(variance * length)
    return expected_batch_ess([drift * length] * batch, [sd] * batch)


@checked
def mixed_batch_ess(variance: float, drift: float, lengths: Sequence[int]) -> float:
    """The expected ESS of a batch of sequences of the given ``lengths``, ``S_i ~
    Normal(drift·L_i, variance·L_i)``: what a sample like the measured one shows on average."""
    if not (math.isfinite(variance) and variance >= 0 and math.isfinite(drift)):
        return math.nan
    return expected_batch_ess(
        [drift * n for n in lengths], [math.sqrt(variance * n) for n in lengths]
    )


@checked
def ratio_interval(
    numerators: Sequence[float], denominators: Sequence[float], coverage: float = COVERAGE
) -> tuple[float, float, float]:
    """``Σ a / Σ b`` over clusters (sequences) with its interval: the ratio estimator's
    standard error ``√(n/(n−1) Σ (a_i − r·b_i)²) / Σ b``, normal quantiles, floored at 0; NaN
    below two clusters. For a token mean (the k3 KL) whose tokens are grouped in sequences."""
    a = np.asarray(numerators, dtype=np.float64)
    b = np.asarray(denominators, dtype=np.float64)
    total = float(b.sum())
    if a.size < 2 or total <= 0 or not np.all(np.isfinite(a)):
        return (float(a.sum()) / total if total > 0 else math.nan, math.nan, math.nan)
    r = float(a.sum()) / total
    n = a.size
    se = math.sqrt(n / (n - 1) * float(((a - r * b) ** 2).sum())) / total
    half = z_value(coverage) * se
    return r, max(0.0, r - half), r + half
