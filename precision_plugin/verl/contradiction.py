"""``Contradiction``: one place where a verl config contradicts the policy (shared by the
config check and the SGLang-rollout check of ``precision_plugin.verl``)."""

from __future__ import annotations

from dataclasses import dataclass

from precision_plugin._base.boundary import checked


@checked
@dataclass(frozen=True)
class Contradiction:
    """One place where the config contradicts the policy: the key, what it does, the fix."""

    key: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.message} [{self.key}] (fix: {self.fix})"
