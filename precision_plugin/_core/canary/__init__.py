"""The drift canary and the precision ladder (framework-neutral).

- [`CanaryMonitor`][precision_plugin._core.canary.CanaryMonitor]: fixed canary tokens rescored by
  the rollout engine and the learner every K steps; its band, alarm and verdict
  (``weights_out_of_sync``, ``engine_state_drift``, or the ``policy_moving`` note);
- [`canary_band`][precision_plugin._core.canary.canary_band]: how far rounding alone moves the
  canary's k3 from its floor;
- [`certify_batch_invariance`][precision_plugin._core.canary.certify_batch_invariance] and
  [`precision_level`][precision_plugin._core.canary.precision_level]: the precision ladder
  (``precision/level``): 1 one dtype on every wire, 2 a batch-invariant rollout engine, 3 train
  == rollout bit for bit.

Built on ``precision_plugin._core.scoring`` (the scoring interface, the bitwise-equal metric, the
batch-1-against-N rescore); wired into TRL by ``precision_plugin.trl.canary``.
"""

from __future__ import annotations

from precision_plugin._core.canary.band import ABS_TOL, ALPHA, CanaryBand, canary_band, token_k3
from precision_plugin._core.canary.ladder import (
    Invariance,
    certify_batch_invariance,
    precision_level,
)
from precision_plugin._core.canary.monitor import VERDICT_CODES, CanaryCheck, CanaryMonitor

__all__ = [
    "ABS_TOL",
    "ALPHA",
    "VERDICT_CODES",
    "CanaryBand",
    "CanaryCheck",
    "CanaryMonitor",
    "Invariance",
    "canary_band",
    "certify_batch_invariance",
    "precision_level",
    "token_k3",
]
