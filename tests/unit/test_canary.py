"""The drift canary's pure logic: the band, the alarm, and each verdict, on pinned inputs.

Inputs are built from a seeded ``random.Random`` (pure Python: the same numbers on every CPU);
the band's bootstrap runs on torch's seeded CPU generator.
"""

from __future__ import annotations

import logging
import math
import random

import pytest

from precision_plugin._core.canary import CanaryMonitor, canary_band, token_k3
from precision_plugin.errors import CanaryAlarmError, PrecisionConfigError

SEQS, TOKENS = 16, 8


def _logps(rng: random.Random) -> list[list[float]]:
    return [[rng.gauss(-2.0, 1.0) for _ in range(TOKENS)] for _ in range(SEQS)]


def _noisy(rows: list[list[float]], rng: random.Random, scale: float) -> list[list[float]]:
    return [[x + rng.gauss(0.0, scale) for x in row] for row in rows]


def _moved(rows: list[list[float]], rng: random.Random) -> list[list[float]]:
    """The learner after one optimizer step: every log-prob moves by ~1e-2."""
    return _noisy(rows, rng, 1e-2)


def test_token_k3_is_expm1_minus_d() -> None:
    d = 1e-3
    assert token_k3([[-1.0 + d, -2.0]], [[-1.0, -2.0]]) == [math.expm1(d) - d, 0.0]
    assert token_k3([[float("nan")]], [[-1.0]]) == [math.inf]


def test_band_of_a_discrete_floor_is_pinned() -> None:
    # Four tokens: the bootstrap means lie on a grid; P(all four draws = 4e-6) = 1/256 > 1e-3,
    # so the 0.999 quantile is 4e-6 exactly and upper = floor + sqrt(2) * (4e-6 - floor).
    band = canary_band([1e-6, 2e-6, 3e-6, 4e-6])
    assert band.floor == pytest.approx(2.5e-6, rel=1e-15)
    assert band.upper == pytest.approx(2.5e-6 + math.sqrt(2) * 1.5e-6, rel=1e-12)
    assert band.tokens == 4
    assert band.ratio(5e-6) == pytest.approx(2.0, rel=1e-15)


def test_floor_of_zero_tolerates_only_the_stated_absolute_tolerance() -> None:
    band = canary_band([0.0] * 10, abs_tol=1e-9)
    assert (band.floor, band.upper) == (0.0, 1e-9)
    assert band.contains(5e-10) and not band.contains(2e-9)
    assert band.ratio(0.0) == 1.0 and band.ratio(1e-12) == math.inf


def _clean_run(checks: int, seed: int = 0) -> CanaryMonitor:
    rng = random.Random(seed)
    learner = _logps(rng)
    monitor = CanaryMonitor()
    for i in range(checks):
        monitor.check(i * 5, learner, _noisy(learner, rng, 1e-3))
        learner = _moved(learner, rng)
    return monitor


def test_a_clean_run_raises_nothing(caplog: pytest.LogCaptureFixture) -> None:
    # 60 checks where the rollout is the learner plus fresh rounding-sized noise (sd 1e-3).
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        monitor = _clean_run(60)
    assert monitor.alarm is None
    assert not [r for r in caplog.records if "canary" in r.getMessage()]
    assert monitor.band is not None and monitor.band.tokens == SEQS * TOKENS


def test_stale_weights_are_named_with_the_step_they_froze_at(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rng = random.Random(1)
    learner = _logps(rng)
    monitor = CanaryMonitor()
    frozen = None
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        for step in range(0, 40, 5):
            rollout = _noisy(learner, rng, 1e-3) if step <= 10 else frozen
            if step == 10:
                frozen = rollout
            check = monitor.check(step, learner, rollout)
            learner = _moved(learner, rng)
    alarm = monitor.alarm
    assert alarm is not None
    assert (alarm.step, alarm.verdict, alarm.stale_since) == (20, "weights_out_of_sync", 10)
    assert [c.in_band for c in monitor.checks] == [True] * 3 + [False] * 5
    assert check.verdict == "weights_out_of_sync" and not check.alarm  # warned once
    warnings = [r.getMessage() for r in caplog.records if "canary" in r.getMessage()]
    assert len(warnings) == 1 and "stale since step 10" in warnings[0]


def test_rollout_unchanged_while_the_learner_moves_is_stale_since_its_first_equal_check() -> None:
    rng = random.Random(2)
    learner = _logps(rng)
    monitor = CanaryMonitor()
    rollout = _noisy(learner, rng, 1e-3)
    for step in (0, 5, 10, 15):
        monitor.check(step, learner, rollout)  # synced once, never again
        learner = _moved(learner, rng)
    alarm = monitor.alarm
    assert alarm is not None
    # Step 0's learner matches the rollout: it holds step 0's weights.
    assert (alarm.step, alarm.verdict, alarm.stale_since) == (10, "weights_out_of_sync", 0)


def test_engine_drift_at_learning_rate_zero() -> None:
    rng = random.Random(3)
    learner = _logps(rng)
    rounding = _noisy(learner, rng, 1e-3)
    monitor = CanaryMonitor()
    for step in range(0, 50, 5):
        drift = 0.0 if step < 20 else 2e-3 * (step - 15) / 5  # a little more at every check
        monitor.check(step, learner, _noisy(rounding, rng, drift) if drift else rounding)
    alarm = monitor.alarm
    assert alarm is not None
    assert (alarm.step, alarm.verdict, alarm.stale_since) == (25, "engine_state_drift", None)
    assert "have not changed since step 0" in alarm.reason


def test_engine_drift_while_training_matches_no_earlier_check() -> None:
    rng = random.Random(4)
    learner = _logps(rng)
    monitor = CanaryMonitor()
    for i in range(8):
        scale = 1e-3 if i < 4 else 1e-3 * (2 + i)
        monitor.check(i * 5, learner, _noisy(learner, rng, scale))
        learner = _moved(learner, rng)
    alarm = monitor.alarm
    assert alarm is not None
    assert (alarm.step, alarm.verdict) == (25, "engine_state_drift")
    assert "neither side" in alarm.reason


def test_policy_moving_when_the_batch_mismatch_grows_and_the_canary_holds() -> None:
    rng = random.Random(5)
    learner = _logps(rng)
    monitor = CanaryMonitor()
    verdicts = []
    for i in range(6):
        check = monitor.check(i, learner, _noisy(learner, rng, 1e-3), batch_k3=1e-6 * 10**i)
        verdicts.append(check.verdict)
        learner = _moved(learner, rng)
    assert verdicts == [None, None] + ["policy_moving"] * 4
    assert monitor.alarm is None and all(c.in_band for c in monitor.checks)


def test_policy_moving_is_said_once_where_a_default_log_shows_it(caplog) -> None:
    """Issue 54: documented as "said once", it was logged at INFO and a strict drill printed
    nothing: one WARNING, at the first policy_moving check, none after."""
    rng = random.Random(5)
    learner = _logps(rng)
    monitor = CanaryMonitor(strictness="error")
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        for i in range(6):
            monitor.check(i, learner, _noisy(learner, rng, 1e-3), batch_k3=1e-6 * 10**i)
            learner = _moved(learner, rng)
    said = [r for r in caplog.records if "policy_moving" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert said[0].getMessage().startswith("precision_plugin: canary at step 2: policy_moving")


def test_strict_raises_a_canary_alarm_error_with_the_verdict() -> None:
    rng = random.Random(2)
    learner = _logps(rng)
    monitor = CanaryMonitor(strictness="error")
    rollout = _noisy(learner, rng, 1e-3)
    with pytest.raises(CanaryAlarmError, match="weights_out_of_sync") as info:
        for step in (0, 5, 10, 15):
            monitor.check(step, learner, rollout)
            learner = _moved(learner, rng)
    assert (info.value.verdict, info.value.step, info.value.stale_since) == (
        "weights_out_of_sync", 10, 0,
    )  # fmt: skip


def test_sides_of_different_tokens_are_refused() -> None:
    with pytest.raises(PrecisionConfigError, match="different tokens"):
        CanaryMonitor().check(0, [[-1.0, -2.0]], [[-1.0]])


def test_metrics_of_a_check() -> None:
    monitor = CanaryMonitor()
    check = monitor.check(0, [[-1.0, -2.0]], [[-1.0, -2.0]])
    assert check.metrics() == {
        "canary_k3": 0.0,
        "canary_bitwise_equal_frac": 1.0,
        "canary_ratio": 1.0,
        "canary_in_band": 1.0,
        "canary_verdict": 0.0,
    }


def test_the_precision_reference_keeps_growing_rounding_in_band() -> None:
    # The rounding of both engines grows 1.25x per check (the weights grow while training): the
    # raw k3 leaves its band, the k3 over the learner's float32 reference does not.
    rng = random.Random(6)
    learner = _logps(rng)
    plain, referenced = CanaryMonitor(), CanaryMonitor()
    for i in range(20):
        scale = 1e-3 * 1.25**i
        rollout, reference = _noisy(learner, rng, scale), _noisy(learner, rng, scale)
        plain.check(i * 5, learner, rollout)
        referenced.check(i * 5, learner, rollout, reference=reference)
        learner = _moved(learner, rng)
    assert plain.alarm is not None
    assert referenced.alarm is None and referenced.band is not None
    assert referenced.band.normalized and referenced.band.floor == pytest.approx(
        referenced.checks[0].k3 / referenced.checks[0].reference_k3, rel=1e-12
    )


def test_k3_terms_past_float64_are_infinite_not_an_error() -> None:
    """A near-greedy rollout gives log-ratios of thousands of nats: e^d overflows a float64
    (from d = log(max float) = 709.78...), and every k3 sum says ``inf`` instead of raising."""
    from precision_plugin._core.metrics.k3 import k3_term
    from precision_plugin.probe.attribution.decompose import k3_interval
    from precision_plugin.probe.length import length_effect

    assert k3_term(709.78) == math.expm1(709.78) - 709.78
    assert k3_term(709.79) == math.inf and k3_term(1e9) == math.inf
    assert k3_term(-1e9) == 1e9 - 1 and k3_term(-math.inf) == math.inf
    assert k3_term(1e-3) == math.expm1(1e-3) - 1e-3
    assert token_k3([[1000.0]], [[0.0]]) == [math.inf]
    # decompose's d is side minus reference, so the learner's 1,000 nats more is d = -1,000
    assert k3_interval([[-1000.0, 0.0], [0.0]], resamples=4).value == math.inf
    assert length_effect([[1000.0, 0.0]], [[0.0, 0.0]]).sequences == 1
