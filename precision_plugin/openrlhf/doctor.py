"""``precision-plugin doctor`` findings for OpenRLHF: the installed version, its hard-coded
engine dtype and weight sync, the vLLM it pins, and whether ``PRECISION_PLUGIN`` is set here.

Reads the installed OpenRLHF's source (``installed``); imports neither OpenRLHF nor vLLM.
"""

from __future__ import annotations

import shlex

from precision_plugin._base import versions
from precision_plugin._base.report import Finding
from precision_plugin.openrlhf.installed import installed
from precision_plugin.openrlhf.launch import env_value
from precision_plugin.openrlhf.layout import SUPPORTED_SINCE, layout
from precision_plugin.policy import ENV_VAR, PrecisionPolicy
from precision_plugin.vllm.doctor import declared_vllm_range

FRAMEWORK = "openrlhf"


def doctor_findings(policy: PrecisionPolicy) -> list[Finding]:
    """Findings for ``doctor``; empty when OpenRLHF is not installed."""
    found = installed()
    if found is None:
        return []
    findings = [
        Finding(
            FRAMEWORK,
            "info",
            f"OpenRLHF {found.version} installed ({found.path}); run train_ppo_ray with "
            f"$(precision-plugin openrlhf-args --dtype {policy.dtype}) and check a command "
            f"line with precision-plugin openrlhf-args --check -- ARGS",
            details={"version": str(found.version)},
        )
    ]
    if found.version < SUPPORTED_SINCE:
        findings.append(
            Finding(
                FRAMEWORK,
                "warning",
                f"OpenRLHF {found.version} predates the command line precision_plugin knows "
                f"(--ds.param_dtype, OpenRLHF >= {SUPPORTED_SINCE})",
                fix=f"pip install 'openrlhf>={SUPPORTED_SINCE}'",
            )
        )
        return findings
    requested = PrecisionPolicy.from_env()
    value = shlex.quote(env_value(policy))
    if found.engine_dtype is not None and found.engine_dtype != policy.dtype:
        reached = requested is not None and requested.dtype == policy.dtype
        findings.append(
            Finding(
                FRAMEWORK,
                "ok" if reached else "change",
                f"create_vllm_engines hard-codes dtype={found.engine_dtype!r}; with "
                f"{ENV_VAR}={value} in the Ray actors' environment the vLLM general "
                f"plugin runs {policy.dtype} in each engine"
                + (f" ({ENV_VAR} is set in this shell)" if reached else ""),
                fix="" if reached else f"export {ENV_VAR}={value} before the run",
            )
        )
    sync = found.weight_sync
    fixed_cast = sync.casts_to in ("bfloat16", "float16") and sync.casts_to != policy.dtype
    findings.append(
        Finding(
            FRAMEWORK,
            "error" if fixed_cast else "info",
            f"weight sync (learner -> vLLM): it {sync.describe()}",
            fix="use an OpenRLHF whose weight sync sends param.dtype, or dtype='bfloat16'"
            if fixed_cast
            else "",
            details={"asserts": sync.asserts, "casts_to": sync.casts_to},
        )
    )
    lay = layout(found.version)
    findings.append(
        Finding(
            FRAMEWORK,
            "info",
            f"OpenRLHF {found.version} logs the train/rollout mismatch (vllm_kl) only with "
            f"{' '.join(lay.is_on_flags())}",
        )
    )
    pinned = declared_vllm_range("openrlhf")
    vllm = versions.package_info("vllm")
    if pinned is not None and vllm is not None and vllm.version not in pinned:
        findings.append(
            Finding(
                FRAMEWORK,
                "warning",
                f"OpenRLHF {found.version} asks for vllm{pinned}; vLLM {vllm.version} is installed",
                fix=f"pip install 'vllm{pinned}'",
            )
        )
    return findings
