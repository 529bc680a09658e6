"""The one reversible-patch helper every adapter uses.

A [`Patcher`][precision_plugin._base.patching.Patcher] records each attribute (or environment
variable) it
replaces, exactly as it was, and
[`Patcher.restore`][precision_plugin._base.patching.Patcher.restore] puts
every original back in reverse order. For classes and modules the raw entry of ``__dict__`` is
saved, so a ``classmethod``/``staticmethod``/property descriptor comes back as the identical object,
and an attribute that was only inherited is deleted again rather than shadowed.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from precision_plugin._base.boundary import checked

log = logging.getLogger("precision_plugin")

_MISSING: Any = object()

#: Attribute set on every wrapper [`Patcher.wrap`][precision_plugin._base.patching.Patcher.wrap]
#: builds, pointing at the original.
ORIGINAL_ATTR = "__precision_plugin_original__"


@dataclass
class _Record:
    target: Any
    name: str
    original: Any  # raw __dict__ entry, or _MISSING when the attribute was not set there
    reason: str
    is_env: bool = False
    is_hook: bool = False
    value: Any = None  # what an environment record set


def _own_entry(target: Any, name: str) -> Any:
    """The attribute as stored on ``target`` itself (not inherited), or ``_MISSING``."""
    try:
        return vars(target).get(name, _MISSING)
    except TypeError:  # objects without __dict__ (slots): fall back to plain getattr
        return getattr(target, name, _MISSING)


@checked
class Patcher:
    """Applies reversible patches and undoes all of them on
    [`restore`][precision_plugin._base.patching.Patcher.restore]."""

    def __init__(
        self, owner: str = "precision_plugin", *, strict: bool = False, tracked: bool = False
    ) -> None:
        self.owner = owner
        #: When true, a patch that fails on a later import raises into that import
        #: (``strictness="error"``: the promise of ``enable()`` is broken) instead of logging.
        self.strict = strict
        #: When true, the patches are [`track`][precision_plugin._base.patching.track]ed while they
        #: last, so ``disable()`` undoes them (patches on user objects made outside ``enable()``).
        self.tracked = tracked
        self._records: list[_Record] = []

    def __len__(self) -> int:
        return len(self._records)

    @property
    def patched(self) -> list[str]:
        """Human-readable names of what is currently patched, in patch order."""
        return [_describe(r) for r in self._records if not (r.is_hook and r.original.fired)]

    def targets(self, name: str) -> list[Any]:
        """The objects whose attribute ``name`` this patcher has replaced, in patch order."""
        return [r.target for r in self._records if not (r.is_env or r.is_hook) and r.name == name]

    def setattr(self, target: Any, name: str, value: Any, *, reason: str) -> None:
        """Replace ``target.name`` with ``value``; ``reason`` says why no hook could do it."""
        self._add(_Record(target, name, _own_entry(target, name), reason))
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
        attribute. ``staticmethod``/``classmethod`` descriptors (own or inherited) are unwrapped
        and re-wrapped, so a subclass still receives its own ``cls``.
        Returns the installed wrapper.
        """
        raw = _own_entry(target, name)
        if raw is _MISSING and isinstance(target, type):  # inherited: find the raw descriptor
            raw = inspect.getattr_static(target, name, _MISSING)
        descriptor = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        original = raw.__func__ if descriptor else getattr(target, name)
        wrapper = functools.wraps(original)(make_wrapper(original))
        setattr(wrapper, ORIGINAL_ATTR, original)
        self.setattr(target, name, descriptor(wrapper) if descriptor else wrapper, reason=reason)
        return wrapper

    def around(
        self, target: Any, name: str, advice: Callable[..., Any], *, reason: str
    ) -> Callable[..., Any]:
        """Replace the function ``target.name`` so that a call runs ``advice(original, ...)``.

        ``advice`` is a flat function that receives the original first, then the call's own
        arguments (``self``/``cls`` included for methods), and decides whether, when and with
        what to call the original. Descriptors and metadata are handled as by
        [`wrap`][precision_plugin._base.patching.Patcher.wrap]. Returns the installed wrapper.
        """

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def advised(*args: Any, **kwargs: Any) -> Any:
                return advice(original, *args, **kwargs)

            return advised

        return self.wrap(target, name, make, reason=reason)

    def wrap_on_import(
        self,
        module: str,
        path: str,
        advice: Callable[..., Any],
        *,
        reason: str,
        missing: str | None = None,
    ) -> None:
        """[`around`][precision_plugin._base.patching.Patcher.around] on ``path`` inside ``module``.

        ``path`` is ``"Class.method"`` or ``"function"``. Patches now if ``module`` is loaded,
        else right after its first import (see
        [`when_imported`][precision_plugin._base.patching.Patcher.when_imported]).

        ``missing`` is logged (info) and nothing is patched when the installed version has no
        such attribute; without it a missing attribute is an error.
        """

        def patch(loaded: ModuleType) -> None:
            owner_path, _, name = path.rpartition(".")
            target: Any = loaded
            for part in owner_path.split(".") if owner_path else ():
                target = getattr(target, part, _MISSING)
                if target is _MISSING:
                    break
            if target is _MISSING or not hasattr(target, name):
                if missing is None:
                    raise AttributeError(f"{module} has no attribute {path!r}")
                log.info("precision_plugin: %s has no %s; %s", module, path, missing)
                return
            self.around(target, name, advice, reason=reason)

        self.when_imported(module, patch, reason=f"enable() imports no framework ({path})")

    def setenv(self, name: str, value: str, *, reason: str) -> None:
        """Set environment variable ``name``;
        [`restore`][precision_plugin._base.patching.Patcher.restore]
        puts the old value (or none) back, unless the variable was changed again since (that later
        value stays)."""
        self._add(
            _Record(os.environ, name, os.environ.get(name, _MISSING), reason, True, value=value)
        )
        os.environ[name] = value

    def when_imported(
        self, module: str, callback: Callable[[ModuleType], None], *, reason: str
    ) -> None:
        """Run ``callback(module)`` now if ``module`` is loaded, else right after its first import.

        Lets ``enable()`` patch a framework without importing it (importing DeepSpeed, TRL or vLLM
        is slow and has side effects). Patches the callback makes should go through this same
        patcher, so [`restore`][precision_plugin._base.patching.Patcher.restore] undoes them; a
        hook still
        waiting is removed by [`restore`][precision_plugin._base.patching.Patcher.restore]. An
        exception
        in the callback on a later import is logged, or, for a ``strict`` patcher, raised into that
        import as [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError].
        """
        loaded = sys.modules.get(module)
        if loaded is not None:
            callback(loaded)
            return
        hook = _PostImportHook(module, callback, owner=self.owner, strict=self.strict)
        self._add(_Record(sys.meta_path, module, hook, reason, is_hook=True))
        sys.meta_path.insert(0, hook)
        log.debug("%s will patch %s when it is imported: %s", self.owner, module, reason)

    def _add(self, record: _Record) -> None:
        if self.tracked and not self._records:
            track(self.restore, f"{self.owner}: {_describe(record)}")
        self._records.append(record)

    def restore(self) -> None:
        """Undo every patch in reverse order; safe to call twice."""
        untrack(self.restore)
        errors: list[str] = []
        while self._records:
            rec = self._records.pop()
            try:
                if rec.is_hook:
                    rec.original.remove()
                elif rec.is_env:
                    if os.environ.get(rec.name) != rec.value:
                        continue  # changed since by someone else: theirs stays
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


# -- changes on user objects, undone by disable() --------------------------------------------

_tracked_lock = threading.Lock()
_tracked: dict[int, tuple[str, weakref.WeakMethod[Callable[[], Any]]]] = {}


def track(undo: Callable[[], Any], what: str) -> None:
    """Register ``undo`` (a bound method, held weakly) as the way to undo a change the plugin
    made on a user's object outside ``enable()`` (a model's fp32 wrappers, a detector's forward
    hooks, a trainer's telemetry wrappers). ``disable()`` runs every undo still registered, so
    an interrupted ``train()`` leaves nothing behind; ``undo`` itself should call
    [`untrack`][precision_plugin._base.patching.untrack]. One undo per object."""
    with _tracked_lock:
        _tracked[id(undo.__self__)] = (what, weakref.WeakMethod(undo))  # type: ignore[attr-defined]


def untrack(undo: Callable[[], Any]) -> None:
    """Forget ``undo`` (its change was undone)."""
    owner = getattr(undo, "__self__", None)
    with _tracked_lock:
        entry = _tracked.get(id(owner))
        if entry is not None and entry[1]() == undo:
            del _tracked[id(owner)]


def tracked() -> list[str]:
    """What is tracked now (changes on user objects not undone yet), in words."""
    with _tracked_lock:
        return sorted(what for what, ref in _tracked.values() if ref() is not None)


def undo_tracked() -> list[str]:
    """Run every tracked undo (an error is logged, the others still run); return what was
    undone."""
    with _tracked_lock:
        entries = list(_tracked.values())
        _tracked.clear()
    done: list[str] = []
    for what, ref in entries:
        undo = ref()
        if undo is None:
            continue
        try:
            undo()
            done.append(what)
        except Exception as exc:  # keep undoing the rest
            log.error("precision_plugin: could not undo %s: %s", what, exc)
    return done


def _describe(rec: _Record) -> str:
    if rec.is_env:
        return f"${rec.name}"
    if rec.is_hook:
        return f"import hook for {rec.name}"
    return f"{_qualname(rec.target)}.{rec.name}"


class _PostImportHook(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder that calls back once ``module`` has executed, then leaves."""

    def __init__(
        self,
        module: str,
        callback: Callable[[ModuleType], None],
        *,
        owner: str = "precision_plugin",
        strict: bool = False,
    ) -> None:
        self.module = module
        self.callback = callback
        self.owner = owner
        self.strict = strict
        self.fired = False
        self._busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.module or self._busy:
            return None
        self._busy = True  # let the regular finders locate the real spec
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _CallbackLoader(spec.loader, self)
        return spec

    def fire(self, module: ModuleType) -> None:
        self.fired = True
        self.remove()
        try:
            self.callback(module)
        except Exception as exc:
            what = _failure(exc)
            if self.strict:
                from precision_plugin.errors import PrecisionMismatchError

                raise PrecisionMismatchError(
                    f"{self.owner}: enable() could not patch {self.module} when it was imported: "
                    f"{what} (strictness='error'). Fix: install a framework version the plugin "
                    f"supports, or skip this adapter (enable(..., skip_adapters=[...])), or use "
                    f"strictness='warn' to run without this patch."
                ) from exc
            log.error(
                "%s: could not patch %s when it was imported: %s; this framework runs without "
                "the plugin's patch",
                self.owner,
                self.module,
                what,
            )

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


class _CallbackLoader(importlib.abc.Loader):
    """The real loader, plus the hook's call back once the module has executed."""

    def __init__(self, loader: Any, hook: _PostImportHook) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._hook.fire(module)

    def __getattr__(self, name: str) -> Any:  # get_data, resource readers, ...
        return getattr(self._loader, name)


def _failure(exc: BaseException) -> str:
    """Why a patch failed, in words; a missing attribute is named as such.

    Python words an ``AttributeError`` on a module that is still initialising as "most likely
    due to a circular import", which misleads here: the attribute is simply not there.
    """
    if isinstance(exc, AttributeError) and exc.name is not None:
        owner = getattr(exc.obj, "__name__", None) or type(exc.obj).__name__
        return (
            f"{owner} has no attribute {exc.name!r} (this version of the framework does not "
            f"define it)"
        )
    return f"{type(exc).__name__}: {exc}"


def _qualname(obj: Any) -> str:
    if obj is os.environ:
        return "os.environ"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    # An instance is named by its class: some reprs (DeepSpeed's scalers) raise.
    return name or f"<{type(obj).__name__} instance>"


@checked
def is_patched(func: Any) -> bool:
    """True when ``func`` is a wrapper installed by
    [`Patcher.wrap`][precision_plugin._base.patching.Patcher.wrap]."""
    func = func.__func__ if isinstance(func, (staticmethod, classmethod)) else func
    return hasattr(func, ORIGINAL_ATTR)
