"""The length effect: buckets with enough sequences, and slopes that recover a known trend."""

from __future__ import annotations

import math
import random

import pytest
import torch

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
    # A drift per token of 1e-4 is a slope of 0.1 per 1K tokens, recovered within its error.
    assert effect.slope_per_1k == pytest.approx(0.1, abs=4 * effect.slope_stderr_per_1k)
    assert 0 < effect.slope_stderr_per_1k < 0.05


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
    assert math.isnan(effect.slope_per_1k)
    assert length_effect([], []).sequences == 0
    assert length_effect([[]], [[]]).buckets == []
