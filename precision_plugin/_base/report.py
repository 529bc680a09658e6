"""``Finding``: one line of what an adapter sees, shared by ``doctor`` and the checks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from precision_plugin._base.boundary import checked

Status = Literal["ok", "info", "change", "warning", "error"]
STATUSES: tuple[str, ...] = ("ok", "info", "change", "warning", "error")


@checked
@dataclass(frozen=True)
class Finding:
    """One observation: which framework, how serious, what was found, and how to fix it.

    ``status``: ``ok`` (matches the policy), ``info`` (fact), ``change`` (what ``enable()`` would
    change), ``warning`` (a risk), ``error`` (blocks the policy; ``doctor`` exits non-zero).
    """

    framework: str
    status: Status
    message: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form for JSON output."""
        return asdict(self)
