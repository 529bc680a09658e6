"""Inside verl's processes: the ``verl.plugins`` entry point (verl >= 0.9) checks every worker.

``import verl`` (>= 0.9) imports this module in the driver, the ``TaskRunner`` and every Ray
worker. When ``PRECISION_PLUGIN`` is set there (``verl-overrides`` puts it in the Ray runtime
environment), it wraps ``verl.utils.config.omega_conf_to_dataclass``, the one function verl's
workers use to turn their config section into dataclasses, so each section a worker builds (its
actor, reference or policy-rollout config) is checked against the policy before the worker uses it:
a contradiction raises :class:`~precision_plugin.errors.PrecisionMismatchError` in the worker
under ``strictness="error"``, else is logged once per process. Without ``PRECISION_PLUGIN``
importing this module changes nothing.

verl 0.7/0.8 have no entry-point group but import the modules named in
``VERL_USE_EXTERNAL_MODULES``: ``VERL_USE_EXTERNAL_MODULES=precision_plugin.verl.plugin`` in the
Ray runtime environment does the same there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from precision_plugin._base.patching import Patcher
from precision_plugin._core.manager import get_plugin_manager
from precision_plugin._core.plugin_check import log_pending_hooks
from precision_plugin.errors import PrecisionPluginError
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.verl.check import Contradiction, find_contradictions, settle

log = logging.getLogger("precision_plugin")

CONFIG_MODULE = "verl.utils.config"

_lock = threading.Lock()
# verl has no unload hook: the patch lives as long as the process (like the vLLM env path).
_patcher = Patcher(owner="precision_plugin[verl:env]")
_reported: set[str] = set()


def section_config(obj: Any) -> dict[str, Any] | None:
    """Place one converted verl config section where :func:`find_contradictions` looks for it.

    A rollout config that computes log-probs (the policy's rollout; a generative reward model's
    rollout is also a ``RolloutConfig``, with ``calculate_log_probs`` off, and is left alone) or
    an actor/reference config (``strategy`` with ``fsdp_config`` or ``megatron``); ``None`` for
    any other section.
    """
    if hasattr(obj, "dtype") and getattr(obj, "calculate_log_probs", False):
        return {"actor_rollout_ref": {"rollout": obj}}
    if hasattr(obj, "strategy") and (hasattr(obj, "fsdp_config") or hasattr(obj, "megatron")):
        return {"actor_rollout_ref": {"actor": obj}}
    return None


def check_section(obj: Any, policy: PrecisionPolicy) -> list[Contradiction]:
    """Check one section verl just built against ``policy``; each problem is settled once."""
    cfg = section_config(obj)
    if cfg is None:
        return []
    problems = [p for p in find_contradictions(cfg, policy) if str(p) not in _reported]
    if policy.strictness != "error":
        _reported.update(str(p) for p in problems)
    settle(problems, policy, where=f"verl {type(obj).__name__} of this worker")
    return problems


def _checking(policy: PrecisionPolicy) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def omega_conf_to_dataclass(*args: Any, **kwargs: Any) -> Any:
            obj = original(*args, **kwargs)
            check_section(obj, policy)
            return obj

        return omega_conf_to_dataclass

    return make


def install(policy: PrecisionPolicy | None = None) -> bool:
    """Check every config section verl converts in this process; ``False`` when no policy applies.

    ``policy`` defaults to the one ``PRECISION_PLUGIN`` describes; idempotent.
    """
    policy = policy or PrecisionPolicy.from_env()
    if policy is None:
        return False
    with _lock:
        if len(_patcher):
            return True

        def patch(module: Any) -> None:
            _patcher.wrap(
                module,
                "omega_conf_to_dataclass",
                _checking(policy),
                reason="verl has no config-validation hook; every worker builds its config "
                "sections through this function",
            )

        _patcher.when_imported(
            CONFIG_MODULE, patch, reason="the entry point runs inside `import verl`"
        )
    return True


def _load() -> None:
    """Entry-point body. verl logs a failing plugin only at debug level, so say it here."""
    try:
        if install():
            log.info("precision_plugin: verl config sections are checked in this process")
            log_pending_hooks(get_plugin_manager, "verl process")
    except PrecisionPluginError as exc:
        log.warning("precision_plugin: the verl plugin is not active: %s", exc)


_load()
