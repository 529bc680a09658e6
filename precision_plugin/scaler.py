"""Loss-scaler telemetry shared by every learner backend (torch GradScaler, DeepSpeed, ...).

(The scaler factory and torch-GradScaler telemetry are added on top of this by the learner work.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
        """Metric names without prefix, as ``PrecisionCallback`` logs them (``precision/<name>``)."""
        return {
            "loss_scale": float(self.scale),
            "skipped_steps": float(self.skipped_steps),
            "consecutive_skips": float(self.consecutive_skips),
            "overflow_count": float(self.overflow_count),
        }

    def to_dict(self) -> dict[str, float | int | bool]:
        """Plain-dict form (for checkpoints and JSON)."""
        return asdict(self)
