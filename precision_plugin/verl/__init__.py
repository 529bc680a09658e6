"""verl adapter: one policy for verl's rollouts and learners, and a check of the composed config.

- :func:`overrides` - the Hydra overrides that make ``python -m verl.trainer.main_ppo`` follow
  the policy (also ``precision-plugin verl-overrides``).
- :func:`check_config` - every contradiction between a composed verl config and the policy,
  including verl >= 0.8's ignored ``fsdp_config.dtype``.
- ``precision_plugin.verl.plugin`` - the ``verl.plugins`` entry point (verl >= 0.9) that checks
  each worker's config inside verl's processes.

The package, by concern: ``layout`` (where each verl version keeps each precision key),
``overrides`` (the translation, pure), ``check`` (the config check), ``plugin`` (the in-worker
entry point), ``doctor`` and ``adapter`` (the hooks).

Nothing here imports verl; without verl the doctor hook reports nothing.
"""

from __future__ import annotations

from precision_plugin.verl.check import Contradiction, check_config, find_contradictions
from precision_plugin.verl.layout import Layout, layout
from precision_plugin.verl.overrides import overrides

__all__ = [
    "Contradiction",
    "Layout",
    "check_config",
    "find_contradictions",
    "layout",
    "overrides",
]
