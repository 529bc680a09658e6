"""The probe's float32 self-check: its threshold on both sides, and a fault between the floor
(k3 ~1e-9) and the faults the other tests inject (k3 > 1e-4), so a threshold loosened even
1000x is caught."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from precision_plugin._core.hf_engine import HFRolloutEngine
from precision_plugin._core.metrics.mismatch import compute_mismatch
from precision_plugin.policy import MetricSettings
from precision_plugin.probe import ProbeConfig, RolloutSample, run_probe, self_check

THRESHOLD = MetricSettings().self_check_k3_max


def _metrics_with_k3(k3: float) -> Any:
    base = compute_mismatch([[-1.0, -2.0]], [[-1.0, -2.0]])
    return dataclasses.replace(base, k3_kl=k3)


@pytest.mark.parametrize(
    ("k3", "passed"),
    [
        (0.0, True),
        (THRESHOLD / 2, True),
        (THRESHOLD, True),  # at the threshold: "below or at" agrees
        (math.nextafter(THRESHOLD, math.inf), False),
        (THRESHOLD * 2, False),
        (THRESHOLD * 10, False),
        (1e-4, False),
        (math.inf, False),
        (math.nan, False),
    ],
)
def test_the_threshold_on_both_sides(k3: float, passed: bool) -> None:
    check = self_check(_metrics_with_k3(k3), MetricSettings())
    assert check.passed is passed
    assert check.threshold == THRESHOLD == 1e-6
    assert ("FAILED" in check.message or "no comparable" in check.message) is not passed


def test_the_threshold_follows_the_policy() -> None:
    strict = MetricSettings(self_check_k3_max=1e-9)
    assert not self_check(_metrics_with_k3(5e-9), strict).passed
    assert self_check(_metrics_with_k3(5e-9), MetricSettings()).passed


#: Log-prob offset (nats) of the faulty engine: k3 = e^-d - 1 + d ~ d^2/2 = 1.0e-5, ten times
#: the threshold and ten times below the smallest fault the integration tests inject.
OFFSET = 4.5e-3


class _SlightlyOffEngine(HFRolloutEngine):
    """Reports every log-prob 0.0045 nats too high, as a rollout engine with a slightly
    different softmax (a temperature of ~1.001, a fused kernel's rounding) would."""

    def generate(self, prompts: Any, max_new_tokens: int, seed: int) -> list[RolloutSample]:
        return [
            RolloutSample(s.prompt_ids, s.completion_ids, [lp + OFFSET for lp in s.logprobs])
            for s in super().generate(prompts, max_new_tokens, seed)
        ]


def _factory(model_path: str, dtype: str, device: str, seed: int) -> HFRolloutEngine:
    return _SlightlyOffEngine.from_pretrained(model_path, dtype, device)


def test_a_fault_between_the_floor_and_the_big_faults_invalidates_the_run() -> None:
    result = run_probe(
        ProbeConfig(engine="off", dtypes=("float32",), num_prompts=2, max_new_tokens=8),
        engines={"off": _factory},
    )
    k3 = result.self_check.k3_kl
    assert 1e-6 < k3 < 1e-4
    assert k3 == pytest.approx(math.exp(-OFFSET) - 1 + OFFSET, rel=1e-3)
    assert not result.valid and "FAILED" in result.self_check.message
    assert result.results["float32"].verdict == "invalid"
