"""Settling a user setting that contradicts the policy: refuse it, or say what runs instead.

Layer 1 (with the checker): imports only errors and the checker. Its public path
``precision_plugin.errors.settle_conflict`` is kept by registering it there once defined (as the
policy registers its coercion with the checker), so errors imports nothing of the package and no
import cycle closes through it; the package ``__init__`` imports this module, so the name is
there whenever ``precision_plugin.errors`` is.
"""

from __future__ import annotations

import logging

from precision_plugin import errors
from precision_plugin._base.boundary import checked, policy_field
from precision_plugin.errors import PrecisionMismatchError


@checked(strictness=policy_field("strictness"))
def settle_conflict(strictness: str, message: str, *, fix: str, outcome: str) -> None:
    """Settle a user setting that contradicts the policy: refuse it, or say what runs instead.

    ``strictness="error"`` raises
    [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError] ("precision_plugin:
    MESSAGE. Fix: FIX."); ``"warn"`` logs a warning ("precision_plugin: MESSAGE; OUTCOME."), where
    ``outcome`` says what the plugin runs instead (or why it cannot change it).
    """
    if strictness == "error":
        raise PrecisionMismatchError(
            f"precision_plugin: {message} (strictness='error'). Fix: {fix}."
        )
    logging.getLogger("precision_plugin").warning("precision_plugin: %s; %s.", message, outcome)


errors.settle_conflict = settle_conflict  # the public path (see the module doc)
