"""``precision-plugin doctor`` findings for DeepSpeed: version, what ``enable()`` changes, and
whether DeepSpeed's accelerator can run fp16."""

from __future__ import annotations

from precision_plugin._base.report import Finding
from precision_plugin._base.versions import installed_version
from precision_plugin.deepspeed.config import SECTION, translated
from precision_plugin.deepspeed.device import (
    build_notice,
    deepspeed_support,
    pending_cpu_build,
    unsupported_message,
    ways_out,
)
from precision_plugin.errors import PrecisionPluginError
from precision_plugin.policy import PrecisionPolicy


def doctor_findings(policy: PrecisionPolicy) -> list[Finding] | None:
    """DeepSpeed's version, what ``enable()`` changes, and whether this device can run fp16."""
    version = installed_version("deepspeed")
    if version is None:
        return None
    findings = [Finding("deepspeed", "info", f"deepspeed {version} installed")]
    try:
        mapped = translated({}, policy)
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
                f"{policy.loss_scaler.max_skips_at_min} consecutive skipped steps that leave "
                f"the loss scale at its floor ({policy.loss_scaler.min_scale:g}) "
                + (
                    "stops the run with an actionable error"
                    if policy.loss_scaler.on_min_scale == "error"
                    else "logs a warning and continues"
                )
                + " (DeepSpeed alone exits on the first overflow at the floor); "
                "precision/loss_scale and precision/skipped_steps are logged",
            )
        )
    if policy.dtype != "float32":
        findings.extend(_device_findings(policy))
    pending = pending_cpu_build()
    if pending is not None:
        findings.append(Finding("deepspeed", "info", build_notice(pending)))
    return findings


def _device_findings(policy: PrecisionPolicy) -> list[Finding]:
    """Whether DeepSpeed's accelerator runs the policy dtype (most CPUs cannot run fp16)."""
    support = deepspeed_support()
    how = "asked DeepSpeed" if support.source == "deepspeed" else "DeepSpeed's rules, not imported"
    ok = support.supports(policy.dtype)
    details = {"accelerator": support.accelerator, "source": support.source}
    if ok is None:
        return [
            Finding(
                "deepspeed",
                "info",
                f"whether DeepSpeed's {support.accelerator} accelerator runs {policy.dtype} "
                f"could not be told without importing DeepSpeed",
                details=details,
            )
        ]
    if ok:
        return [
            Finding(
                "deepspeed",
                "ok",
                f"DeepSpeed's {support.accelerator} accelerator runs {policy.dtype} ({how})",
                details=details,
            )
        ]
    return [
        Finding(
            "deepspeed",
            "error",
            f"{unsupported_message(policy, support)} ({how})",
            fix=ways_out(policy, support),
            details=details,
        )
    ]
