"""The DeepSpeed adapter's hooks: install the config entry, collect the engine's loss-scale
telemetry, and doctor findings. DeepSpeed is imported lazily; without it every hook does nothing."""

from __future__ import annotations

from typing import Any

from precision_plugin._base.patching import Patcher
from precision_plugin._base.report import Finding
from precision_plugin._base.versions import installed_version
from precision_plugin.deepspeed.doctor import doctor_findings
from precision_plugin.deepspeed.install import install
from precision_plugin.deepspeed.telemetry import engine_scaler_stats, find_engine
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy


@hookimpl
def precision_install(policy: PrecisionPolicy, patcher: Patcher) -> None:
    """Apply the config entry in ``deepspeed.initialize`` and where HF/Accelerate build configs."""
    if installed_version("deepspeed") is not None:
        install(policy, patcher)


@hookimpl
def precision_collect_metrics(policy: PrecisionPolicy, trainer: Any) -> dict[str, float] | None:
    """``loss_scale``, ``skipped_steps``, ... of the trainer's DeepSpeed engine."""
    engine = find_engine(trainer)
    if engine is None:
        return None
    return engine_scaler_stats(engine).as_metrics()


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding] | None:
    """DeepSpeed's version, what ``enable()`` changes, and whether this device can run fp16."""
    return doctor_findings(policy)
