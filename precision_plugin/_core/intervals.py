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
(lognormal model)      random walk, at each end of the robust variance interval (it falls as
                       the variance grows); a seeded Monte Carlo over ``N`` lognormal weights.
                       It holds for near-normal sums only: a heavy-tailed sum with the same
                       variance has a lower ESS (Student t, 3 dof, 64 sequences: 0.55 / 0.25
                       coverage at N = 64 / 256)
ESS of a batch of N    ``ess_hull``: the hull, over the tail laws ``TAIL_LAWS`` (normal and
(what the figures use) Student t with 3 degrees of freedom, each scaled to the variance), of
                       the expected ESS for variances from the robust interval's low end to
                       ``tail_bounds``' high end (the robust interval sized at an excess
                       kurtosis of at least ``TAIL_EXCESS_KURTOSIS``, 8: a t with 4.75 dof's;
                       a 10 % mixture with 10x the variance has 6). Conservative for normal sums
                       (about 99 %), at or above 87 % for Laplace, t3 and the mixture at 8 to
                       64 sequences (``tests/benchmarks/bench_ess_calibration.py``)
heavy-tail warning     ``heavy_tails``: the residuals' excess kurtosis above
                       ``HEAVY_TAIL_KURTOSIS`` (8, the tails the ESS interval assumes):
                       ``HEAVY_TAIL_WARNING``; on normal samples of 8 to 64 sequences it
                       fired once in 18,000 (the benchmark's grid)
====================== ==================================================================

A share over tokens (the TIS clip) treats the tokens as independent, as the growth model does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

import annotated_types as at
import numpy as np
from scipy import special, stats

from precision_plugin._base.boundary import checked, same_length
from precision_plugin._base.constraints import (
    AtMost,
    Brackets,
    Each,
    Finite,
    Measured,
    Ordered,
    Probability,
    Whole,
)

#: Two-sided coverage of every interval.
COVERAGE = 0.90
#: The excess kurtosis of a Laplace distribution: the robust variance interval assumes tails at
#: least this heavy (bf16's sequence log-ratios measured 2.8 on the embedded model).
LAPLACE_EXCESS_KURTOSIS = 3.0
#: The excess kurtosis the ESS and mask intervals' variance assumes at least (a Student t with
#: 4.75 degrees of freedom's; a 10 % mixture with 10x the variance has 6.06). At 6 the t3 sums
#: of 64 sequences covered 86 % without a warning; at 8, 92 % (2,000 replicates).
TAIL_EXCESS_KURTOSIS = 8.0
#: The tail statistic's threshold: residuals whose excess kurtosis exceeds it have heavier tails
#: than the intervals assume, and the figures carry ``HEAVY_TAIL_WARNING``.
HEAVY_TAIL_KURTOSIS = TAIL_EXCESS_KURTOSIS
HEAVY_TAIL_WARNING = "heavy tails: the interval may be too narrow"
#: The laws of the standardised sequence log-ratio an ESS or mask interval spans: normal (the
#: random walk) and Student t with 3 degrees of freedom scaled to unit variance.
TAIL_LAWS: tuple[str, ...] = ("normal", "t3")
Law = Literal["normal", "t3"]
#: Weights drawn per expected-ESS evaluation (replicates × batch size), and the replicate bounds.
ESS_DRAWS = 250_000
ESS_REPLICATES = (64, 2000)
#: The Monte Carlo's seed: the same figures on every run and machine.
ESS_SEED = 0

NAN = (math.nan, math.nan)

#: The largest count of trials, tokens or sequences an interval takes: float64 holds every
#: whole number up to it exactly (scipy's binomial works in float64).
MAX_COUNT = 2**53
#: The largest batch an expected ESS is simulated for, above the probe's largest --batch-size
#: (``probe.schema.MAX_BATCH_SIZE``); each replicate draws one weight per sequence (64
#: replicates of this many weights: 512 MiB of float64).
MAX_BATCH = 2**20

#: A two-sided coverage level: a probability strictly between 0 and 1.
Coverage = Annotated[float, Finite(), at.Gt(0), at.Lt(1)]


@checked
@dataclass(frozen=True)
class Interval:
    """A projected value with its ``COVERAGE`` interval."""

    value: Measured
    low: Measured
    high: Annotated[float, Finite(nan_ok=True), Ordered("low", ">=")]

    def to_dict(self) -> dict[str, float]:
        """JSON-ready dict."""
        return asdict(self)


#: A count of trials, sequences or tokens.
Trials = Annotated[int, Whole(), at.Ge(0), at.Le(MAX_COUNT)]
#: A variance (NaN or inf: not measured, the interval is NaN).
VarianceIn = Annotated[float, at.Ge(0)]
#: Results (checked by the boundary on the way out; NaN: too few sequences or trials):
#: a share's interval, within [0, 1] and ordered;
ShareInterval = Annotated[tuple[Probability, Probability], Brackets(low=0, high=1)]
#: a variance (or a ratio of non-negative sums) and its interval: >= 0, ordered (inf only
#: from an infinite input);
NonNegativeOrNaN = Annotated[float, at.Ge(0)]
VarianceInterval = Annotated[tuple[NonNegativeOrNaN, NonNegativeOrNaN], Brackets(low=0, high=1)]
#: an expected ESS (a share of the batch, in [0, 1]) and one with its interval;
ESS = Probability
ESSInterval = Annotated[tuple[ESS, ESS, ESS], Brackets(value=0, low=1, high=2)]
#: a ratio with its interval, ``(value, low, high)``.
RatioInterval = Annotated[
    tuple[NonNegativeOrNaN, NonNegativeOrNaN, NonNegativeOrNaN], Brackets(value=0, low=1, high=2)
]
#: Sequence lengths in tokens, one per sequence of a batch no larger than ``MAX_BATCH``.
Lengths = Annotated[Sequence[int], Each(Whole(), at.Ge(0), at.Le(MAX_COUNT)), at.MaxLen(MAX_BATCH)]


@checked
def z_value(coverage: Coverage = COVERAGE) -> float:
    """The standard normal quantile of a two-sided ``coverage`` interval (1.645 for 90 %)."""
    return float(stats.norm.ppf(0.5 + coverage / 2.0))


@checked
def clopper_pearson(
    k: Annotated[int, Whole(), at.Ge(0), AtMost("n")],
    n: Trials,
    coverage: Coverage = COVERAGE,
) -> ShareInterval:
    """The exact (Clopper-Pearson) interval of a share ``k / n``; NaN without a trial."""
    if n <= 0:
        return NAN
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=coverage, method="exact")
    return float(ci.low), float(ci.high)


@checked
def chi2_ppf(
    p: Annotated[float, Finite(), at.Ge(0), at.Le(1)], dof: Annotated[float, Finite(), at.Gt(0)]
) -> float:
    """The ``p`` quantile of the chi-square distribution with ``dof`` degrees of freedom."""
    return float(stats.chi2.ppf(p, dof))


@checked
def variance_normal(
    variance: VarianceIn, n: Trials, coverage: Coverage = COVERAGE
) -> VarianceInterval:
    """The chi-square interval of a variance estimated with ``n − 1`` degrees of freedom from
    ``n`` normal values; NaN below two."""
    return _chi2_interval(variance, float(n - 1), coverage) if n >= 2 else NAN


@checked
def excess_kurtosis(residuals: Sequence[float]) -> Annotated[float, Finite(nan_ok=True)]:
    """The bias-corrected sample excess kurtosis (``G2``; 0 for a normal); NaN below four."""
    z = np.asarray(residuals, dtype=np.float64)
    if z.size < 4 or not np.all(np.isfinite(z)) or float(np.ptp(z)) == 0.0:
        return math.nan
    return float(stats.kurtosis(z, fisher=True, bias=False))


@checked
def variance_robust(
    variance: VarianceIn, residuals: Sequence[float], coverage: Coverage = COVERAGE
) -> VarianceInterval:
    """The interval of a per-token variance that holds for heavy-tailed log-ratios (see the
    module docstring); ``residuals``: the sequences' standardised residuals
    ``(S_i − drift·L_i) / √L_i``. NaN below two sequences."""
    n = len(residuals)
    if n < 2:
        return NAN
    low, high = robust_bounds(variance, excess_kurtosis(residuals), n, coverage)
    return float(low), float(high)


def robust_bounds(
    variance: Any,
    kurtosis: Any,
    n: int,
    coverage: float = COVERAGE,
    *,
    floor: float = LAPLACE_EXCESS_KURTOSIS,
) -> Any:
    """``variance_robust``'s bounds from the variance(s) and excess kurtosis(es) of samples of
    ``n`` (NumPy arrays or floats, element-wise): the calibration test's vectorised path.
    ``floor``: the least excess kurtosis assumed (``TAIL_EXCESS_KURTOSIS`` for ``tail_bounds``)."""
    k = np.where(np.isfinite(kurtosis), kurtosis, floor)
    k = np.maximum(k, floor)
    dof = np.maximum(2.0 / (2.0 / (n - 1) + k / n), 1.0)
    tail = (1.0 - coverage) / 2.0
    v = np.asarray(variance, dtype=np.float64)
    return v * dof / stats.chi2.ppf(1.0 - tail, dof), v * dof / stats.chi2.ppf(tail, dof)


@checked
def tail_bounds(
    variance: VarianceIn, residuals: Sequence[float], coverage: Coverage = COVERAGE
) -> VarianceInterval:
    """The variance interval the ESS and mask intervals span: ``variance_robust``'s low end and
    the high end of the same interval sized at an excess kurtosis of at least
    ``TAIL_EXCESS_KURTOSIS``. NaN below two sequences."""
    n = len(residuals)
    if n < 2 or not math.isfinite(variance):
        return NAN
    kurtosis = excess_kurtosis(residuals)
    low, _ = robust_bounds(variance, kurtosis, n, coverage)
    _, high = robust_bounds(variance, kurtosis, n, coverage, floor=TAIL_EXCESS_KURTOSIS)
    return float(low), float(high)


def heavy_tails(kurtosis: float) -> bool:
    """Whether residuals of this excess kurtosis have heavier tails than the intervals assume
    (``> HEAVY_TAIL_KURTOSIS``; NaN, too few sequences to tell: no)."""
    return bool(math.isfinite(kurtosis) and kurtosis > HEAVY_TAIL_KURTOSIS)


def _chi2_interval(variance: float, dof: float, coverage: float) -> tuple[float, float]:
    if not math.isfinite(variance):
        return NAN
    tail = (1.0 - coverage) / 2.0
    return variance * dof / chi2_ppf(1.0 - tail, dof), variance * dof / chi2_ppf(tail, dof)


def standard_draws(law: str, shape: tuple[int, int]) -> np.ndarray:
    """The seeded unit-variance draws behind every expected ESS of ``law`` (``TAIL_LAWS``)."""
    rng = np.random.default_rng(ESS_SEED)
    if law == "normal":
        return rng.standard_normal(shape)
    if law == "t3":
        return rng.standard_t(3, size=shape) / math.sqrt(3.0)
    raise ValueError(f"law={law!r} is not one of {TAIL_LAWS}")


@checked(same_length("means", "sds", fix="pass one mean and one sd per sequence"))
def expected_batch_ess(
    means: Annotated[Sequence[float], at.MaxLen(MAX_BATCH)],
    sds: Annotated[Sequence[float], at.MaxLen(MAX_BATCH)],
    *,
    law: Law = "normal",
) -> ESS:
    """The expected self-normalised ESS ``(Σ w)² / (N Σ w²)`` of a batch of ``N = len(means)``
    sequences whose log-ratios are ``means[i] + sds[i]·Z``, ``Z`` standard normal (``law``
    ``"normal"``) or a Student t with 3 degrees of freedom scaled to unit variance (``"t3"``)
    (seeded Monte Carlo in log space, so no weight overflows); NaN for an empty batch or a
    non-finite parameter."""
    m = np.asarray(means, dtype=np.float64)
    s = np.asarray(sds, dtype=np.float64)
    n = m.size
    if n == 0 or not (np.all(np.isfinite(m)) and np.all(np.isfinite(s))):
        return math.nan
    if n == 1:
        return 1.0
    low, high = ESS_REPLICATES
    reps = int(min(high, max(low, ESS_DRAWS // n)))
    x = m + s * standard_draws(law, (reps, n))
    log_ess = 2.0 * special.logsumexp(x, axis=1) - special.logsumexp(2.0 * x, axis=1)
    return float(np.minimum(np.exp(log_ess - math.log(n)), 1.0).mean())


@checked
def batch_ess(
    variance: VarianceIn,
    length: Annotated[float, Finite(), at.Ge(0), at.Le(MAX_COUNT)],
    batch: Annotated[int, Whole(), at.Ge(0), at.Le(MAX_BATCH)],
    drift: float = 0.0,
    *,
    law: Law = "normal",
) -> ESS:
    """The expected ESS of ``batch`` sequences of ``length`` tokens each, ``S ~ Normal(drift·L,
    variance·L)`` (a drift common to the batch does not change it; ``law``: the standardised
    sum's law, as for ``expected_batch_ess``)."""
    if not (math.isfinite(variance) and variance >= 0):
        return math.nan
    sd = math.sqrt(variance * length)
    return expected_batch_ess([drift * length] * batch, [sd] * batch, law=law)


@checked
def mixed_batch_ess(
    variance: VarianceIn, drift: float, lengths: Lengths, *, law: Law = "normal"
) -> ESS:
    """The expected ESS of a batch of sequences of the given ``lengths``, ``S_i ~
    Normal(drift·L_i, variance·L_i)``: what a sample like the measured one shows on average
    (``law``: the standardised sums' law, as for ``expected_batch_ess``)."""
    if not (math.isfinite(variance) and variance >= 0 and math.isfinite(drift)):
        return math.nan
    return expected_batch_ess(
        [drift * n for n in lengths], [math.sqrt(variance * n) for n in lengths], law=law
    )


@checked
def ess_hull(
    variance: VarianceIn,
    low: VarianceIn,
    high: Annotated[float, at.Ge(0), Ordered("low", ">=")],
    drift: float,
    lengths: Lengths,
) -> ESSInterval:
    """An expected ESS with its interval for a batch of sequences of ``lengths`` tokens: the
    random walk's value at ``variance``, and the hull over ``TAIL_LAWS`` of the expected ESS at
    the variance interval's ends (``low``, ``high``: ``tail_bounds``), where it is smallest and
    largest (the ESS falls as the variance grows, under each law). NaN where a bound is."""
    value = mixed_batch_ess(variance, drift, lengths)
    if not (math.isfinite(low) and math.isfinite(high)):
        return value, math.nan, math.nan
    lows = [mixed_batch_ess(high, drift, lengths, law=law) for law in TAIL_LAWS]
    highs = [mixed_batch_ess(low, drift, lengths, law=law) for law in TAIL_LAWS]
    return value, min(value, *lows), max(value, *highs)


@checked(
    same_length(
        "numerators", "denominators", fix="pass one numerator and one denominator per cluster"
    )
)
def ratio_interval(
    numerators: Annotated[Sequence[float], Each(at.Ge(0))],
    denominators: Annotated[Sequence[float], Each(Finite(), at.Ge(0))],
    coverage: Coverage = COVERAGE,
) -> RatioInterval:
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
