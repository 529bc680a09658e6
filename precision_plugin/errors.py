"""One exception hierarchy for the whole plugin.

Every message says what was asked, what was found, and how to fix it.
"""

from __future__ import annotations


class PrecisionPluginError(Exception):
    """Base class of every error the plugin raises on purpose."""


class PrecisionConfigError(PrecisionPluginError, ValueError):
    """A policy, config section, or argument is invalid (bad key, type, or value)."""


class PrecisionMismatchError(PrecisionPluginError, RuntimeError):
    """What actually runs contradicts the policy and strictness is ``"error"``."""


class ServerUnreachableError(PrecisionConfigError):
    """Nothing that answers like the expected rollout server is at the URL that was given.

    ``kind`` says which: ``not_listening`` (connection refused, unknown host), ``timeout`` (no
    answer within the timeout), ``not_ready`` (listening, HTTP 503 while it loads)."""

    kind: str = "not_listening"

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class ServerAnswerError(PrecisionConfigError):
    """A server answered, but not with what was asked: ``kind`` is ``server_error`` (HTTP 5xx),
    ``truncated`` (the body ended early), ``not_json`` or ``other_program``."""

    kind: str = "server_error"

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class AdapterInstallError(PrecisionPluginError, RuntimeError):
    """A framework adapter failed to install; everything already installed was rolled back."""

    def __init__(self, adapter: str, cause: BaseException) -> None:
        self.adapter = adapter
        self.cause = cause
        super().__init__(
            f"precision_plugin: adapter {adapter!r} failed to install "
            f"({type(cause).__name__}: {cause}); every patch was rolled back, nothing changed. "
            f"Fix the cause above, or disable that adapter with "
            f"precision_plugin.enable(..., skip_adapters=[{adapter!r}])."
        )


class PluginHookError(PrecisionPluginError, RuntimeError):
    """A registered plugin implements a hook no spec defines (a misspelt hook name), found by
    pluggy's ``check_pending()`` when ``enable()`` runs under ``strictness="error"``."""


class CanaryAlarmError(PrecisionMismatchError):
    """The drift canary left its band on two consecutive checks and strictness is ``"error"``.

    Attributes: ``verdict`` (``weights_out_of_sync`` or ``engine_state_drift``), ``step`` and
    ``stale_since`` (the step whose weights the rollout still holds, or ``None``).
    """

    def __init__(self, message: str, *, verdict: str, step: int, stale_since: int | None) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.step = step
        self.stale_since = stale_since


class LossScaleAtMinimumError(PrecisionPluginError, RuntimeError):
    """The dynamic loss scale sat at its floor while steps kept overflowing."""


class ForwardOverflowError(PrecisionPluginError, RuntimeError):
    """A forward pass produced inf/NaN; names the first module that did (runtime detection).

    Attributes: ``module`` (path as ``model.named_modules()`` names it), ``module_class``,
    ``step``, ``input_max`` (largest finite |input| of that module) and ``kind`` (inf/nan).
    """

    def __init__(
        self,
        message: str,
        *,
        module: str,
        module_class: str,
        step: int,
        input_max: float,
        kind: str,
    ) -> None:
        super().__init__(message)
        self.module = module
        self.module_class = module_class
        self.step = step
        self.input_max = input_max
        self.kind = kind
