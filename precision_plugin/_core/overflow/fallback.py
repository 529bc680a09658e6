"""Selective float32 fallback: run the modules named by ``overflow.keep_fp32_modules`` outside fp16
autocast on the learner.

Each matched module's ``forward`` is wrapped (through
:class:`~precision_plugin._base.patching.Patcher`,
so :meth:`Fp32Fallback.remove` restores it exactly): autocast is switched off, floating inputs
are cast to float32, and the module's own float16/bfloat16 parameters are cast to float32 once.
Outputs are **left in float32**: casting them back would turn the very values that overflow
into ``inf``. Downstream, a residual sum with a float32 term stays float32 until the next
autocast op (a matmul) casts it down again, normally after a normalisation has made it small.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from precision_plugin._base.boundary import checked, policy_field
from precision_plugin._base.patching import Patcher, track, untrack
from precision_plugin._core.overflow.tensors import autocast_device_types
from precision_plugin.errors import PrecisionConfigError

log = logging.getLogger("precision_plugin")

#: Instance attribute holding a ``forward`` the module already had of its own (another
#: library's wrapper), called inside the float32 region instead of the class's ``forward``.
INNER_ATTR = "_precision_plugin_fp32_inner"


@checked(patterns=policy_field("overflow.keep_fp32_modules"))
def match_modules(model: torch.nn.Module, patterns: Sequence[str]) -> list[str]:
    """Paths of the modules matching any fnmatch pattern, outermost only (a matched module's
    submodules already run inside its float32 region). Raises :class:`PrecisionConfigError`
    for a pattern that matches no module."""
    patterns = list(patterns)
    names = [name for name, _ in model.named_modules() if name]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            examples = ", ".join(repr(n) for n in _examples(names))
            raise PrecisionConfigError(
                f"overflow.keep_fp32_modules: pattern {pattern!r} matches no module of "
                f"{type(model).__name__}. Module paths are as model.named_modules() names them, "
                f"e.g. {examples}; use fnmatch wildcards such as 'model.layers.*.mlp.down_proj'."
            )
    matched = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    return [n for n in matched if not any(n.startswith(m + ".") for m in matched)]


def _examples(names: list[str]) -> list[str]:
    leaves = [n for n in names if not any(m.startswith(n + ".") for m in names)]
    return leaves[:3] or names[:3]


@checked
@dataclass
class Fp32Fallback:
    """The float32 fallback applied to one model; :meth:`remove` undoes it exactly."""

    modules: list[str]
    _patcher: Patcher = field(repr=False)
    _casts: list[tuple[torch.Tensor, torch.dtype]] = field(default_factory=list, repr=False)

    def remove(self) -> None:
        """Restore the original ``forward`` of every module and its parameters' dtypes (also
        done by ``precision_plugin.disable()`` while it is in place)."""
        untrack(self.remove)
        self._patcher.restore()
        casts, self._casts = self._casts, []
        for tensor, dtype in casts:
            tensor.data = tensor.data.to(dtype)


@checked(patterns=policy_field("overflow.keep_fp32_modules"))
def keep_fp32_modules(model: torch.nn.Module, patterns: Sequence[str]) -> Fp32Fallback:
    """Run the modules of ``model`` matching ``patterns`` in float32 outside autocast.

    Returns a handle whose :meth:`Fp32Fallback.remove` undoes it. A module already wrapped is
    left as is. See the module docstring for what runs in which dtype.
    """
    patcher = Patcher("precision_plugin._core.overflow")
    fallback = Fp32Fallback([], patcher)
    modules = dict(model.named_modules())
    for name in match_modules(model, patterns):
        module = modules[name]
        if is_fp32(module):
            continue
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.is_floating_point() and tensor.dtype in (torch.float16, torch.bfloat16):
                fallback._casts.append((tensor, tensor.dtype))
                tensor.data = tensor.data.float()
        own = vars(module).get("forward")
        if own is not None:
            patcher.setattr(module, INNER_ATTR, own, reason="the forward the module had")
        # A bound method (not a closure): deepcopy rebinds it to the copy, so a copied model
        # (a reference model) runs its own weights.
        patcher.setattr(
            module,
            "forward",
            types.MethodType(_fp32_forward, module),
            reason="keep_fp32_modules: no hook spans a whole forward to switch autocast off",
        )
        fallback.modules.append(name)
    if fallback.modules or fallback._casts:
        track(fallback.remove, f"keep_fp32_modules: {', '.join(fallback.modules)}")
    if fallback.modules:
        log.info(
            "precision_plugin: running %d module(s) in float32 (overflow.keep_fp32_modules): %s",
            len(fallback.modules),
            ", ".join(fallback.modules),
        )
    return fallback


@checked
def is_fp32(module: torch.nn.Module) -> bool:
    """True when ``module`` runs under the float32 fallback."""
    return getattr(vars(module).get("forward"), "__func__", None) is _fp32_forward


def _fp32_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    inner = vars(self).get(INNER_ATTR) or type(self).forward.__get__(self)
    with contextlib.ExitStack() as stack:
        for device_type in autocast_device_types():
            stack.enter_context(torch.autocast(device_type, enabled=False))
        return inner(*_to_fp32(args), **_to_fp32(kwargs))


def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.dtype in (torch.float16, torch.bfloat16):
            return value.float()
        return value
    if isinstance(value, dict):
        return {k: _to_fp32(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return type(value)(_to_fp32(v) for v in value)
    return value
