"""The SGLang adapter's hooks: registered by the manager like any plugin; imports no SGLang.

``enable()`` needs no patch here: SGLang loads the plugin's ``sglang.srt.plugins`` entry point
in each of its processes, and its hooks follow the policy ``enable()`` installed in the process
(``sglang.Engine(...)`` after ``enable()``) as well as ``PRECISION_PLUGIN``.
"""

from __future__ import annotations

from precision_plugin._base.report import Finding
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding]:
    """SGLang's version, its entry point, and the traps of this environment."""
    from precision_plugin.sglang.doctor import doctor_findings

    return doctor_findings(policy)
