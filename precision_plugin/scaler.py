"""Loss-scaler telemetry shared by every learner backend (torch GradScaler, DeepSpeed, ...).

(The scaler factory and torch-GradScaler telemetry are added on top of this by the learner work.)
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from precision_plugin.errors import LossScaleAtMinimumError
from precision_plugin.policy import LossScalerSettings

log = logging.getLogger("precision_plugin")


@dataclass(frozen=True)
class ScalerStats:
    """A snapshot of a dynamic loss scaler, whatever backend runs it.

    ``steps`` counts optimizer steps attempted; ``skipped_steps`` those dropped for inf/NaN
    gradients; ``consecutive_skips`` the current run of skips; ``overflow_count`` every overflow
    seen (DeepSpeed's hysteresis may absorb one without a skip); ``at_min_scale`` is true when
    the scale sits at the policy's floor.
    """

    scale: float
    steps: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    overflow_count: int = 0
    at_min_scale: bool = False

    def as_metrics(self) -> dict[str, float]:
        """Metrics without prefix; ``PrecisionCallback`` logs them as ``precision/<name>``."""
        return {
            "loss_scale": float(self.scale),
            "skipped_steps": float(self.skipped_steps),
            "consecutive_skips": float(self.consecutive_skips),
            "overflow_count": float(self.overflow_count),
        }

    def to_dict(self) -> dict[str, float | int | bool]:
        """Plain-dict form (for checkpoints and JSON)."""
        return asdict(self)


def check_scale_floor(stats: ScalerStats, settings: LossScalerSettings, *, backend: str) -> bool:
    """Act when the scale is stuck at its floor: the run only skips steps, it no longer learns.

    Returns ``True`` when the floor condition holds (``stats.at_min_scale`` and at least
    ``settings.max_skips_at_min`` consecutive skips). Then ``on_min_scale="error"`` raises
    :class:`LossScaleAtMinimumError`; ``"warn"`` logs a warning and returns ``True``.
    """
    if not (stats.at_min_scale and stats.consecutive_skips >= settings.max_skips_at_min):
        return False
    message = (
        f"precision_plugin: the {backend} loss scale is stuck at its minimum "
        f"({stats.scale:g}) and the last {stats.consecutive_skips} steps all overflowed "
        f"(inf/NaN gradients): the run is skipping every step, not learning. Usual causes: a "
        f"model that overflows fp16 in the forward pass (activations > 65504), a learning rate "
        f"that blew up the weights, or fp16 weights being unscaled. Fixes: check the loss for "
        f"inf/NaN, lower the learning rate, keep master weights in fp32 "
        f"(precision_plugin.prepare_model), or run this model in consistent bf16 "
        f"(enable(dtype='bfloat16')). To keep going anyway set "
        f"loss_scaler.on_min_scale='warn'."
    )
    if settings.on_min_scale == "error":
        raise LossScaleAtMinimumError(message)
    log.warning(message)
    return True
