"""Helpers shared by the overflow tools: float16's range and the floating tensors in a module's
inputs or outputs (tensors, tuples, lists, dicts and ``ModelOutput``; cache objects are skipped).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from precision_plugin._base.boundary import Invalid, Validator, checked

#: The largest finite float16 value.
FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504.0


def floating_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every floating-point tensor in ``value``, depth first (non-tensor leaves are ignored)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from floating_tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from floating_tensors(item)


def abs_max(value: Any) -> torch.Tensor | None:
    """The largest ``|x|`` over every floating tensor in ``value`` as a 0-d float32 tensor (no
    device sync; NaN propagates), or ``None`` when ``value`` holds no non-empty floating tensor."""
    maxima = [t.detach().abs().amax().float() for t in floating_tensors(value) if t.numel()]
    if not maxima:
        return None
    if len(maxima) == 1:
        return maxima[0]
    device = maxima[0].device
    return torch.stack([m.to(device) for m in maxima]).amax()


def _magnitude(value: float) -> float:
    if value < 0:
        raise Invalid(
            "is negative, and a largest |activation| cannot be; pass max |x| (abs_max), "
            "inf or NaN for an activation that overflowed"
        )
    return value


@checked(max_abs=Validator("a magnitude |x| >= 0 (inf/NaN: overflowed)", _magnitude, (-1.0,)))
def fp16_margin_bits(max_abs: float) -> float:
    """Headroom to float16's maximum in powers of two: ``log2(65504 / max_abs)``.

    ``inf`` for an all-zero activation, ``-inf`` for a non-finite one; negative means the value
    does not fit in float16.
    """
    if math.isnan(max_abs) or math.isinf(max_abs):
        return -math.inf
    if max_abs <= 0:
        return math.inf
    return math.log2(FP16_MAX / max_abs)


def autocast_device_types() -> list[str]:
    """Device types whose autocast is on right now."""
    found = []
    for device_type in ("cpu", "cuda", "xpu", "mps"):
        try:
            if torch.is_autocast_enabled(device_type):
                found.append(device_type)
        except (RuntimeError, TypeError):  # a device type this torch build does not know
            continue
    return found
