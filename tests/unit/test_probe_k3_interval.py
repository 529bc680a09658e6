"""The probe's per-sequence k3 parts and their 90 % interval over sequences (results files)."""

from __future__ import annotations

import math

from precision_plugin.probe.schema import k3_interval, sequence_k3


def test_sequence_k3_sums_each_sequences_k3_terms_over_its_finite_tokens():
    train = [[0.0, -1.0, math.nan], [-2.0]]
    rollout = [[0.0, -1.5, -0.1], [-1.0]]
    assert sequence_k3(train, rollout) == [math.expm1(0.5) - 0.5, math.expm1(-1.0) + 1.0]


def test_the_interval_resamples_whole_sequences():
    # Two one-token sequences with k3 1 and 3: a resample's mean is 1, 2 or 3 with probability
    # 1/4, 1/2, 1/4, so the 5 % and 95 % quantiles of 2,000 resamples are 1 and 3.
    assert k3_interval([1.0, 3.0], [1, 1]) == (1.0, 3.0)
    # Token-weighted: a 3-token sequence of total 3 and a 1-token one of total 1 are both 1/token.
    assert k3_interval([3.0, 1.0], [3, 1]) == (1.0, 1.0)


def test_no_interval_from_one_sequence_or_a_non_finite_part():
    assert k3_interval([1.0], [4]) is None
    assert k3_interval([1.0, 2.0], [4, 0]) is None  # an empty sequence is left out
    assert k3_interval([1.0, math.inf], [1, 1]) is None
