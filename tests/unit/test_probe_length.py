"""The length effect: buckets with enough sequences, the drift per 1K tokens that recovers a
known trend, and per-bucket figures pinned to values computed by hand."""

from __future__ import annotations

import math
import random

import pytest
import torch

from precision_plugin._core.metrics.mismatch import drift_fit, drift_per_1k
from precision_plugin.probe.length import MIN_PER_BUCKET, fit_slope, length_effect


def _rows(lengths: list[int], drift_per_token: float, noise: float, seed: int = 0):
    """Trainer and rollout log-probs whose per-sequence log-ratio is drift * length + noise."""
    rng = random.Random(seed)
    train, rollout = [], []
    for n in lengths:
        roll = [-rng.uniform(0.5, 5.0) for _ in range(n)]
        shift = [drift_per_token + rng.gauss(0.0, noise) for _ in range(n)]
        rollout.append(roll)
        train.append([r + s for r, s in zip(roll, shift, strict=True)])
    return train, rollout


def test_buckets_hold_enough_sequences_and_cover_every_length() -> None:
    lengths = [64 * (i + 1) for i in range(32)]  # 64 .. 2048
    train, rollout = _rows(lengths, 1e-4, 1e-3)
    effect = length_effect(train, rollout)
    assert effect.sequences == 32
    assert len(effect.buckets) == 32 // MIN_PER_BUCKET
    assert all(b.sequences == MIN_PER_BUCKET for b in effect.buckets)
    assert sum(b.tokens for b in effect.buckets) == sum(lengths)
    assert [b.min_length for b in effect.buckets] == sorted(b.min_length for b in effect.buckets)
    assert all(b.min_length <= b.mean_length <= b.max_length for b in effect.buckets)
    # A drift per token of 1e-4 is 0.1 per 1K tokens: the drift recovers it within its error,
    # more precisely than the least-squares slope of the sequence sums.
    assert effect.drift_per_1k == pytest.approx(0.1, abs=4 * effect.drift_per_1k_se)
    assert effect.slope_per_1k == pytest.approx(0.1, abs=4 * effect.slope_stderr_per_1k)
    assert 0 < effect.drift_per_1k_se < effect.slope_stderr_per_1k


def test_slope_matches_least_squares_and_its_standard_error() -> None:
    xs = [float(x) for x in range(1, 41)]
    rng = random.Random(1)
    ys = [0.3 * x + rng.gauss(0, 2.0) for x in xs]
    slope, stderr = fit_slope(xs, ys)
    x = torch.tensor(xs, dtype=torch.float64)
    design = torch.stack([x, torch.ones_like(x)], dim=1)
    y = torch.tensor(ys, dtype=torch.float64)
    coef = torch.linalg.lstsq(design, y[:, None]).solution[:, 0]
    residual = y - design @ coef
    expected_se = math.sqrt(
        float(residual @ residual) / (len(xs) - 2) / float(((x - x.mean()) ** 2).sum())
    )
    assert slope == pytest.approx(float(coef[0]), rel=1e-9)
    assert stderr == pytest.approx(expected_se, rel=1e-9)


def test_nan_tokens_are_left_out_and_empty_input_is_handled() -> None:
    train, rollout = [[-1.0, math.nan, -2.0]], [[-1.5, -1.0, -2.5]]
    effect = length_effect(train, rollout)
    assert effect.sequences == 1 and effect.buckets[0].tokens == 2
    assert effect.buckets[0].mean_log_ratio == pytest.approx(1.0)
    assert effect.drift_per_1k == pytest.approx(500.0) and math.isnan(effect.drift_per_1k_se)
    assert math.isnan(effect.slope_per_1k)
    assert length_effect([], []).sequences == 0
    assert length_effect([[]], [[]]).buckets == []


def test_bucket_figures_are_token_weighted_exactly() -> None:
    """Two buckets of two sequences of different lengths: the bucket's k3 and drift are means
    over its tokens (a mean of per-sequence means would weight the short sequence's tokens up)."""
    d = {  # log π − log μ of every token, by sequence
        "a": [0.1, -0.2],
        "b": [0.05, 0.05, 0.05, -0.3, 0.0, 0.02],
        "c": [-0.01] * 8,
        "d": [0.2] + [0.0] * 9,
    }
    rollout = [[-1.0] * len(v) for v in d.values()]
    train = [
        [r + x for r, x in zip(roll, v, strict=True)]
        for roll, v in zip(rollout, d.values(), strict=True)
    ]
    effect = length_effect(train, rollout, num_buckets=2)
    short, long_ = effect.buckets

    def k3(values):
        return sum(math.expm1(v) - v for v in values)

    a, b, c, e = d["a"], d["b"], d["c"], d["d"]
    assert (short.min_length, short.max_length, short.tokens) == (2, 6, 8)
    assert (long_.min_length, long_.max_length, long_.tokens) == (8, 10, 18)
    assert short.k3_kl == pytest.approx((k3(a) + k3(b)) / 8, rel=1e-12)
    assert long_.k3_kl == pytest.approx((k3(c) + k3(e)) / 18, rel=1e-12)
    assert short.k3_kl != pytest.approx((k3(a) / 2 + k3(b) / 6) / 2, rel=1e-3)  # per sequence
    assert short.drift_per_1k == pytest.approx(1000 * (sum(a) + sum(b)) / 8, rel=1e-12)
    assert long_.drift_per_1k == pytest.approx(1000 * (sum(c) + sum(e)) / 18, rel=1e-12)
    assert short.mean_log_ratio == pytest.approx((sum(a) + sum(b)) / 2, rel=1e-12)
    assert short.std_log_ratio == pytest.approx(abs(sum(a) - sum(b)) / math.sqrt(2), rel=1e-12)
    sums = [sum(v) for v in d.values()]
    lengths = [len(v) for v in d.values()]
    r = sum(sums) / sum(lengths)
    variance = sum((s - r * n) ** 2 / n for s, n in zip(sums, lengths, strict=True)) / 3
    se = math.sqrt(variance / sum(lengths))
    assert effect.drift_per_1k == pytest.approx(1000 * r, rel=1e-12)
    assert effect.drift_per_1k_se == pytest.approx(1000 * se, rel=1e-12)
    slope, slope_se = fit_slope([float(n) for n in lengths], sums)
    assert (effect.slope_per_1k, effect.slope_stderr_per_1k) == pytest.approx(
        (1000 * slope, 1000 * slope_se), rel=1e-12
    )


def test_drift_fit_leaves_sequences_without_tokens_out() -> None:
    """``drift = ΣS/ΣL``, ``variance = Σ(S − drift·L)²/L/(n − 1)``, ``se = sqrt(variance/ΣL)``
    over the sequences that have tokens: a sequence of length 0 changes none of them."""
    lengths, sums = [0, 2, 4, 3], [0.0, 0.2, 0.6, -0.3]
    drift = 0.5 / 9
    variance = ((0.2 - 2 * drift) ** 2 / 2 + (0.6 - 4 * drift) ** 2 / 4
                + (-0.3 - 3 * drift) ** 2 / 3) / 2  # fmt: skip
    assert drift_fit(lengths, sums) == pytest.approx(
        (drift, math.sqrt(variance / 9), variance), rel=1e-12
    )
    assert drift_per_1k(lengths, sums) == pytest.approx(
        (1000 * drift, 1000 * math.sqrt(variance / 9)), rel=1e-12
    )
    assert all(math.isnan(v) for v in drift_fit([0, 0], [0.0, 0.0]))
