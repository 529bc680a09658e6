"""The sanity benchmark: FP16 vs BF16 GRPO on a task the model already partly solves.

``precision-plugin sanity`` pretrains a small Llama (built in code) on a string task to partial
accuracy, then runs TRL's ``GRPOTrainer`` with the plugin and ``HFRollout`` in each dtype from
identical weights and seeds, for one or more seeds, recording reward, the ``precision/*``
metrics and (``long`` preset) the gradient-cosine readout per step. Modules: ``task``
(problems, reward), ``model``, ``pretrain``, ``mechanism`` (the gradient cosine), ``run``,
``schema`` (config, presets, results), ``aggregate`` (over seeds, the verdict), ``plot``,
``table``.
"""

from __future__ import annotations

from precision_plugin.sanity.run import check_engine, run_sanity
from precision_plugin.sanity.schema import (
    PRESETS,
    DtypeRun,
    SanityConfig,
    SanityResult,
    SeedRun,
    StepRecord,
    missing_fields,
    preset_config,
)

__all__ = [
    "PRESETS",
    "DtypeRun",
    "SanityConfig",
    "SanityResult",
    "SeedRun",
    "StepRecord",
    "check_engine",
    "missing_fields",
    "preset_config",
    "run_sanity",
]
