"""The one reversible-patch helper every adapter uses.

A :class:`Patcher` records each attribute (or environment variable) it replaces, exactly as it
was, and :meth:`Patcher.restore` puts every original back in reverse order. For classes and
modules the raw entry of ``__dict__`` is saved, so a ``classmethod``/``staticmethod``/property
descriptor comes back as the identical object, and an attribute that was only inherited is
deleted again rather than shadowed.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("precision_plugin")

_MISSING: Any = object()

#: Attribute set on every wrapper :meth:`Patcher.wrap` builds, pointing at the original.
ORIGINAL_ATTR = "__precision_plugin_original__"


@dataclass
class _Record:
    target: Any
    name: str
    original: Any  # raw __dict__ entry, or _MISSING when the attribute was not set there
    reason: str
    is_env: bool = False


def _own_entry(target: Any, name: str) -> Any:
    """The attribute as stored on ``target`` itself (not inherited), or ``_MISSING``."""
    try:
        return vars(target).get(name, _MISSING)
    except TypeError:  # objects without __dict__ (slots): fall back to plain getattr
        return getattr(target, name, _MISSING)


class Patcher:
    """Applies reversible patches and undoes all of them on :meth:`restore`."""

    def __init__(self, owner: str = "precision_plugin") -> None:
        self.owner = owner
        self._records: list[_Record] = []

    def __len__(self) -> int:
        return len(self._records)

    @property
    def patched(self) -> list[str]:
        """Human-readable names of what is currently patched, in patch order."""
        return [
            f"${r.name}" if r.is_env else f"{_qualname(r.target)}.{r.name}" for r in self._records
        ]

    def setattr(self, target: Any, name: str, value: Any, *, reason: str) -> None:
        """Replace ``target.name`` with ``value``; ``reason`` says why no hook could do it."""
        self._records.append(_Record(target, name, _own_entry(target, name), reason))
        setattr(target, name, value)
        log.debug("%s patched %s.%s: %s", self.owner, _qualname(target), name, reason)

    def wrap(
        self,
        target: Any,
        name: str,
        make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]],
        *,
        reason: str,
    ) -> Callable[..., Any]:
        """Replace the function ``target.name`` with ``make_wrapper(original)``.

        The wrapper gets ``functools.wraps`` metadata and an ``__precision_plugin_original__``
        attribute. ``staticmethod``/``classmethod`` descriptors are unwrapped and re-wrapped.
        Returns the installed wrapper.
        """
        raw = _own_entry(target, name)
        descriptor = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        original = raw.__func__ if descriptor else getattr(target, name)
        wrapper = functools.wraps(original)(make_wrapper(original))
        setattr(wrapper, ORIGINAL_ATTR, original)
        self.setattr(target, name, descriptor(wrapper) if descriptor else wrapper, reason=reason)
        return wrapper

    def setenv(self, name: str, value: str, *, reason: str) -> None:
        """Set environment variable ``name``; :meth:`restore` puts the old value (or none) back."""
        self._records.append(
            _Record(os.environ, name, os.environ.get(name, _MISSING), reason, True)
        )
        os.environ[name] = value

    def restore(self) -> None:
        """Undo every patch in reverse order; safe to call twice."""
        errors: list[str] = []
        while self._records:
            rec = self._records.pop()
            try:
                if rec.is_env:
                    if rec.original is _MISSING:
                        os.environ.pop(rec.name, None)
                    else:
                        os.environ[rec.name] = rec.original
                elif rec.original is _MISSING:
                    delattr(rec.target, rec.name)
                else:
                    setattr(rec.target, rec.name, rec.original)
            except Exception as exc:  # keep restoring the rest, report at the end
                errors.append(f"{_qualname(rec.target)}.{rec.name}: {exc}")
        if errors:
            log.error("%s could not restore: %s", self.owner, "; ".join(errors))


def _qualname(obj: Any) -> str:
    if obj is os.environ:
        return "os.environ"
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)


def is_patched(func: Any) -> bool:
    """True when ``func`` is a wrapper installed by :meth:`Patcher.wrap`."""
    func = func.__func__ if isinstance(func, (staticmethod, classmethod)) else func
    return hasattr(func, ORIGINAL_ATTR)
