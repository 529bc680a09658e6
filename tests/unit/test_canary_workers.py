"""The tensor hook points for verl/OpenRLHF workers (precision_plugin._core.canary.workers)."""

from __future__ import annotations

import math

import pytest
import torch

from precision_plugin._core.canary import CanaryMonitor
from precision_plugin._core.canary.workers import batch_metrics, check_canary, masked_rows
from precision_plugin.errors import PrecisionConfigError

LEARNER = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -2.5, 9.0], [-0.5, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


def test_masked_rows_keep_the_masked_tokens_per_sequence() -> None:
    assert masked_rows(ROLLOUT, MASK) == [[-1.0, -2.5], [-0.5]]
    assert masked_rows([[1.5], [2.0, 3.0]]) == [[1.5], [2.0, 3.0]]
    with pytest.raises(PrecisionConfigError, match=r"shape \(2, 3\) and the mask \(2, 2\)"):
        masked_rows(ROLLOUT, MASK[:, :2])


def test_batch_metrics_count_bits_and_k3_over_masked_tokens() -> None:
    out = batch_metrics(LEARNER, ROLLOUT, MASK)
    assert out["bitwise_equal_frac"] == 2 / 3  # the padding (9.0 vs 0.0) is not counted
    d = 0.5  # -2.0 - (-2.5)
    assert out["k3_kl"] == pytest.approx((math.expm1(d) - d) / 3, rel=1e-15)


def test_check_canary_takes_tensors_and_scorer_lists() -> None:
    monitor = CanaryMonitor()
    floor = check_canary(monitor, 0, LEARNER, [[-1.0, -2.5], [-0.5]], MASK, reference=LEARNER)
    assert floor.bitwise_equal_frac == 2 / 3 and floor.in_band and floor.ratio == 1.0
    again = check_canary(monitor, 5, LEARNER, ROLLOUT, MASK, batch_k3=0.1)
    assert again.k3 == floor.k3 and again.batch_k3 == 0.1


def test_batch_metrics_refuse_sides_of_different_lengths_by_name() -> None:
    with pytest.raises(
        PrecisionConfigError,
        match=r"batch_metrics\(\): arguments 'learner' and 'rollout' differ in shape "
        r"\(learner: 1 rows of 2 tokens; rollout: 1 rows of 1 tokens\)",
    ):
        batch_metrics([[-1.0, -2.0]], [[-1.0]])
    with pytest.raises(
        PrecisionConfigError, match=r"'mask' differ in shape .*mask: shape \(2, 2\)"
    ):
        batch_metrics(LEARNER, ROLLOUT, MASK[:, :2])
