"""``precision-plugin doctor`` findings for vLLM: what is installed, what TRL supports, the
cascade-attention verdict, and what ``enable()`` would change. Imports nothing from vLLM."""

from __future__ import annotations

import importlib.metadata as metadata
import os

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet

from precision_plugin import versions
from precision_plugin.policy import ENV_VAR, PrecisionPolicy
from precision_plugin.report import Finding
from precision_plugin.vllm.engine import cascade_guard

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_NAME = "precision_plugin"


def declared_vllm_range(module: str) -> SpecifierSet | None:
    """The vLLM range the installed package ``module`` declares (the first ``vllm``
    requirement with a version, e.g. of its ``[vllm]`` extra), or ``None``."""
    info = versions.package_info(module)
    if info is None:
        return None
    for line in metadata.requires(info.distribution) or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() == "vllm" and req.specifier:
            return req.specifier
    return None


def trl_vllm_range() -> SpecifierSet | None:
    """The vLLM range the installed TRL declares (its ``trl[vllm]`` extra), or ``None``.

    TRL 1.16 states it twice, identically: ``Requires-Dist: vllm<=0.31.0,>=0.22.0; extra ==
    "vllm"`` and the warning in ``trl.import_utils.is_vllm_available``.
    """
    return declared_vllm_range("trl")


def doctor_findings(policy: PrecisionPolicy) -> list[Finding]:
    """Findings for ``precision-plugin doctor``; empty when vLLM is not installed."""
    info = versions.package_info("vllm")
    if info is None:
        return []
    findings = [
        Finding(
            "vllm",
            "info",
            f"vLLM {info.version} installed (distribution {info.distribution!r}).",
            details={"version": str(info.version), "distribution": info.distribution},
        )
    ]
    supported = trl_vllm_range()
    trl = versions.package_info("trl")
    if supported is not None and trl is not None:
        base = type(info.version)(info.version.base_version)
        if base in supported:
            findings.append(
                Finding("vllm", "ok", f"TRL {trl.version} supports vLLM {supported}: yes.")
            )
        else:
            findings.append(
                Finding(
                    "vllm",
                    "warning",
                    f"TRL {trl.version} supports vLLM {supported}; vLLM {info.version} is "
                    f"outside that range (TRL warns and its server/colocate code may break).",
                    fix=f"pip install 'vllm{supported}'",
                    details={"trl_range": str(supported)},
                )
            )

    decision = cascade_guard(policy)
    if decision.disables:
        status = "change"
    elif decision.era in ("buggy", "no_flag") and policy.vllm.cascade_guard == "off":
        status = "warning"
    else:
        status = "ok"
    findings.append(
        Finding(
            "vllm",
            status,  # type: ignore[arg-type]
            decision.summary(),
            fix="upgrade vLLM to >= 0.11" if status == "warning" else "",
            details={"action": decision.action, "era": decision.era},
        )
    )

    if policy.vllm.enforce_dtype:
        findings.append(
            Finding(
                "vllm",
                "change",
                f"enable() sets dtype={policy.dtype} on every vLLM engine of the process "
                f"(TRL's colocated LLM(...) passes none and would follow the checkpoint) and "
                f"exports {ENV_VAR} to the processes vLLM starts.",
            )
        )
    if not versions.entry_point_registered(ENTRY_POINT_GROUP, ENTRY_POINT_NAME):
        findings.append(
            Finding(
                "vllm",
                "warning",
                "The vllm.general_plugins entry point of precision_plugin is not registered: "
                "vllm serve / trl vllm-serve processes will not be reached.",
                fix="reinstall precision_plugin (pip install <path to the precision_plugin "
                "repository>, or a wheel built from it)",
            )
        )
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and ENTRY_POINT_NAME not in [p.strip() for p in allowed.split(",")]:
        findings.append(
            Finding(
                "vllm",
                "warning",
                f"VLLM_PLUGINS={allowed!r} does not name {ENTRY_POINT_NAME}: vLLM will not load "
                f"the plugin, so servers are not enforced.",
                fix=f"add {ENTRY_POINT_NAME} to VLLM_PLUGINS",
            )
        )
    env = os.environ.get(ENV_VAR)
    findings.append(
        Finding(
            "vllm",
            "info",
            f"{ENV_VAR}={env!r}: vLLM servers started from this shell "
            + ("are enforced." if PrecisionPolicy.from_env() else "are not enforced."),
        )
    )
    return findings
