"""The pluggy plugin manager and the enable/disable life cycle.

Built-in adapters are registered exactly like third-party ones (entry-point group
``precision_plugin``). ``enable()`` is atomic: each adapter installs through its own
[`Patcher`][precision_plugin._base.patching.Patcher]; if one fails, every adapter already installed
is
rolled back and the error names the failing adapter.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import pluggy

from precision_plugin import hookspecs
from precision_plugin._base.boundary import checked, one_of, policy_arg
from precision_plugin._base.patching import Patcher
from precision_plugin.errors import AdapterInstallError, PrecisionConfigError, PrecisionPluginError
from precision_plugin.policy import ENV_VAR, PrecisionPolicy

log = logging.getLogger("precision_plugin")

#: Built-in adapters, by short name -> module. Each module imports its framework lazily.
BUILTIN_ADAPTERS: dict[str, str] = {
    "transformers": "precision_plugin.transformers",
    # The Trainer wraps binding the callback (layer 4, beside it); skipped with "transformers".
    "transformers.trainer": "precision_plugin.trainer_hooks",
    "accelerate": "precision_plugin.accelerate",
    "deepspeed": "precision_plugin.deepspeed.adapter",
    "trl": "precision_plugin.trl.adapter",
    "vllm": "precision_plugin.vllm.adapter",
    "verl": "precision_plugin.verl.adapter",
    "openrlhf": "precision_plugin.openrlhf.adapter",
    "sglang": "precision_plugin.sglang.adapter",
}

_lock = threading.RLock()
_manager: pluggy.PluginManager | None = None


@dataclass
class _ActiveState:
    policy: PrecisionPolicy
    skip: frozenset[str] = frozenset()
    patchers: list[tuple[str, Patcher]] = field(default_factory=list)


_active: _ActiveState | None = None


def get_plugin_manager() -> pluggy.PluginManager:
    """Return the process-wide plugin manager (built-ins plus entry-point plugins)."""
    global _manager
    with _lock:
        if _manager is None:
            pm = pluggy.PluginManager(hookspecs.PROJECT)
            pm.add_hookspecs(hookspecs)
            for name, module in BUILTIN_ADAPTERS.items():
                try:
                    pm.register(importlib.import_module(module), name=name)
                except ModuleNotFoundError as exc:
                    if exc.name != module:
                        raise
                    log.debug("built-in adapter %s not present in this build", module)
            pm.load_setuptools_entrypoints(hookspecs.PROJECT)
            _manager = pm
        return _manager


#: The hooks of ``hookspecs``, for the boundary check of ``hook_name``.
_HOOK_NAMES = one_of(*sorted(n for n in vars(hookspecs) if n.startswith("precision_")))


@checked(hook_name=_HOOK_NAMES)
def hook_impls(hook_name: str) -> list[tuple[str, Callable[..., Any]]]:
    """Each implementation of hook ``hook_name`` as ``(plugin name, call)``, in pluggy's order.

    ``call(**kwargs)`` passes the implementation the subset of ``kwargs`` it declares, as pluggy
    does. For the core's calls one implementation at a time (to roll back, or to isolate a
    broken plugin); [`call_each`][precision_plugin._core.manager.call_each] is the common case.
    """
    impls = getattr(get_plugin_manager().hook, hook_name).get_hookimpls()

    def caller(impl: pluggy.HookImpl) -> Callable[..., Any]:
        return lambda **kwargs: impl.function(*(kwargs[name] for name in impl.argnames))

    return [(impl.plugin_name, caller(impl)) for impl in reversed(impls)]


@checked(hook_name=_HOOK_NAMES)
def call_each(hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
    """Call every implementation of ``hook_name`` on its own: ``[(plugin name, outcome)]``.

    The outcome is the implementation's result, or the exception it raised (one broken plugin
    neither hides the others nor stops the caller); the caller decides what a failure means.
    """
    outcomes: list[tuple[str, Any]] = []
    for name, call in hook_impls(hook_name):
        try:
            outcomes.append((name, call(**kwargs)))
        except Exception as exc:
            outcomes.append((name, exc))
    return outcomes


def call_each_reported(
    hook_name: str, *, refusals: bool = True, strictness: str | None = None, **kwargs: Any
) -> list[Any]:
    """[`call_each`][precision_plugin._core.manager.call_each], with failures settled: the
    non-``None``
    results, in call order.

    A plugin that crashes (any exception that is not a
    [`PrecisionPluginError`][precision_plugin.errors.PrecisionPluginError]) is logged as a
    warning naming it and skipped, so it neither hides the others nor stops the user's run. A
    deliberate refusal (``PrecisionPluginError``: strictness, bad config) is raised when
    ``refusals`` is true, and logged like a crash otherwise (``disable()`` must always finish).
    Inside ``train()`` (``strictness`` given) only a refusal that stops training is raised
    (see ``precision_plugin._base.shield``); a crash is warned about once per plugin and hook.
    """
    from precision_plugin._base.shield import stops_training, warn_once

    results: list[Any] = []
    for name, outcome in call_each(hook_name, **kwargs):
        stop = strictness is None or stops_training(outcome, strictness)
        if isinstance(outcome, PrecisionPluginError) and refusals and stop:
            raise outcome
        if isinstance(outcome, Exception):
            warn_once(f"plugin {name!r} in {hook_name} (the other adapters ran)", outcome)
        elif outcome is not None:
            results.append(outcome)
    return results


def adapter_names() -> list[str]:
    """Names of all registered adapters, built-in and third-party, in call order."""
    return [name for name, _ in hook_impls("precision_install")]


@checked
def resolve_policy(
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    what: str = "policy",
) -> PrecisionPolicy:
    """The one answer to "which policy applies here?", used by every public entry point.

    In order: ``policy`` when given (a policy, a dict or a dtype name), else the policy
    ``enable()`` installed in this process, else the one ``PRECISION_PLUGIN`` describes, else
    the defaults (float16). A wrong kind of object is refused at the boundary of the public function
    that was called (``what``, kept for callers, names it in older messages).
    """
    if policy is not None:
        return policy_arg(policy)  # type: ignore[no-any-return]
    return requested_policy() or PrecisionPolicy()


@checked
def requested_policy() -> PrecisionPolicy | None:
    """The policy this process was asked to follow: ``enable()``'s, else ``PRECISION_PLUGIN``'s.

    ``None`` when neither asked for one: code that acts only on request (vLLM's general plugin)
    does nothing then.
    """
    return current_policy() or PrecisionPolicy.from_env()


def coerce_policy(
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None, **overrides: Any
) -> PrecisionPolicy:
    """Turn what a user passes to ``enable()`` into a ``PrecisionPolicy``.

    ``policy`` may be a policy, a dict, a dtype name, or ``None`` (defaults, or the
    ``PRECISION_PLUGIN`` environment variable when set; never the policy already active, so
    ``enable()`` after ``enable(dtype="bfloat16")`` switches back to the defaults); keyword
    ``overrides`` apply on top (``enable(dtype="bfloat16")``,
    ``enable(loss_scaler={"growth_interval": 200})``).
    """
    base = policy_arg(policy) if policy is not None else None
    if base is None:
        base = PrecisionPolicy.from_env()
        if base is None and os.environ.get(ENV_VAR) is not None:
            # The variable switches off what it would switch on (a launcher's default); the
            # code's own call wins, but not without a word.
            log.warning(
                "precision_plugin: %s=%r says off, and enable() was called: the defaults "
                "(dtype=float16) are enabled; unset the variable, or do not call enable(), to "
                "run without the plugin",
                ENV_VAR,
                os.environ[ENV_VAR],
            )
        base = base or PrecisionPolicy()
    given = _given_fields(policy)
    for key, value in overrides.items():
        # A keyword that repeats the policy's own key with another meaning silently won.
        # (A section given both ways is merged by replace(), as documented.)
        repeated = key in given and not isinstance(value, Mapping)
        if repeated and base.replace(**{key: value}) != base:
            raise PrecisionConfigError(
                f"enable(): {key} is given twice with different values, {given[key]!r} in "
                f"the policy and {key}={value!r} as a keyword; pass it once."
            )
    return base.replace(**overrides) if overrides else base


def _given_fields(policy: Any) -> Mapping[str, Any]:
    """The keys ``policy`` sets, as the user wrote them: a dtype name's ``dtype``, a dict's own
    keys, a policy object's fields that differ from the defaults (a default one is a base the
    keywords change, ``enable(PrecisionPolicy(), dtype="bfloat16")``)."""
    if isinstance(policy, str):
        return {"dtype": policy}
    if isinstance(policy, Mapping):
        return policy
    if isinstance(policy, PrecisionPolicy):
        default = PrecisionPolicy()
        return {
            f.name: getattr(policy, f.name)
            for f in fields(PrecisionPolicy)
            if getattr(policy, f.name) != getattr(default, f.name)
        }
    return {}


def _policy_as_given(value: Any) -> Any:
    policy_arg(value)  # refused here, as every policy argument is
    return value  # enable() compares the keywords with what the user wrote, not its policy


@checked(policy=dataclasses.replace(policy_arg, check=_policy_as_given))
def enable(
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    skip_adapters: Iterable[str] | str = (),
    **overrides: Any,
) -> PrecisionPolicy:
    """Install every adapter for ``policy``; return the active policy.

    Idempotent: enabling the same policy (and the same ``skip_adapters``) again changes nothing;
    anything else replaces the active installation (the old patches are restored first). Atomic:
    when an adapter fails, everything it and the others installed is rolled back, the previously
    active policy (if any) is reinstalled, and
    [`AdapterInstallError`][precision_plugin.errors.AdapterInstallError] names the adapter.
    """
    global _active
    new = coerce_policy(policy, **overrides)
    skip = _adapter_set(skip_adapters)
    unknown = skip - set(adapter_names())
    if unknown:
        raise PrecisionConfigError(
            f"enable(skip_adapters=...): unknown adapter(s) {sorted(unknown)}; registered "
            f"adapters: {adapter_names()}."
        )
    from precision_plugin._core.plugin_check import check_plugins

    check_plugins(get_plugin_manager(), strict=new.strictness == "error")
    with _lock:
        previous = _active
        if previous is not None:
            if previous.policy == new and previous.skip == skip:
                return previous.policy
            disable()
        try:
            _active = _install(new, skip)
        except BaseException:
            if previous is not None:
                try:
                    _active = _install(previous.policy, previous.skip)
                except Exception:  # pragma: no cover - it installed a moment ago
                    log.exception("precision_plugin: could not reinstall the previous policy")
            raise
        log.info(
            "precision_plugin enabled: dtype=%s, %d patch(es) by %s",
            new.dtype,
            sum(len(p) for _, p in _active.patchers),
            [name for name, p in _active.patchers if len(p)],
        )
        return new


def _adapter_set(skip_adapters: Iterable[str] | str) -> frozenset[str]:
    if isinstance(skip_adapters, str):
        return frozenset([skip_adapters])
    return frozenset(skip_adapters)


def _install(policy: PrecisionPolicy, skip: frozenset[str]) -> _ActiveState:
    """Run every adapter's ``precision_install``; on a failure restore all and raise.

    Whatever stops an install (an adapter's error, a deliberate refusal, a ``KeyboardInterrupt``)
    restores every patch made so far before it propagates; only an adapter's unexpected error
    is wrapped in [`AdapterInstallError`][precision_plugin.errors.AdapterInstallError].
    """
    state = _ActiveState(policy, skip)
    strict = policy.strictness == "error"
    name = "core"
    try:
        core = Patcher(owner="precision_plugin[core]", strict=strict)
        state.patchers.append(("core", core))
        core.setenv(
            ENV_VAR,
            policy.to_json(),
            reason="child processes (vLLM servers, engine cores, launched workers) follow the "
            "policy this process enabled",
        )
        for name, install in hook_impls("precision_install"):
            if name in skip or name.partition(".")[0] in skip:
                continue
            patcher = Patcher(owner=f"precision_plugin[{name}]", strict=strict)
            state.patchers.append((name, patcher))
            install(policy=policy, patcher=patcher)
    except BaseException as exc:
        for _, done in reversed(state.patchers):
            done.restore()
        if isinstance(exc, PrecisionPluginError) or not isinstance(exc, Exception):
            raise  # a deliberate refusal already says what to fix; an interrupt stays one
        raise AdapterInstallError(name, exc) from exc
    return state


@checked
def disable() -> bool:
    """Undo ``enable()``: restore every patched attribute to the identical original object,
    and undo every change the plugin still holds on a user's object (a model's fp32 wrappers
    or detector hooks, a trainer's telemetry wrappers, left by a ``train()`` that stopped on an
    exception), with or without ``enable()``.

    Returns ``True`` when something was enabled or undone, ``False`` when there was nothing.
    """
    global _active
    from precision_plugin._base.patching import undo_tracked
    from precision_plugin._base.shield import forget_warnings

    forget_warnings()  # a new run warns anew
    undone = undo_tracked()
    if undone:
        log.info("precision_plugin: undid %s", "; ".join(undone))
    with _lock:
        if _active is None:
            return bool(undone)
        state, _active = _active, None
        try:
            # One adapter at a time: a plugin that fails here must not keep the others from
            # releasing what they hold; every patch is restored whatever happens.
            call_each_reported("precision_uninstall", refusals=False, policy=state.policy)
        finally:
            for _, patcher in reversed(state.patchers):
                patcher.restore()
        log.info("precision_plugin disabled")
        return True


@checked
def current_policy() -> PrecisionPolicy | None:
    """The policy ``enable()`` installed in this process, or ``None``."""
    return _active.policy if _active is not None else None


def adapter_patcher(name: str) -> Patcher | None:
    """The patcher ``enable()`` gave adapter ``name``, or ``None`` when not enabled.

    For patches an adapter makes later, from a framework callback (vLLM's general plugin), so
    that ``disable()`` restores them with the rest.
    """
    if _active is None:
        return None
    return next((p for n, p in _active.patchers if n == name), None)


@checked
def active_patches() -> dict[str, list[str]]:
    """What each adapter has patched right now, for ``doctor`` and debugging."""
    if _active is None:
        return {}
    return {name: p.patched for name, p in _active.patchers if len(p)}
