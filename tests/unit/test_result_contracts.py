"""Output contracts (issue 52): a result's domain is declared on the return annotation and the
boundary checks it on the way out, as it checks arguments on the way in; a broken result is a
bug in the plugin (``BrokenResult``), named as such."""

from __future__ import annotations

import math
from typing import Annotated

import pytest

from precision_plugin._base.boundary import BrokenResult, boundary_of, checked
from precision_plugin._base.constraints import Brackets, Probability
from precision_plugin._core import intervals
from precision_plugin.errors import PrecisionPluginError
from precision_plugin.probe.schema import MAX_BATCH_SIZE

INTERVALS = [
    intervals.clopper_pearson,
    intervals.variance_normal,
    intervals.variance_robust,
    intervals.tail_bounds,
    intervals.excess_kurtosis,
    intervals.expected_batch_ess,
    intervals.batch_ess,
    intervals.mixed_batch_ess,
    intervals.ess_hull,
    intervals.ratio_interval,
]


@checked
def _share(x: float) -> Probability:
    return x


@checked
def _interval(
    low: float, value: float, high: float
) -> Annotated[tuple[Probability, Probability, Probability], Brackets(value=1, low=0, high=2)]:
    return low, value, high


@checked
def _plain(x: float) -> float:
    return x


def test_a_result_outside_its_declared_domain_is_a_bug_of_the_plugin() -> None:
    assert _share(0.25) == 0.25 and math.isnan(_share(math.nan))  # NaN: not measured
    with pytest.raises(
        BrokenResult,
        match=r"^_share\(\) returned 1\.5, which breaks the rule <= 1: a bug in precision_plugin",
    ):
        _share(1.5)
    assert issubclass(BrokenResult, PrecisionPluginError)


def test_an_interval_whose_ends_do_not_bracket_its_value_is_refused() -> None:
    assert _interval(0.1, 0.2, 0.3) == (0.1, 0.2, 0.3)
    assert _interval(math.nan, 0.2, math.nan)[1] == 0.2  # NaN ends bracket nothing
    with pytest.raises(
        BrokenResult, match=r"has value 0\.4 above high 0\.3 \(rule: low <= value <= high\)"
    ):
        _interval(0.1, 0.4, 0.3)
    with pytest.raises(BrokenResult, match=r"has low 0\.5 above high 0\.3"):
        _interval(0.5, math.nan, 0.3)
    with pytest.raises(BrokenResult, match=r"holds -0\.1 at \[0\], which breaks the rule >= 0"):
        _interval(-0.1, 0.2, 0.3)


def test_a_result_without_a_declared_rule_costs_nothing() -> None:
    _plain(1.0)
    assert boundary_of(_plain).result_check() is None


@pytest.mark.parametrize("func", INTERVALS, ids=lambda f: f.__name__)
def test_every_interval_declares_its_result(func) -> None:
    assert boundary_of(func).result_check() is not None


def test_a_planted_swapped_clopper_pearson_is_caught(monkeypatch) -> None:
    real = intervals.stats.binomtest

    class Swapped:
        def __init__(self, k, n):
            self.ci = real(k, n).proportion_ci(confidence_level=intervals.COVERAGE)

        def proportion_ci(self, **_):
            return type(self.ci)(low=self.ci.high, high=self.ci.low)

    assert intervals.clopper_pearson(3, 10)[0] < intervals.clopper_pearson(3, 10)[1]
    monkeypatch.setattr(intervals.stats, "binomtest", Swapped)
    with pytest.raises(
        BrokenResult, match=r"clopper_pearson\(\) returned .* has low .* above high"
    ):
        intervals.clopper_pearson(3, 10)


def test_a_planted_ess_above_one_is_caught(monkeypatch) -> None:
    lengths = [64, 128, 256]
    value, low, high = intervals.ess_hull(0.01, 0.005, 0.02, 0.0, lengths)
    assert 0 <= low <= value <= high <= 1
    monkeypatch.setattr(intervals, "mixed_batch_ess", lambda *a, **k: 1.5)
    with pytest.raises(
        BrokenResult, match=r"ess_hull\(\) returned \(1\.5, 1\.5, 1\.5\), which holds 1\.5 at \[0\]"
    ):
        intervals.ess_hull(0.01, 0.005, 0.02, 0.0, lengths)


def test_a_planted_variance_interval_below_zero_is_caught(monkeypatch) -> None:
    monkeypatch.setattr(intervals, "_chi2_interval", lambda v, d, c: (-v, v))
    with pytest.raises(BrokenResult, match=r"variance_normal\(\) returned"):
        intervals.variance_normal(0.5, 10)


def test_the_largest_simulated_batch_takes_the_probes_largest_batch_size() -> None:
    assert intervals.MAX_BATCH >= MAX_BATCH_SIZE
    assert intervals.MAX_COUNT == 2**53  # every count float64 holds exactly
