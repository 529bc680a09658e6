"""Every hook of precision_plugin, with its contract: the interface between core and adapters.

The built-in framework adapters (``precision_plugin.accelerate``, ``.deepspeed``,
``.transformers``, ``.trl``, ``.vllm``) implement these hooks exactly as a third-party plugin
would. A third-party plugin is a module or object with ``@hookimpl`` functions, published under
the entry-point group ``precision_plugin``::

    [project.entry-points.precision_plugin]
    my_framework = "my_package.precision_adapter"

Hooks receive keyword arguments; an implementation may accept any subset of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from precision_plugin._base.patching import Patcher
    from precision_plugin._base.report import Finding
    from precision_plugin.policy import PrecisionPolicy

PROJECT = "precision_plugin"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def precision_install(policy: PrecisionPolicy, patcher: Patcher) -> None:
    """Make the adapter's framework follow ``policy`` in this process.

    Called by ``enable()`` once per adapter, in registration order. Do every patch through
    ``patcher`` (never by hand) so ``disable()`` can restore it exactly; return without doing
    anything when the framework is not installed, and import it lazily. Raising aborts
    ``enable()``: everything already installed, by this adapter and the others, is rolled back
    and the error names this adapter.
    """


@hookspec
def precision_uninstall(policy: PrecisionPolicy) -> None:
    """Release anything the adapter holds that is not a patch (caches, registries, threads).

    Called by ``disable()`` before the patches are restored. Patches need no work here.
    """


@hookspec
def precision_doctor(policy: PrecisionPolicy) -> list[Finding] | None:  # type: ignore[empty-body]
    """Report what this adapter sees and what ``enable(policy)`` would change, without changing it.

    Return a list of [`Finding`][precision_plugin._base.report.Finding] (framework, status,
    message, fix).
    A finding with ``status="error"`` makes ``precision-plugin doctor`` exit non-zero. Return
    ``None`` or ``[]`` when the framework is not installed: absence is "not used", not an error.
    """


@hookspec
def precision_probe_engines() -> dict[str, Any] | None:  # type: ignore[empty-body]
    """Return rollout engines the probe may use, as ``{name: factory}``.

    ``factory(model_path, dtype, device, seed)`` returns an object that follows
    [`RolloutEngine`][precision_plugin.probe.RolloutEngine].
    ``precision-plugin probe --engine NAME`` chooses among all engines every plugin returns.
    """


@hookspec
def precision_train_begin(
    policy: PrecisionPolicy, args: Any, state: Any, model: Any, trainer: Any
) -> None:
    """Check or adjust a training run as it starts (called by ``PrecisionCallback``).

    ``args`` is the ``TrainingArguments`` (or a TRL config), ``trainer`` the trainer when the
    callback knows it, else ``None``. Raise a ``PrecisionMismatchError`` (strictness
    ``"error"``) or log a warning when what runs contradicts ``policy``.
    """


@hookspec
def precision_train_end(policy: PrecisionPolicy, trainer: Any) -> None:
    """Undo what ``precision_train_begin`` attached to this run (called by ``PrecisionCallback``
    when training ends, and again, with ``enable()``, when ``train()`` returns or raises: it
    must be safe to call twice). ``trainer`` is the trainer when the callback knows it, else
    ``None``."""


@hookspec
def precision_collect_metrics(  # type: ignore[empty-body]
    policy: PrecisionPolicy, trainer: Any, logs: Any, optimizer: Any, mismatch_due: bool
) -> dict[str, float] | None:
    """Return metrics to log now, named without prefix (``{"loss_scale": 1024.0}``).

    Called by ``PrecisionCallback`` at every log, on every process (an implementation may run
    a collective, as long as every process reaches it). ``logs`` is the dict the trainer is
    about to log (read it, do not change it), ``optimizer`` the trainer's optimizer (or
    ``None``), ``trainer`` the trainer when the callback knows it. ``mismatch_due`` is true
    when the train/rollout mismatch metrics are due (``policy.metrics.enabled`` and every
    ``log_every``-th log); loss-scaler telemetry is logged every time. The callback merges the
    results of all adapters (the first-registered adapter wins a name clash) and logs them as
    ``precision/<name>``.
    """
