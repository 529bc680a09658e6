"""TRL: TRL configs follow the policy, GRPO runs log the train/rollout mismatch, and
``HFRollout`` samples in the policy dtype without vLLM.

Public API:

- [`HFRollout`][precision_plugin.trl.HFRollout]: a ``GRPOTrainer(rollout_func=...)`` that samples
  from a copy of the learner in the policy dtype, with the log-prob of every sampled token.
- [`alias_metrics`][precision_plugin.trl.alias_metrics]: TRL's own mismatch metrics under the
  plugin's names.

The package, by concern: ``adapter`` (the pluggy hooks ``enable()`` registers: config flags,
the telemetry wrappers, doctor findings), ``telemetry`` (the mismatch measured from tensors
``GRPOTrainer`` already has) and ``rollout`` (``HFRollout``). TRL itself is imported lazily.
"""

from precision_plugin.trl.adapter import TRL_METRIC_ALIASES, alias_metrics
from precision_plugin.trl.rollout import HFRollout

__all__ = ["TRL_METRIC_ALIASES", "HFRollout", "alias_metrics"]
