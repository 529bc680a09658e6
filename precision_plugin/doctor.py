"""``precision-plugin doctor``: what is installed, what is at risk, what ``enable()`` would change.

The core reports framework versions, the accelerator and whether it supports the policy dtype;
every adapter adds its own findings through the ``precision_doctor`` hook (cascade-attention
verdict, TRL ↔ vLLM range, what ``enable()`` would patch). A framework that is not installed is
"not used", never an error. Any finding with status ``error`` makes the command exit 1, for the
frameworks the user runs: ``--frameworks trl,vllm`` says which (default: every installed one);
an error of a framework outside them is shown as a warning that does not block.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from precision_plugin._base.report import Finding
from precision_plugin._base.versions import FRAMEWORKS, AcceleratorInfo, accelerator, package_info
from precision_plugin._core.manager import resolve_policy
from precision_plugin.policy import PrecisionPolicy, normalize_dtype

log = logging.getLogger("precision_plugin")

_STATUS_STYLE = {
    "ok": "green",
    "info": "cyan",
    "change": "blue",
    "warning": "yellow",
    "error": "bold red",
}


@dataclass
class DoctorReport:
    """What ``doctor`` found: the policy checked, versions, accelerator and all findings."""

    policy: PrecisionPolicy
    versions: dict[str, dict[str, str] | None]
    accelerator: AcceleratorInfo
    findings: list[Finding] = field(default_factory=list)
    #: The frameworks whose errors block (``None``: every installed one).
    frameworks: tuple[str, ...] | None = None

    @property
    def errors(self) -> list[Finding]:
        """The findings that block the policy (``status == "error"``)."""
        return [f for f in self.findings if f.status == "error"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``policy``, ``versions``, ``accelerator``, ``findings``, ``errors``."""
        acc = self.accelerator
        return {
            "policy": self.policy.to_dict(),
            "versions": self.versions,
            "accelerator": {
                "kind": acc.kind,
                "name": acc.name,
                "capability": acc.capability_str if acc.capability else None,
                "supports_fp16": acc.supports_fp16,
                "supports_bf16": acc.supports_bf16,
            },
            "findings": [f.to_dict() for f in self.findings],
            "frameworks": list(self.frameworks) if self.frameworks is not None else None,
            "errors": len(self.errors),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The JSON text of ``to_dict``."""
        return json.dumps(self.to_dict(), indent=indent, default=str)


def doctor_policy(dtype: str | None = None) -> PrecisionPolicy:
    """The policy to check: ``dtype`` when given, on top of
    [`resolve_policy()`][precision_plugin._core.manager.resolve_policy]."""
    base = resolve_policy()
    return base.replace(dtype=normalize_dtype(dtype)) if dtype else base


def installed_versions() -> dict[str, dict[str, str] | None]:
    """``{framework: {"version", "distribution"} or None}`` without importing the frameworks."""
    out: dict[str, dict[str, str] | None] = {}
    for name in FRAMEWORKS:
        info = package_info(name)
        out[name] = (
            {"version": str(info.version), "distribution": info.distribution} if info else None
        )
    return out


def core_findings(policy: PrecisionPolicy, acc: AcceleratorInfo) -> list[Finding]:
    """The core's own findings: the accelerator and whether it runs the policy dtype."""
    cap = f", compute capability {acc.capability_str}" if acc.capability else ""
    support = ", ".join(
        f"{name} {'yes' if ok else 'no'}"
        for name, ok in (("fp16", acc.supports_fp16), ("bf16", acc.supports_bf16))
    )
    findings = [Finding("accelerator", "info", f"{acc.kind}: {acc.name}{cap}; {support}")]
    supported = {"float16": acc.supports_fp16, "bfloat16": acc.supports_bf16, "float32": True}
    if not supported[policy.dtype]:
        other = "float16" if policy.dtype == "bfloat16" else "float32"
        findings.append(
            Finding(
                "accelerator",
                "error",
                f"policy dtype {policy.dtype} was asked for, but {acc.name} ({acc.kind}{cap}) "
                f"does not support it",
                fix=f"use dtype={other!r} (PRECISION_PLUGIN={other}) or a GPU that supports "
                f"{policy.dtype}",
            )
        )
    elif acc.kind == "cpu" and policy.dtype != "float32":
        findings.append(
            Finding(
                "accelerator",
                "info",
                f"no GPU: {policy.dtype} runs on CPU (autocast), slowly; fine for tests and the "
                f"probe",
            )
        )
    else:
        findings.append(Finding("accelerator", "ok", f"{acc.kind} supports {policy.dtype}"))
    return findings


def adapter_findings(policy: PrecisionPolicy) -> list[Finding]:
    """Every adapter's ``precision_doctor`` findings, one adapter at a time.

    An adapter whose check crashes is reported as a warning (its check could not run), so one
    broken plugin neither hides the others nor blocks the command.
    """
    from precision_plugin._core.manager import call_each

    findings: list[Finding] = []
    for name, found in call_each("precision_doctor", policy=policy):
        if isinstance(found, Exception):
            log.debug("doctor check of %s crashed", name, exc_info=found)
            findings.append(
                Finding(
                    name,
                    "warning",
                    f"the {name} check crashed ({type(found).__name__}: {found}), so it could "
                    f"not be checked",
                    fix="report this with `precision-plugin doctor --json` output",
                )
            )
            continue
        findings.extend(found or [])
    return findings


#: What running a framework also runs: its findings block too.
_RUNS_ALSO: dict[str, tuple[str, ...]] = {
    "trl": ("transformers", "accelerate"),
    "transformers": ("accelerate",),
    "openrlhf": ("deepspeed", "transformers", "vllm"),
}


def known_frameworks(findings: Iterable[Finding] = ()) -> list[str]:
    """The names ``--frameworks`` accepts: the frameworks the plugin knows, every registered
    adapter's name, and every framework a finding names."""
    from precision_plugin._core.manager import get_plugin_manager

    names = {name for name, _ in get_plugin_manager().list_name_plugin() if name}
    names |= set(FRAMEWORKS) | {f.framework for f in findings}
    return sorted(n for n in names - {"accelerator"} if not n.startswith("_") and "." not in n)


def frameworks_in_use(names: Iterable[str], findings: Iterable[Finding] = ()) -> tuple[str, ...]:
    """``names`` (e.g. ``["trl", "vllm"]``) checked against
    [`known_frameworks`][precision_plugin.doctor.known_frameworks], with what each also runs
    (TRL runs on transformers and Accelerate). Unknown names are one
    [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError] naming the known."""
    from precision_plugin.errors import PrecisionConfigError

    asked = [n.strip().lower() for n in names if n.strip()]
    known = known_frameworks(findings)
    unknown = [n for n in asked if n not in known]
    if unknown or not asked:
        found = ", ".join(map(repr, unknown)) if unknown else "nothing"
        raise PrecisionConfigError(
            f"frameworks: got {found}; name the frameworks your run uses, comma-separated, "
            f"from: {', '.join(known)} (e.g. --frameworks trl,vllm)"
        )
    used = {n for name in asked for n in (name, *_RUNS_ALSO.get(name, ()))}
    return tuple(sorted(used))


def run_doctor(
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    frameworks: Iterable[str] | str | None = None,
) -> DoctorReport:
    """Collect everything ``doctor`` reports for ``policy`` (default: ``doctor_policy``; a dict
    of its keys or a dtype name as ``enable()`` takes them).

    ``frameworks``: the frameworks the run uses (see
    [`frameworks_in_use`][precision_plugin.doctor.frameworks_in_use]), as names or one
    comma-separated string; an error of any other installed framework becomes a warning saying
    it does not block. Default: all of them.
    """
    from precision_plugin._base.boundary import policy_arg
    from precision_plugin.errors import PrecisionConfigError

    policy = doctor_policy() if policy is None else policy_arg(policy)
    if isinstance(frameworks, str):
        frameworks = frameworks.split(",")
    elif frameworks is not None:
        frameworks = list(frameworks)
        named = [f for f in frameworks if not isinstance(f, str)]
        if named:
            raise PrecisionConfigError(
                f"run_doctor(): frameworks holds {named[0]!r}, which is no framework name; pass "
                f"names such as ['trl', 'vllm'] (or 'trl,vllm')."
            )
    acc = accelerator()
    found = adapter_findings(policy)
    scope = frameworks_in_use(frameworks, found) if frameworks is not None else None
    report = DoctorReport(policy, installed_versions(), acc, frameworks=scope)
    report.findings.extend(core_findings(policy, acc))
    from precision_plugin._core.manager import get_plugin_manager
    from precision_plugin._core.plugin_check import plugin_findings

    report.findings.extend(plugin_findings(get_plugin_manager()))
    for finding in found:
        if scope is not None and finding.status == "error" and finding.framework not in scope:
            finding = replace(
                finding,
                status="warning",
                message=f"{finding.message} (not blocking: your run does not use "
                f"{finding.framework}, by --frameworks)",
            )
        report.findings.append(finding)
    return report


def render_report(report: DoctorReport, console: Any) -> None:
    """Print the report as two rich tables (versions, findings) and a one-line summary."""
    from rich.markup import escape
    from rich.table import Table

    versions = Table(title=f"precision_plugin doctor: policy dtype {report.policy.dtype}")
    versions.add_column("framework")
    versions.add_column("version")
    versions.add_column("distribution")
    for name, info in report.versions.items():
        if info is None:
            versions.add_row(name, "[dim]not installed (not used)[/]", "")
        else:
            versions.add_row(name, info["version"], info["distribution"])
    console.print(versions)

    findings = Table(title="findings", show_lines=False)
    findings.add_column("framework")
    findings.add_column("status")
    findings.add_column("finding (and fix)", overflow="fold")
    for f in report.findings:
        style = _STATUS_STYLE.get(f.status, "")
        text = escape(f.message) + (f"\n[bold]fix:[/] {escape(f.fix)}" if f.fix else "")
        findings.add_row(f.framework, f"[{style}]{f.status}[/]", text)
    console.print(findings)
    n = len(report.errors)
    if n:
        console.print(f"[bold red]{n} blocking problem(s)[/]: fix the 'error' rows above.")
        outside = {f.framework for f in report.errors} - {"accelerator"}
        if report.frameworks is None and outside:
            console.print(
                f"Not running {', '.join(sorted(outside))}? Say what your run uses, e.g. "
                f"[bold]precision-plugin doctor --frameworks trl,vllm[/]: only their problems "
                f"block."
            )
    else:
        console.print("[green]no blocking problem[/]")
