"""The verl adapter's hooks: registered by the manager like any plugin; imports no verl."""

from __future__ import annotations

from precision_plugin._base.report import Finding
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding]:
    """verl's version, its default config against the policy, and the worker hook."""
    from precision_plugin.verl.doctor import doctor_findings

    return doctor_findings(policy)
