"""FP16 overflow safety: headroom analysis, runtime overflow detection, selective fp32 fallback.

- :func:`headroom`: per module, the largest activation in float32 and its margin to float16's
  maximum (65504) in powers of two; flags modules below ``overflow.margin_bits``.
- :class:`OverflowDetector`: on sampled training steps, names the first module whose forward
  output is inf/NaN (:class:`~precision_plugin.errors.ForwardOverflowError` or a warning).
- :func:`keep_fp32_modules`: runs named modules in float32 outside fp16 autocast (learner only).
"""

from __future__ import annotations

from precision_plugin._core.overflow.detect import OverflowDetector, OverflowEvent
from precision_plugin._core.overflow.fallback import Fp32Fallback, keep_fp32_modules, match_modules
from precision_plugin._core.overflow.headroom import (
    HeadroomReport,
    ModuleHeadroom,
    Recommendation,
    headroom,
    recommend,
)
from precision_plugin._core.overflow.tensors import FP16_MAX, fp16_margin_bits

__all__ = [
    "FP16_MAX",
    "Fp32Fallback",
    "HeadroomReport",
    "ModuleHeadroom",
    "OverflowDetector",
    "OverflowEvent",
    "Recommendation",
    "fp16_margin_bits",
    "headroom",
    "keep_fp32_modules",
    "match_modules",
    "recommend",
]
