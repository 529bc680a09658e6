"""The one alias table: import paths that moved, kept working with a warning.

Layers 1 and 2 live in the internal folders ``precision_plugin._base`` and
``precision_plugin._core`` (issue 55); the paths users imported before, and the names the
adapters re-exported from a layer above, resolve here, by name, so no module imports upward and
no shim file stands per old module. Each old path warns once (``FutureWarning``: shown to users
by default) with where it lives now; the package ``__init__`` installs ``install()``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

PACKAGE = "precision_plugin"

#: Old module path -> the module it is now (a folder moves with everything under it).
MODULES: dict[str, str] = {
    **{
        f"{PACKAGE}.{name}": f"{PACKAGE}._base.{name}"
        for name in (
            "dtypes",
            "boundary",
            "versions",
            "patching",
            "progress",
            "provenance",
            "report",
            "shield",
            "conflicts",
            "config_lookup",
            "constraints",
            "outputs",
            "userfiles",
        )
    },
    **{
        f"{PACKAGE}.{name}": f"{PACKAGE}._core.{name}"
        for name in (
            "manager",
            "metrics",
            "frameworks",
            "scaler",
            "master_weights",
            "buffers",
            "sampling",
            "rollout",
            "serving",
            "overflow",
            "model_risks",
            "builders",
            "plugin_check",
            "master_copy",
            "train_guard",
            "intervals",
            "misfit",
            "decision",
            "scoring",
            "canary",
            "configs",
        )
    },
    f"{PACKAGE}._layers": f"{PACKAGE}._base.layers",
    f"{PACKAGE}.mismatch": f"{PACKAGE}._core.metrics.mismatch",
    f"{PACKAGE}.consequence": f"{PACKAGE}._core.metrics.consequence",
    f"{PACKAGE}.probe.engine": f"{PACKAGE}._core.hf_engine",
    f"{PACKAGE}.sglang.slime": f"{PACKAGE}.slime",
    f"{PACKAGE}.sglang.areal": f"{PACKAGE}.areal",
}

#: (module, name) -> the module that defines the name now: names a module used to re-export
#: from a layer above it.
NAMES: dict[tuple[str, str], str] = {
    (f"{PACKAGE}.transformers", "PrecisionCallback"): f"{PACKAGE}.callback",
    (f"{PACKAGE}.transformers", "bind_callback"): f"{PACKAGE}.callback",
    (f"{PACKAGE}.sglang", "slime_args"): f"{PACKAGE}.slime",
    (f"{PACKAGE}.sglang", "check_slime_args"): f"{PACKAGE}.slime",
    (f"{PACKAGE}.sglang", "areal_overrides"): f"{PACKAGE}.areal",
    (f"{PACKAGE}.sglang", "check_areal_config"): f"{PACKAGE}.areal",
}

_warned: set[str] = set()


def new_path(old: str) -> str | None:
    """Where the module ``old`` lives now (``None``: it did not move)."""
    for prefix in sorted(MODULES, key=len, reverse=True):
        if old == prefix or old.startswith(prefix + "."):
            return MODULES[prefix] + old[len(prefix) :]
    return None


def _warn_once(old: str, new: str) -> None:
    if old in _warned:
        return
    _warned.add(old)
    # Point at the user's line: the first frame outside the import machinery, this module and
    # the package __init__'s __getattr__.
    skip = (__file__, __file__.replace("_base/moved.py", "__init__.py"))
    frame = sys._getframe(1)
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib") or frame.f_code.co_filename in skip
    ):
        frame = frame.f_back
    warnings.warn_explicit(
        f"{old} moved to {new}; import it from there (the old path keeps working for now)",
        FutureWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__"),
        registry=frame.f_globals.setdefault("__warningregistry__", {}),
    )


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _warn_once(spec.name, self.new)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module is the new one, already executed; Python binds it under the old name too
        # and set its __spec__ to the old name's: give it back its own.
        module.__spec__ = self.spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        new = new_path(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put the old module paths' finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


def getattr_of(module: str) -> Any:
    """A module ``__getattr__`` for ``module``: its moved names (``NAMES``) and moved
    submodules, each warning once; anything else is the usual ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        owner = NAMES.get((module, name))
        if owner is not None:
            _warn_once(f"{module}.{name}", f"{owner}.{name}")
            return getattr(importlib.import_module(owner), name)
        if new_path(f"{module}.{name}") is not None:
            return importlib.import_module(f"{module}.{name}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
