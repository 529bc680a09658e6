"""precision_plugin: one switch for one consistent precision (FP16 by default) across RL rollouts
(vLLM) and the learner (TRL / Accelerate / DeepSpeed), with a dynamic loss scaler, checks of what
actually runs, and train/rollout mismatch metrics.

Importing this package changes nothing; only [`enable`][precision_plugin._core.manager.enable]
does, and
[`disable`][precision_plugin._core.manager.disable] undoes it. Framework integrations are imported
lazily,
on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from precision_plugin._base import conflicts as _conflicts  # noqa: F401 (errors.settle_conflict)
from precision_plugin._base import moved as _moved
from precision_plugin._core.manager import current_policy, disable, enable, resolve_policy
from precision_plugin.errors import (
    AdapterInstallError,
    ForwardOverflowError,
    LossScaleAtMinimumError,
    PrecisionConfigError,
    PrecisionMismatchError,
    PrecisionPluginError,
)
from precision_plugin.policy import PrecisionPolicy

if TYPE_CHECKING:
    from precision_plugin._core.master_weights import prepare_model
    from precision_plugin.callback import PrecisionCallback

__version__ = "0.1.0"

__all__ = [
    "AdapterInstallError",
    "ForwardOverflowError",
    "LossScaleAtMinimumError",
    "PrecisionCallback",
    "PrecisionConfigError",
    "PrecisionMismatchError",
    "PrecisionPluginError",
    "PrecisionPolicy",
    "__version__",
    "current_policy",
    "disable",
    "enable",
    "prepare_model",
    "resolve_policy",
]

_moved.install()  # the old paths of modules that moved into _base/ and _core/

_LAZY = {
    "PrecisionCallback": "precision_plugin.callback",
    "prepare_model": "precision_plugin._core.master_weights",
}


def __getattr__(name: str) -> Any:
    """Import framework-dependent names and subpackages (``precision_plugin.trl``, ``.vllm``,
    ...) on first use: ``import precision_plugin`` stays light and imports no framework."""
    import importlib
    import importlib.util

    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif _moved.new_path(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")  # warns once that it moved
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'precision_plugin' has no attribute {name!r}")
    globals()[name] = value
    return value
