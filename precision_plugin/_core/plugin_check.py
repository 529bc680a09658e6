"""Plugins that implement a hook no spec defines (a misspelt ``precision_instal``): pluggy's
``check_pending()`` after the plugins load, settled per place.

- ``enable()`` raises [`PluginHookError`][precision_plugin.errors.PluginHookError] under
  ``strictness="error"`` and logs a warning otherwise;
- ``precision-plugin doctor`` reports each as a warning finding;
- inside engine processes (the vLLM, SGLang and verl entry points) it is only logged: an engine
  worker is never stopped for another plugin's typo.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable

import pluggy

from precision_plugin import hookspecs
from precision_plugin._base.report import Finding
from precision_plugin.errors import PluginHookError

log = logging.getLogger("precision_plugin")

_FIX = (
    "rename it to a hook of precision_plugin.hookspecs, or mark it "
    "@hookimpl(optionalhook=True) if it is meant for a newer precision_plugin"
)


def pending_hooks(pm: pluggy.PluginManager) -> list[str]:
    """One line per hook implementation of ``pm`` that matches no hook spec (what pluggy's
    ``check_pending()`` refuses), naming the plugin, the hook and the closest real hook."""
    try:
        pm.check_pending()
    except pluggy.PluginValidationError:
        pass
    else:
        return []
    specs = sorted(n for n in vars(hookspecs) if n.startswith("precision_"))
    found = []
    for name in sorted(vars(pm.hook)):
        hook = getattr(pm.hook, name)
        if name.startswith("_") or not isinstance(hook, pluggy.HookCaller) or hook.has_spec():
            continue
        for impl in hook.get_hookimpls():
            if impl.optionalhook:
                continue
            close = difflib.get_close_matches(name, specs, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            found.append(
                f"plugin {impl.plugin_name!r} implements {name!r}, which is no hook of "
                f"precision_plugin{hint}, so it is never called"
            )
    return found


def check_plugins(pm: pluggy.PluginManager, *, strict: bool) -> list[str]:
    """``enable()``'s check: raise ``PluginHookError`` (``strict``) or log a warning; returns
    the problems."""
    problems = pending_hooks(pm)
    if problems:
        message = f"precision_plugin: {'; '.join(problems)}. Fix: {_FIX}."
        if strict:
            raise PluginHookError(message)
        log.warning("%s", message)
    return problems


def log_pending_hooks(manager: Callable[[], pluggy.PluginManager], where: str) -> list[str]:
    """The engine processes' check (vLLM, SGLang, verl entry points): log only, never raise.
    ``manager`` builds the plugin manager
    (``precision_plugin._core.manager.get_plugin_manager``)."""
    try:
        problems = pending_hooks(manager())
    except Exception as exc:  # never stop an engine worker over this check
        log.debug("precision_plugin: the plugin check could not run in %s: %s", where, exc)
        return []
    for problem in problems:
        log.warning("precision_plugin (%s): %s. Fix: %s.", where, problem, _FIX)
    return problems


def plugin_findings(pm: pluggy.PluginManager) -> list[Finding]:
    """``doctor``'s findings: one warning per hook implementation no spec knows."""
    return [Finding("plugins", "warning", problem, fix=_FIX) for problem in pending_hooks(pm)]
