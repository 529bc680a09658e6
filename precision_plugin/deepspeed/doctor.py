"""``precision-plugin doctor`` findings for DeepSpeed: version, what ``enable()`` changes, and
whether DeepSpeed's accelerator can run fp16."""

from __future__ import annotations

import sys

from precision_plugin.deepspeed.config import SECTION, apply_config
from precision_plugin.errors import PrecisionPluginError
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.report import Finding
from precision_plugin.versions import installed_version


def doctor_findings(policy: PrecisionPolicy) -> list[Finding] | None:
    """DeepSpeed's version, what ``enable()`` changes, and whether this device can run fp16."""
    version = installed_version("deepspeed")
    if version is None:
        return None
    findings = [Finding("deepspeed", "info", f"deepspeed {version} installed")]
    try:
        mapped = apply_config({}, policy)
    except PrecisionPluginError as exc:  # a setting DeepSpeed cannot run (strictness="error")
        findings.append(Finding("deepspeed", "error", str(exc)))
        return findings
    shown = {k: mapped[k] for k in ("fp16", "bf16") if k in mapped}
    findings.append(
        Finding(
            "deepspeed",
            "change",
            f"deepspeed.initialize (direct, Accelerate, HF Trainer) applies the "
            f'"{SECTION}" config entry: {shown}; conflicting fp16/bf16/torch_autocast settings '
            + ("are refused" if policy.strictness == "error" else "are coerced with a warning"),
            details={"config": shown},
        )
    )
    if policy.uses_loss_scaler:
        findings.append(
            Finding(
                "deepspeed",
                "change",
                f"a loss scale stuck at its floor ({policy.loss_scaler.min_scale:g}) for "
                f"{policy.loss_scaler.max_skips_at_min} skipped steps "
                + (
                    "stops the run with an actionable error"
                    if policy.loss_scaler.on_min_scale == "error"
                    else "logs a warning and continues"
                )
                + " (DeepSpeed alone exits on the first overflow at the floor); "
                "precision/loss_scale and precision/skipped_steps are logged",
            )
        )
        findings.extend(_device_findings(policy))
    return findings


def _device_findings(policy: PrecisionPolicy) -> list[Finding]:
    """Whether DeepSpeed's accelerator says it supports fp16 (CPUs often do not)."""
    if "deepspeed" not in sys.modules:
        return []  # importing DeepSpeed only to ask is slow and noisy; ask when it is loaded
    try:
        from deepspeed.accelerator import get_accelerator

        acc = get_accelerator()
        if acc.is_fp16_supported():
            return [Finding("deepspeed", "ok", f"{acc.device_name()} supports fp16 in DeepSpeed")]
    except Exception as exc:
        return [Finding("deepspeed", "warning", f"could not query DeepSpeed's accelerator: {exc}")]
    return [
        Finding(
            "deepspeed",
            "warning",
            f"DeepSpeed's {acc.device_name()} accelerator reports no fp16 support: engines with "
            f"fp16 enabled stop with 'Type fp16 is not supported on your device'",
            fix="run on a GPU, or on a CPU with AVX512-FP16/AMX-FP16; or enable(dtype='bfloat16')",
        )
    ]
