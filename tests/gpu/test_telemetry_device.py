"""The TRL telemetry accumulator stays on the training device (skipped without CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from precision_plugin._core.metrics.mismatch import compute_mismatch  # noqa: E402
from precision_plugin.trl.telemetry import MismatchAccumulator  # noqa: E402

pytestmark = pytest.mark.gpu


def test_accumulator_sums_on_the_gpu_and_flushes_the_cpu_figures():
    gen = torch.Generator().manual_seed(0)
    train = -torch.rand(3, 7, generator=gen, dtype=torch.float64) - 1.0  # log-probs <= 0
    rollout = train + 0.01 * torch.randn(3, 7, generator=gen, dtype=torch.float64)
    mask = torch.ones(3, 7)
    mask[1, 4:] = 0
    acc = MismatchAccumulator()
    acc.add(train[:2].cuda(), rollout[:2].cuda(), mask[:2].cuda())
    acc.add(train[2:].cuda(), rollout[2:].cuda(), mask[2:].cuda())
    assert acc.sums.device.type == "cuda" and acc.maxima.device.type == "cuda"
    flushed = acc.flush()
    keep = mask.bool()
    expected = compute_mismatch(train[keep].tolist(), rollout[keep].tolist()).to_dict()
    assert flushed["tokens"] == expected["tokens"] == 19
    assert flushed["k3_kl"] == pytest.approx(expected["k3_kl"], rel=1e-12)
