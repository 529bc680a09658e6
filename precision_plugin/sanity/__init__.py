"""The sanity benchmark: FP16 vs BF16 GRPO on a task the model already partly solves.

``precision-plugin sanity`` pretrains a tiny Llama (built in code) on a string-reversal task
to partial accuracy, then runs TRL's ``GRPOTrainer`` with the plugin and ``HFRollout`` in each
dtype from identical weights and seeds, recording reward and the ``precision/*`` metrics per
step. Modules: ``task`` (problems, reward), ``model``, ``pretrain``, ``run``, ``schema``,
``plot``, ``table``.
"""

from __future__ import annotations

from precision_plugin.sanity.run import check_engine, run_sanity, smoke_config
from precision_plugin.sanity.schema import (
    DtypeRun,
    SanityConfig,
    SanityResult,
    StepRecord,
    missing_fields,
)

__all__ = [
    "DtypeRun",
    "SanityConfig",
    "SanityResult",
    "StepRecord",
    "check_engine",
    "missing_fields",
    "run_sanity",
    "smoke_config",
]
