"""Inside SGLang's processes: the ``sglang.srt.plugins`` entry point.

SGLang's ``load_plugins()`` calls [`general_plugin`][precision_plugin.sglang.general_plugin] in
each process it starts and then applies what it registered in its ``HookRegistry``. When a
policy is requested (``PRECISION_PLUGIN`` in the environment, or ``enable()`` in the process) it
registers two hooks:

- **force**, a BEFORE hook on ``ServerArgs.resolve_once`` (SGLang >= 0.5.20; its
  ``__post_init__`` before, where construction resolves): the policy dtype is written into the
  record before SGLang resolves it (``auto`` silently; another explicit dtype with a warning, or
  refused under ``strictness="error"``), then the launch is checked like
  [`check_server_args`][precision_plugin.sglang.check_server_args] does. This reaches
  ``sglang serve``, ``python -m sglang.launch_server`` and ``sglang.Engine(...)``, which load
  plugins before they build or resolve the record.
- **verify**, an AFTER hook on ``ModelConfig.from_server_args``: the torch dtype the model
  config resolved to is compared with the policy in every process that builds one (the main
  process's tokenizer manager, each scheduler), and so are the traps the record carries
  (``rl_on_policy_target``, a bf16 KV cache, the hpc_ops backends, ``SGLANG_SANITIZE_NAN_LOGITS``
  in the process's environment); a contradiction is refused under ``strictness="error"`` (the
  process stops) or logged once per process. This is what remains where the record
  is resolved before plugins load (``Engine._launch_subprocesses`` as verl, slime and AReaL call
  it): there the plugin can only verify. AReaL 1.0.4's own scheduler entry does not load
  plugins, so there it verifies in the main process only; SGLang before :data:`LOADER_SINCE`
  (AReaL's pin 0.5.10.post1) loads no plugins at all.

SGLang catches exceptions of a plugin's function, so a malformed ``PRECISION_PLUGIN`` registers
a hook that refuses the launch instead of silently running without the plugin. SGLang's
``SGLANG_PLUGINS``, when set, must name ``precision_plugin`` or SGLang skips it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from typing import Any

from packaging.version import Version

from precision_plugin._base.boundary import checked
from precision_plugin._base.conflicts import settle_conflict
from precision_plugin._core.frameworks import sglang_dtype, sglang_runs
from precision_plugin._core.manager import get_plugin_manager, requested_policy
from precision_plugin._core.plugin_check import log_pending_hooks
from precision_plugin._core.serving import settle_findings
from precision_plugin.errors import PrecisionConfigError, PrecisionMismatchError
from precision_plugin.policy import ENV_VAR, PrecisionPolicy, normalize_dtype
from precision_plugin.sglang.args import read_server_args
from precision_plugin.sglang.check import launch_findings, trap_findings

log = logging.getLogger("precision_plugin")

SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
#: Where SGLang resolves a ``ServerArgs`` record: ``resolve_once`` (>= 0.5.20, a msgspec
#: Struct), ``__post_init__`` before (a dataclass resolved at construction).
RESOLVE_METHODS = ("resolve_once", "__post_init__")
MODEL_CONFIG_TARGET = "sglang.srt.configs.model_config.ModelConfig.from_server_args"
#: SGLang's entry-point group and this plugin's name in it (what ``SGLANG_PLUGINS`` must list).
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "precision_plugin"
#: The first SGLang whose processes load that group (``sglang/srt/plugins/``, ``load_plugins``
#: in ``launch_server``, ``Engine`` and the scheduler): absent from the 0.5.10.post1 wheel
#: (AReaL 1.0.4's pin), present in 0.5.11.
LOADER_SINCE = Version("0.5.11")

_lock = threading.Lock()
_registered: list[str] = []
_verified: set[tuple[str, str]] = set()
#: Trap findings already logged in this process (the force and verify hooks both check them).
_logged_traps: set[str] = set()
#: How the findings of both hooks name the launch (``launch_findings``' default).
_LAUNCH = "the SGLang launch"


def resolve_target(server_args_cls: type) -> str:
    """The dotted path of the method that resolves ``server_args_cls`` (what *force* hooks)."""
    for name in RESOLVE_METHODS:
        if name in vars(server_args_cls):
            return f"{SERVER_ARGS}.{name}"
    raise PrecisionConfigError(
        f"this SGLang's ServerArgs has neither {' nor '.join(RESOLVE_METHODS)}; the plugin "
        f"cannot set the dtype before resolution. Pass --dtype explicitly (the verify hook "
        f"still checks it)."
    )


def force_dtype(server_args: Any, policy: PrecisionPolicy) -> None:
    """Write the policy dtype into an unresolved ``ServerArgs`` and check the launch."""
    if getattr(server_args, "_resolution_finished", False) or getattr(
        server_args, "_resolution_failed", False
    ):
        return  # resolved in another process (a pickled record), or failed: nothing to set
    asked = getattr(server_args, "dtype", "auto")
    wanted = sglang_dtype(policy)
    if sglang_runs(asked) != policy.dtype:
        if sglang_runs(asked) is not None:
            settle_conflict(
                policy.strictness,
                f"SGLang was launched with --dtype {asked}, which contradicts the policy dtype "
                f"{wanted}",
                fix=f"leave --dtype at auto (the plugin sets {wanted}), or run the dtype you "
                f"want on both sides ({ENV_VAR}={normalize_dtype(asked)})",
                outcome=f"SGLang runs {wanted} (strictness='warn')",
            )
        server_args.dtype = wanted
        log.info("precision_plugin: SGLang dtype %s -> %s", asked, wanted)
    findings = launch_findings(read_server_args(server_args), policy, os.environ)
    _logged_traps.update(f.message for f in findings if f.status in ("warning", "error"))
    settle_findings([f for f in findings if f.status != "ok"], policy)


def _before_resolution(*args: Any, **kwargs: Any) -> None:
    """BEFORE hook: the policy (if any) decides the dtype of the record about to be resolved."""
    # Ambient on purpose (and in the two hooks below): SGLang calls its plugins' hooks with its
    # own arguments, in processes it starts itself; the policy is the one this process was asked
    # to follow (enable(), else PRECISION_PLUGIN).
    policy = requested_policy()
    if policy is not None and args:
        force_dtype(args[0], policy)


def _torch_name(value: Any) -> str:
    return str(value).removeprefix("torch.")


def verify_model_config(model_config: Any, policy: PrecisionPolicy, *, draft: bool = False) -> None:
    """Compare the dtype a built SGLang ``ModelConfig`` runs with the policy (once per process
    and outcome): a mismatch is refused under ``strictness="error"``, else logged."""
    runs = _torch_name(getattr(model_config, "dtype", None))
    try:
        canonical = normalize_dtype(runs)
    except PrecisionConfigError:
        canonical = runs
    what = "draft model" if draft else "model"
    process = f"{multiprocessing.current_process().name} (pid {os.getpid()})"
    key = (what, canonical)
    if canonical == policy.dtype:
        if key not in _verified:
            _verified.add(key)
            log.info("precision_plugin: SGLang %s in %s runs %s", what, process, canonical)
        return
    message = (
        f"precision_plugin: SGLang's {what} in {process} runs {runs}, but the policy is "
        f"{policy.dtype}. The record was resolved before the plugin could set its dtype (SGLang "
        f"embedded through Engine._launch_subprocesses, as verl, slime and AReaL do), or SGLang "
        f"forces this architecture's dtype"
    )
    fix = (
        f"pass dtype={sglang_dtype(policy)} where the framework builds SGLang's arguments "
        f"(verl: $(precision-plugin verl-overrides --engine sglang); slime: --fp16 or "
        f"--sglang-dtype; AReaL: sglang.dtype), or use the consistent-bf16 mode"
    )
    if policy.strictness == "error":
        raise PrecisionMismatchError(f"{message} (strictness='error'). Fix: {fix}.")
    if key not in _verified:
        _verified.add(key)
        log.warning("%s; it runs as resolved (strictness='warn'). Fix: %s.", message, fix)


def verify_traps(server_args: Any, policy: PrecisionPolicy) -> None:
    """Check the traps of a record this process got resolved (verl, slime and AReaL build it
    before the plugin loads, so the force hook never saw it): ``rl_on_policy_target``, a bf16
    KV cache, the hpc_ops backends, ``SGLANG_SANITIZE_NAN_LOGITS`` here. Errors are refused
    under ``strictness="error"``; otherwise each finding is logged once per process."""
    found = trap_findings(read_server_args(server_args), None, policy, os.environ, _LAUNCH)
    errors = [f for f in found if f.status == "error"]
    if errors and policy.strictness == "error":
        settle_findings(errors, policy)  # raises
    for finding in found:
        if finding.status in ("warning", "error") and finding.message not in _logged_traps:
            _logged_traps.add(finding.message)
            log.warning("precision_plugin: %s Fix: %s.", finding.message, finding.fix)


def _after_model_config(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER hook on ``ModelConfig.from_server_args``: verify what was built, and the traps of
    the record it was built from."""
    policy = requested_policy()  # ambient: see _before_resolution
    if policy is None:
        return
    draft = bool(kwargs.get("is_draft_model"))
    verify_model_config(result, policy, draft=draft)
    server_args = args[0] if args else kwargs.get("server_args")
    if not draft and server_args is not None:
        verify_traps(server_args, policy)


def _refuse(message: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PrecisionConfigError(message)

    return refuse


def register_hooks() -> list[str]:
    """Register the *force* and *verify* hooks in SGLang's ``HookRegistry`` (idempotent).

    SGLang applies them after every plugin ran (``load_plugins``); a caller outside
    ``load_plugins`` applies them with ``HookRegistry.apply_hooks()``. Returns the targets.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import ServerArgs

    with _lock:
        if _registered:
            return list(_registered)
        try:
            policy = requested_policy()  # ambient: see _before_resolution
        except PrecisionConfigError as exc:
            log.error(
                "precision_plugin: %s SGLang is stopped before it resolves its arguments.", exc
            )
            target = resolve_target(ServerArgs)
            HookRegistry.register(target, _refuse(str(exc)), HookType.BEFORE)
            _registered.append(target)
            return list(_registered)
        if policy is None:
            return []
        targets = [(resolve_target(ServerArgs), _before_resolution, HookType.BEFORE)]
        targets.append((MODEL_CONFIG_TARGET, _after_model_config, HookType.AFTER))
        for target, hook, kind in targets:
            HookRegistry.register(target, hook, kind)
            _registered.append(target)
        log.info("precision_plugin: SGLang runs the %s policy in this process", policy.dtype)
        return list(_registered)


@checked
def general_plugin() -> None:
    """The ``sglang.srt.plugins`` entry point (SGLang's ``load_plugins()`` calls it in each of
    its processes). Does nothing unless ``PRECISION_PLUGIN`` is set or ``enable()`` ran."""
    if register_hooks():
        log_pending_hooks(get_plugin_manager, "SGLang process")
