"""Trainer-side scoring: the sampled tokens scored the way a trainer does (fp32 master weights,
one full-sequence forward under autocast), and the mismatch against the rollout's log-probs."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from precision_plugin._base.boundary import (
    at_least,
    checked,
    dtype_name,
    torch_device,
    torch_module,
)
from precision_plugin._core.hf_engine import RolloutSample
from precision_plugin._core.metrics.mismatch import MismatchMetrics, compute_mismatch
from precision_plugin._core.scoring import HFScorer, sequences_of
from precision_plugin._core.scoring.hf import CHUNK_LOGITS, LMHead, lm_head_of, trainer_precision
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import MetricSettings
from precision_plugin.probe.schema import SelfCheck

__all__ = [
    "CHUNK_LOGITS",
    "LMHead",
    "lm_head_of",
    "measure",
    "padded",
    "self_check",
    "trainer_logprobs",
    "trainer_precision",
]

log = logging.getLogger("precision_plugin")


@checked(
    model=torch_module,
    dtype=dtype_name,
    device=torch_device,
    batch_size=at_least(1),
    chunk_logits=at_least(1),
)
def trainer_logprobs(
    model: Any,
    samples: Sequence[RolloutSample],
    dtype: str,
    device: str,
    *,
    batch_size: int = 1,
    chunk_logits: int = CHUNK_LOGITS,
) -> list[list[float]]:
    """Score each sample's completion with a full-sequence forward, as a trainer does.

    One forward per ``batch_size`` sequences (default one: no padding at all), under
    ``torch.autocast(dtype)``: the core [`HFScorer`][precision_plugin._core.scoring.HFScorer]'s
    prefill (left padding, position ids from each row's first real token, the LM head and a
    float32 ``log_softmax`` a few positions at a time, so no ``[T, vocab]`` tensor is built).
    """
    del device  # the model's own device
    scorer = HFScorer(model, autocast=dtype, batch_size=batch_size, chunk_logits=chunk_logits)
    return scorer.score(sequences_of(samples))


def padded(rows: Sequence[Sequence[float]]) -> tuple[Any, Any]:
    """Ragged per-sequence values as a NaN-padded float64 ``[rows, width]`` tensor and the
    mask of the real entries."""
    import torch

    width = max((len(r) for r in rows), default=0)
    values = torch.full((len(rows), max(width, 1)), math.nan, dtype=torch.float64)
    mask = torch.zeros_like(values, dtype=torch.bool)
    for i, row in enumerate(rows):
        values[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
        mask[i, : len(row)] = True
    return values, mask


@checked
def measure(
    train: Sequence[Sequence[float]], rollout: Sequence[Sequence[float]]
) -> MismatchMetrics:
    """``compute_mismatch`` over ragged per-sequence log-prob lists (the same tokens on both
    sides: sequence ``i`` has as many log-probs in ``train`` as in ``rollout``)."""
    if [len(r) for r in train] != [len(r) for r in rollout]:
        raise PrecisionConfigError(
            f"measure(): arguments 'train' and 'rollout' hold {len(train)} and {len(rollout)} "
            f"sequences of different lengths; pass the log-probs of the same tokens on both sides."
        )
    train_t, mask = padded(train)
    roll_t, _ = padded(rollout)
    return compute_mismatch(train_t, roll_t, mask)


@checked
def self_check(metrics: MismatchMetrics, settings: MetricSettings) -> SelfCheck:
    """Judge the float32 run: both paths must agree to rounding noise (k3 below the threshold)."""
    threshold = settings.self_check_k3_max
    k3 = metrics.k3_kl
    if metrics.tokens == 0 or not math.isfinite(k3):
        return SelfCheck(False, k3, threshold, "float32 self-check: no comparable tokens.")
    if k3 <= threshold:
        return SelfCheck(
            True, k3, threshold, f"float32 paths agree (k3 {k3:.2e} <= {threshold:g})."
        )
    return SelfCheck(
        False,
        k3,
        threshold,
        f"float32 self-check FAILED: k3 {k3:.2e} > {threshold:g}, so the rollout and trainer "
        f"paths differ for a reason other than precision (padding, attention mask, position "
        f"ids, temperature or sampling settings, TF32 matmuls, different weights) and the "
        f"other dtypes' numbers are not a precision measurement.",
    )


# -- the run ---------------------------------------------------------------------------------
