"""The OpenRLHF adapter's hooks: registered by the manager like any plugin; imports no
OpenRLHF. Its engines are reached through the vLLM adapter's general plugin."""

from __future__ import annotations

from precision_plugin._base.report import Finding
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding]:
    """OpenRLHF's version, its hard-coded engine dtype, its weight sync and pinned vLLM."""
    from precision_plugin.openrlhf.doctor import doctor_findings

    return doctor_findings(policy)
