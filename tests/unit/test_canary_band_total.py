"""The canary band is total: every floor gets a finite band or one clear refusal, never a NaN
edge (issue 52, class 6 and its "Deliver" bullet).

- a floor with zero-k3 tokens, with a reference that is 0 on most of them: the bootstrap's
  ``0/0`` resamples once gave a NaN upper edge, every check out of band and a false
  ``engine_state_drift`` alarm that stopped a strict run;
- a reference present at some checks and not others: once a raw k3 compared with a band of
  ratios;
- non-finite inputs, and floors whose k3 overflows float64.
"""

from __future__ import annotations

import logging
import math
import random

import pytest

from precision_plugin._core.canary import CanaryMonitor, canary_band
from precision_plugin._core.canary.band import CanaryBand
from precision_plugin.errors import PrecisionConfigError

SEQS, TOKENS = 16, 8


def _logps(rng: random.Random) -> list[list[float]]:
    return [[rng.gauss(-2.0, 1.0) for _ in range(TOKENS)] for _ in range(SEQS)]


def _noisy(rows: list[list[float]], rng: random.Random, scale: float) -> list[list[float]]:
    return [[x + rng.gauss(0.0, scale) for x in row] for row in rows]


def _sparse_reference(
    rows: list[list[float]], rng: random.Random, tokens: int
) -> list[list[float]]:
    """The learner in float32 equal to the learner bit for bit except on ``tokens`` tokens."""
    out = [list(r) for r in rows]
    for k in range(tokens):
        i, j = divmod(k * 37 % (SEQS * TOKENS), TOKENS)
        out[i][j] += rng.gauss(0.0, 1e-3)
    return out


def _one_line_error(call) -> str:
    with pytest.raises(PrecisionConfigError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


# -- zero-k3 tokens -----------------------------------------------------------------------------


def test_a_reference_zero_on_most_tokens_gives_a_finite_raw_band_with_a_note() -> None:
    values = [1e-6] * 3 + [2e-7] * 97
    reference = [1e-6] * 3 + [0.0] * 97
    band = canary_band(values, reference_k3=reference)
    assert math.isfinite(band.upper) and band.upper > band.floor
    assert not band.normalized
    assert band.floor == pytest.approx(math.fsum(values) / 100, rel=1e-12)
    assert "3 of 100 canary tokens" in band.note and "raw k3" in band.note
    # the same band as without the reference
    plain = canary_band(values)
    assert (band.floor, band.upper) == (plain.floor, plain.upper) and plain.note == ""


def test_a_reference_zero_on_every_token_gives_the_raw_band_and_says_so() -> None:
    band = canary_band([1e-6, 2e-6, 3e-6, 4e-6], reference_k3=[0.0] * 4)
    assert not band.normalized and "equals the learner on every canary token" in band.note
    assert band.upper == canary_band([1e-6, 2e-6, 3e-6, 4e-6]).upper


def test_a_dense_reference_keeps_the_ratio_band() -> None:
    rng = random.Random(0)
    values = [rng.expovariate(1.0) * 1e-6 for _ in range(128)]
    reference = [rng.expovariate(1.0) * 1e-6 for _ in range(128)]
    band = canary_band(values, reference_k3=reference)
    assert band.normalized and band.note == "" and math.isfinite(band.upper)


@pytest.mark.parametrize("seed", range(12))
def test_every_floor_with_zero_tokens_has_a_finite_band(seed: int) -> None:
    # Floors and references with many exact zeros (bit-identical tokens), small and large.
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 8, 40])
    values = [0.0 if rng.random() < 0.7 else rng.expovariate(1.0) * 1e-6 for _ in range(n)]
    reference = [0.0 if rng.random() < 0.8 else rng.expovariate(1.0) * 1e-6 for _ in range(n)]
    for ref in (None, reference):
        band = canary_band(values, reference_k3=ref, resamples=500, seed=seed)
        assert math.isfinite(band.floor) and math.isfinite(band.upper)
        assert band.upper >= band.floor + band.abs_tol
        assert band.contains(band.floor)


def test_a_strict_run_whose_reference_equals_the_learner_on_most_tokens_raises_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rng = random.Random(7)
    learner = _logps(rng)
    monitor = CanaryMonitor(strictness="error")
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        for i in range(12):
            rollout = _noisy(learner, rng, 1e-3)
            monitor.check(i * 5, learner, rollout, reference=_sparse_reference(learner, rng, 3))
            learner = _noisy(learner, rng, 1e-2)
    assert monitor.band is not None and math.isfinite(monitor.band.upper)
    assert not monitor.band.normalized
    assert monitor.alarm is None and all(c.in_band for c in monitor.checks)
    notes = [r.getMessage() for r in caplog.records if "canary floor" in r.getMessage()]
    assert len(notes) == 1 and "3 of 128 canary tokens" in notes[0]


# -- a reference at some checks and not others ---------------------------------------------------


def _normalized_monitor() -> tuple[CanaryMonitor, list[list[float]], random.Random]:
    rng = random.Random(8)
    learner = _logps(rng)
    monitor = CanaryMonitor()
    monitor.check(0, learner, _noisy(learner, rng, 1e-3), reference=_noisy(learner, rng, 1e-3))
    assert monitor.band is not None and monitor.band.normalized
    return monitor, learner, rng


def test_a_ratio_band_refuses_a_check_without_its_reference_and_keeps_nothing() -> None:
    monitor, learner, rng = _normalized_monitor()
    message = _one_line_error(lambda: monitor.check(5, learner, _noisy(learner, rng, 1e-3)))
    assert "CanaryMonitor.check(step=5)" in message
    assert "floor check (step 0) came with a float32 reference" in message
    assert "pass reference= at every check" in message
    assert len(monitor.checks) == 1
    # the run goes on with the reference
    later = monitor.check(5, learner, _noisy(learner, rng, 1e-3), reference=learner)
    assert later.step == 5


def test_a_raw_band_refuses_a_reference_it_cannot_use() -> None:
    rng = random.Random(9)
    learner = _logps(rng)
    monitor = CanaryMonitor()
    monitor.check(0, learner, _noisy(learner, rng, 1e-3))
    message = _one_line_error(
        lambda: monitor.check(5, learner, _noisy(learner, rng, 1e-3), reference=learner)
    )
    assert "came without a float32 reference" in message and "raw k3" in message
    assert len(monitor.checks) == 1


def test_a_check_whose_reference_is_zero_takes_the_ratio_limit() -> None:
    monitor, learner, rng = _normalized_monitor()
    band = monitor.band
    assert band is not None
    assert band.statistic([0.0, 0.0], 0.0) == 0.0
    assert band.statistic([1e-7, 0.0], 0.0) == math.inf
    # the learner equals its float32 reference and the rollout: in band (ratio 0)
    same = monitor.check(5, learner, learner, reference=learner)
    assert same.in_band and same.ratio == 0.0
    # the learner equals its reference while the rollout differs: out of band, never NaN
    apart = monitor.check(10, learner, _noisy(learner, rng, 1e-3), reference=learner)
    assert not apart.in_band and apart.ratio == math.inf


def test_a_ratio_band_statistic_refuses_a_missing_or_nan_reference() -> None:
    band = CanaryBand(1.0, 2.0, 4, 1e-3, 100, 1e-12, normalized=True)
    for ref in (None, math.nan, -1.0):
        assert "reference_k3 is" in _one_line_error(lambda r=ref: band.statistic([1e-7], r))
    raw = CanaryBand(1e-7, 2e-7, 4, 1e-3, 100, 1e-12)
    assert raw.statistic([1e-7, 3e-7], None) == pytest.approx(2e-7)


# -- non-finite inputs and overflow ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"per_token_k3": [math.nan, 1e-6]}, ("per_token_k3", "not a finite number")),
        ({"per_token_k3": [math.inf]}, ("per_token_k3", "not a finite number")),
        ({"per_token_k3": [-1e-6]}, ("per_token_k3", "out of range")),
        (
            {"per_token_k3": [1e-6, 1e-6], "reference_k3": [math.nan, 1e-6]},
            ("reference_k3", "not a finite number"),
        ),
        ({"per_token_k3": [1e308, 1e308, 1e300]}, ("overflows float64",)),
        ({"per_token_k3": [1e-6] * 4, "seed": 2**70}, ("seed", "out of range")),
        ({"per_token_k3": [1e-6] * 4, "resamples": 10**9}, ("resamples", "out of range")),
        ({"per_token_k3": [1e-6] * 4, "alpha": math.nan}, ("alpha", "not a finite number")),
        ({"per_token_k3": []}, ("empty",)),
    ],
)
def test_bad_floors_get_one_clear_refusal(kw: dict, words: tuple[str, ...]) -> None:
    values = kw.pop("per_token_k3")
    message = _one_line_error(lambda: canary_band(values, **kw))
    for word in words:
        assert word in message, message


def test_non_finite_log_probs_are_refused_by_the_monitor_before_anything_is_kept() -> None:
    rng = random.Random(10)
    learner = _logps(rng)
    monitor = CanaryMonitor()
    for bad in (math.nan, math.inf, -math.inf):
        rollout = _noisy(learner, rng, 1e-3)
        rollout[3][2] = bad
        message = _one_line_error(lambda r=rollout: monitor.check(0, learner, r))
        assert "(row 3, token 2)" in message
    assert monitor.band is None and monitor.checks == []
    far = [list(r) for r in learner]
    far[0][0] -= 800.0  # the learner 800 nats above the rollout: expm1(800) overflows
    message = _one_line_error(lambda: monitor.check(0, learner, far))
    assert "k3 overflows float64" in message and monitor.band is None
