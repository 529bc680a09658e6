"""``precision-plugin probe --attribute``: why the mismatch is still there, cause by cause.

- [`settings`][precision_plugin.probe.attribution.settings]: ``--rollout KEY=VALUE,...``;
- [`variants`][precision_plugin.probe.attribution.variants]: rollout copies with one component
  switched;
- [`measure`][precision_plugin.probe.attribution.measure]: the measurement per dtype;
- [`decompose`][precision_plugin.probe.attribution.decompose]: the arithmetic;
- [`fixes`][precision_plugin.probe.attribution.fixes]: each cause's fix per framework and which
  to change first;
- [`report`][precision_plugin.probe.attribution.report] and
  [`render`][precision_plugin.probe.attribution.render]: the results and their table.
"""

from __future__ import annotations

from precision_plugin.probe.attribution.decompose import Decomposition, decompose, k3_interval
from precision_plugin.probe.attribution.fixes import CAUSE_TABLE, CAUSES, FirstChange, first_change
from precision_plugin.probe.attribution.measure import attribute, attribute_dtype, rollout_samples
from precision_plugin.probe.attribution.report import AttributionReport, CauseRow, DtypeAttribution
from precision_plugin.probe.attribution.settings import (
    DEFAULT_LEARNING_RATE,
    RolloutSettings,
    parse_rollout,
)

__all__ = [
    "CAUSES",
    "CAUSE_TABLE",
    "DEFAULT_LEARNING_RATE",
    "AttributionReport",
    "CauseRow",
    "Decomposition",
    "DtypeAttribution",
    "FirstChange",
    "RolloutSettings",
    "attribute",
    "attribute_dtype",
    "decompose",
    "first_change",
    "k3_interval",
    "parse_rollout",
    "rollout_samples",
]
