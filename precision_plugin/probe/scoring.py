"""Trainer-side scoring: the sampled tokens scored the way a trainer does (fp32 master weights,
one full-sequence forward under autocast), and the mismatch against the rollout's log-probs."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

from precision_plugin.mismatch import MismatchMetrics, compute_mismatch
from precision_plugin.policy import MetricSettings
from precision_plugin.probe.engine import RolloutSample
from precision_plugin.probe.schema import SelfCheck

log = logging.getLogger("precision_plugin")


@contextlib.contextmanager
def trainer_precision(dtype: str, device: str) -> Iterator[None]:
    """Autocast to ``dtype`` as a mixed-precision trainer does (nothing for float32)."""
    import torch

    if dtype == "float32":
        yield
        return
    with torch.autocast(device_type=device.split(":", 1)[0], dtype=getattr(torch, dtype)):
        yield


def trainer_logprobs(
    model: Any, samples: Sequence[RolloutSample], dtype: str, device: str
) -> list[list[float]]:
    """Score each sample's completion with one full-sequence forward, as a trainer does.

    One sequence per forward (no padding), all-ones attention mask, explicit position ids
    ``0..T-1``; log-softmax in float32 of the logits.
    """
    import torch

    out = []
    for sample in samples:
        if not sample.completion_ids:
            out.append([])
            continue
        ids = torch.tensor([sample.prompt_ids + sample.completion_ids], device=device)
        start, total = len(sample.prompt_ids), ids.shape[1]
        with torch.inference_mode(), trainer_precision(dtype, device):
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                position_ids=torch.arange(total, device=device).unsqueeze(0),
                use_cache=False,
            ).logits
        logp = torch.log_softmax(logits[0, start - 1 : total - 1].float(), dim=-1)
        target = ids[0, start:].unsqueeze(-1)
        out.append(logp.gather(-1, target).squeeze(-1).tolist())
    return out


def _padded(rows: Sequence[Sequence[float]]) -> tuple[Any, Any]:
    import torch

    width = max((len(r) for r in rows), default=0)
    values = torch.full((len(rows), max(width, 1)), math.nan, dtype=torch.float64)
    mask = torch.zeros_like(values, dtype=torch.bool)
    for i, row in enumerate(rows):
        values[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
        mask[i, : len(row)] = True
    return values, mask


def measure(
    train: Sequence[Sequence[float]], rollout: Sequence[Sequence[float]]
) -> MismatchMetrics:
    """``compute_mismatch`` over ragged per-sequence log-prob lists."""
    train_t, mask = _padded(train)
    roll_t, _ = _padded(rollout)
    return compute_mismatch(train_t, roll_t, mask)


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
