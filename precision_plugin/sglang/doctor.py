"""``precision-plugin doctor`` findings for SGLang: the installed version, whether the entry point
reaches SGLang's processes, and the traps this environment sets. Imports nothing from SGLang."""

from __future__ import annotations

import os
from collections.abc import Mapping

from precision_plugin._base import versions
from precision_plugin._base.report import Finding
from precision_plugin.policy import ENV_VAR, PrecisionPolicy
from precision_plugin.sglang.check import FRAMEWORK, NAN_CHECK_ENV, trap_findings
from precision_plugin.sglang.plugin import ENTRY_POINT_GROUP, ENTRY_POINT_NAME, LOADER_SINCE

#: SGLang's allow-list of general plugins (``srt/environ.py``).
PLUGINS_ENV = "SGLANG_PLUGINS"


def doctor_findings(
    policy: PrecisionPolicy, environ: Mapping[str, str] | None = None
) -> list[Finding]:
    """Findings for ``doctor``; empty when SGLang is not installed. ``environ`` defaults to this
    process's environment (what an SGLang server started from here inherits)."""
    info = versions.package_info("sglang")
    if info is None:
        return []
    env = os.environ if environ is None else environ
    findings = [
        Finding(
            FRAMEWORK,
            "info",
            f"SGLang {info.version} installed (distribution {info.distribution!r}). It refuses "
            f"no model family in float16: check a launch with "
            f"precision_plugin.sglang.check_server_args, and a checkpoint's float16 headroom "
            f"with precision-plugin probe --model PATH.",
            details={"version": str(info.version), "distribution": info.distribution},
        )
    ]
    registered = versions.entry_point_registered(ENTRY_POINT_GROUP, ENTRY_POINT_NAME)
    allowed = [p.strip() for p in env.get(PLUGINS_ENV, "").split(",") if p.strip()]
    if info.version < LOADER_SINCE:
        findings.append(
            Finding(
                FRAMEWORK,
                "warning",
                f"SGLang {info.version} has no plugin loader (SGLang loads the "
                f"{ENTRY_POINT_GROUP} entry points from {LOADER_SINCE}; AReaL 1.0.4 pins "
                f"0.5.10.post1), so its processes neither set nor verify the dtype whatever "
                f"{ENV_VAR} says: the dtype is only what the launch passes",
                fix=f"pass --dtype {policy.dtype} explicitly (precision_plugin.sglang."
                f"server_args(); AReaL: sglang.dtype) and check the running server with "
                f"precision_plugin.sglang.verify_server, or install the SGLang "
                f"precision_plugin[sglang] asks for (>= 0.5.12)",
            )
        )
    elif not registered:
        findings.append(
            Finding(
                FRAMEWORK,
                "warning",
                f"the {ENTRY_POINT_GROUP} entry point is not registered (a partial or stale "
                f"install?), so SGLang's processes neither set nor verify the dtype",
                fix="pip install <path to the precision_plugin repository> (or a wheel built "
                "from it) where SGLang runs",
            )
        )
    elif allowed and ENTRY_POINT_NAME not in allowed:
        findings.append(
            Finding(
                FRAMEWORK,
                "warning",
                f"{PLUGINS_ENV}={env[PLUGINS_ENV]} does not name {ENTRY_POINT_NAME}, so SGLang "
                f"skips the plugin's entry point",
                fix=f"add {ENTRY_POINT_NAME} to {PLUGINS_ENV}, or unset it",
            )
        )
    elif env.get(ENV_VAR) is None:
        findings.append(
            Finding(
                FRAMEWORK,
                "info",
                f"{ENV_VAR} is not set here: SGLang servers started from this environment run "
                f"the dtype they are given. With {ENV_VAR}={policy.dtype} the entry point sets it "
                f"for sglang serve / launch_server / sglang.Engine, and verifies it where "
                f"verl, slime and AReaL start SGLang (Engine._launch_subprocesses)",
                fix=f"export {ENV_VAR}={policy.dtype} for SGLang's processes",
            )
        )
    else:
        findings.append(
            Finding(
                FRAMEWORK,
                "ok",
                f"{ENTRY_POINT_GROUP} entry point registered and {ENV_VAR} set: SGLang's "
                f"processes set (where SGLang resolves its arguments) or verify the dtype",
            )
        )
    traps = trap_findings({}, None, policy, env, "this environment")
    findings.extend(traps)
    if policy.is_fp16 and not traps and env.get(NAN_CHECK_ENV) is None:
        findings.append(
            Finding(
                FRAMEWORK,
                "info",
                f"for float16 diagnostics, {NAN_CHECK_ENV}=1 makes SGLang stop on NaN logits "
                f"(overflow) instead of sampling from them",
            )
        )
    return findings
