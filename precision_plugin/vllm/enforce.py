"""Enforcement inside vLLM processes: every ``EngineArgs`` follows the requested policy.

[`general_plugin`][precision_plugin.vllm.general_plugin] is the ``vllm.general_plugins`` entry point
(vLLM loads it in each of its processes: API server, engine core, workers); ``enable()`` installs
the same patches through the adapter (``precision_plugin.vllm.adapter``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping
from typing import Any

from precision_plugin._base.boundary import Invalid, Validator, checked
from precision_plugin._base.patching import Patcher, is_patched
from precision_plugin._core.builders import built_by_openrlhf
from precision_plugin._core.manager import (
    adapter_patcher,
    get_plugin_manager,
    requested_policy,
    resolve_policy,
)
from precision_plugin._core.model_risks import check_engine_model
from precision_plugin._core.plugin_check import log_pending_hooks
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import ENV_VAR, PrecisionPolicy
from precision_plugin.vllm.engine import (
    MANAGED,
    MARKER,
    NO_DEFAULT,
    EngineSettings,
    canonical_dtype,
    decide_cascade,
    engine_arg_fields,
    report_settings,
    resolve_engine_kwargs,
    vllm_version,
)

log = logging.getLogger("precision_plugin")

patch_lock = threading.RLock()


def _check_checkpoint(engine_args: Any, policy: PrecisionPolicy) -> None:
    """Refuse (or warn about) the checkpoint before vLLM resolves its config in float16."""
    source = getattr(engine_args, "hf_config_path", None) or engine_args.model
    check_engine_model(
        source,
        policy,
        dtype=canonical_dtype(engine_args.dtype),
        revision=getattr(engine_args, "revision", None),
    )


def _engine_args(value: Any) -> Any:
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        raise Invalid(
            "is not a vLLM EngineArgs instance; pass EngineArgs(...), or for keyword arguments "
            "use engine_kwargs()"
        )
    return value


@checked(engine_args=Validator("a vLLM EngineArgs instance", _engine_args))
def enforce_on_engine_args(
    engine_args: Any, policy: PrecisionPolicy | Mapping[str, Any] | str
) -> EngineSettings:
    """Apply [`engine_kwargs`][precision_plugin.vllm.engine_kwargs] to an ``EngineArgs`` instance in
    place (fields as defaults).

    ``policy`` may be a policy, a dict or a dtype name; ``engine_args`` must be an
    ``EngineArgs`` (a dataclass instance).
    """
    return enforce_engine_args(engine_args, resolve_policy(policy))


def enforce_engine_args(engine_args: Any, policy: PrecisionPolicy) -> EngineSettings:
    """[`enforce_on_engine_args`][precision_plugin.vllm.enforce_on_engine_args] for a resolved
    ``policy`` (the ``EngineArgs.create_model_config`` wrapper)."""
    fields = engine_arg_fields(type(engine_args)) or {}
    explicit = {
        name: getattr(engine_args, name)
        for name in MANAGED
        if name in fields and getattr(engine_args, name) != fields[name]
    }
    # A framework's hard-coded dtype is no request of the user: not a conflict, even strict.
    hard_coded = explicit.pop("dtype", None) if built_by_openrlhf(engine_args) else None
    decision = decide_cascade(policy)
    settings = resolve_engine_kwargs(explicit, policy, decision, fields)
    report_settings(settings, policy, f"vLLM engine for {engine_args.model!r}")
    if hard_coded is not None and policy.vllm.enforce_dtype:
        runs = settings.kwargs["dtype"]
        if canonical_dtype(hard_coded) != runs:
            log.warning(
                "precision_plugin: OpenRLHF hard-codes dtype=%r for its vLLM engines; this "
                "engine for %r runs %s, the precision policy's dtype.",
                hard_coded,
                engine_args.model,
                runs,
            )
    elif hard_coded is not None:
        settings.kwargs["dtype"] = hard_coded
    for name in MANAGED:
        if name not in fields:
            continue
        wanted = settings.kwargs.get(name, fields[name])
        if wanted is not NO_DEFAULT and getattr(engine_args, name) != wanted:
            setattr(engine_args, name, wanted)
    _mark(engine_args, policy)
    return settings


def _mark(engine_args: Any, policy: PrecisionPolicy) -> None:
    """Leave the plugin's mark in the engine's ``additional_config`` (vLLM passes it through
    untouched): ``verify_engine``/``verify_server`` read it back, so an engine the plugin never
    reached (vLLM logs a plugin's import error at ERROR and runs on) is told apart."""
    extra = getattr(engine_args, "additional_config", None)
    if not isinstance(extra, dict):
        return
    mark = extra.get(MARKER)
    if not (isinstance(mark, dict) and mark.get("dtype") == policy.dtype):
        engine_args.additional_config = {**extra, MARKER: {"dtype": policy.dtype}}


def _fp16_refusal(exc: BaseException, policy: PrecisionPolicy) -> PrecisionConfigError | None:
    text = str(exc)
    if "does not support float16" not in text:
        return None
    line = next((ln.strip() for ln in text.splitlines() if "does not support float16" in ln), text)
    return PrecisionConfigError(
        f"vLLM refused the policy dtype {policy.dtype}: {line} Fix: use the consistent-bf16 "
        f"mode: precision_plugin.enable(dtype='bfloat16') or {ENV_VAR}=bfloat16."
    )


def _create_model_config(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """``EngineArgs.create_model_config`` after the engine args follow the requested policy."""
    # Ambient on purpose: vLLM builds EngineArgs itself (LLM(...), vllm serve, its engine-core
    # and worker processes) and gives the plugin no argument to pass a policy through; the
    # policy is the one this process was asked to follow (enable(), else PRECISION_PLUGIN).
    policy = requested_policy()
    if policy is not None:
        enforce_engine_args(self, policy)
        _check_checkpoint(self, policy)
    try:
        config = original(self, *args, **kwargs)
        if policy is not None:
            _say_active(policy)
        return config
    except Exception as exc:
        refusal = _fp16_refusal(exc, policy) if policy is not None else None
        if refusal is not None:
            raise refusal from exc
        raise


def _no_cascade_prefix(original: Any, *args: Any, **kwargs: Any) -> int:
    """A common prefix of 0: the runner never takes the cascade-attention path."""
    return 0


@checked
def install_vllm_patches(
    policy: PrecisionPolicy, patcher: Patcher, *, runner: bool = True
) -> list[str]:
    """Make every ``EngineArgs`` in this process follow the active policy; idempotent.

    ``runner=False`` leaves out the cascade patch of the GPU model runner (an import of the
    runner while ``vllm.engine.arg_utils`` is still being imported could be circular; the
    engine process applies it through the general plugin). Returns what was patched now (empty
    when it already was).
    """
    from vllm.engine.arg_utils import EngineArgs

    done: list[str] = []
    if not is_patched(vars(EngineArgs).get("create_model_config")):
        patcher.around(
            EngineArgs,
            "create_model_config",
            _create_model_config,
            reason="vLLM has no hook between argument parsing and config resolution; the "
            "wrapper applies engine_kwargs() for LLM(...), vllm serve and trl vllm-serve",
        )
        done.append("EngineArgs.create_model_config")
    from precision_plugin.vllm.cpu_weights import keep_cpu_weights, wants_kept_weights

    if wants_kept_weights(policy, weight_sync=False) and keep_cpu_weights(patcher):
        done.append("dispatch_cpu_unquantized_gemm")
    decision = decide_cascade(policy)
    if runner and decision.action == "patch_runner":
        try:
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        except Exception as exc:
            log.warning(
                "precision_plugin: %s The V1 GPU model runner is not importable here (%s); "
                "cascade attention cannot be disabled in this process. Upgrade vLLM to >= 0.11.",
                decision.reason,
                exc,
            )
        else:
            name = "_compute_cascade_attn_prefix_len"
            if name in vars(GPUModelRunner) and not is_patched(vars(GPUModelRunner)[name]):
                patcher.around(
                    GPUModelRunner,
                    name,
                    _no_cascade_prefix,
                    reason="vLLM < 0.8.2 has no flag to disable cascade attention; a common "
                    "prefix of 0 makes the runner skip it",
                )
                done.append(f"GPUModelRunner.{name}")
    if done:
        log.info("precision_plugin: vLLM runs %s; %s", policy.dtype, decision.summary())
    return done


@checked
def general_plugin() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM calls it in each of its processes).

    Does nothing unless ``PRECISION_PLUGIN`` is set or ``enable()`` ran in this process.
    Idempotent. vLLM itself skips it when ``VLLM_PLUGINS`` does not name ``precision_plugin``.
    """
    # Ambient on purpose: vLLM calls its general plugins with no argument, in processes it
    # starts itself; the policy is the one this process was asked to follow.
    policy = requested_policy()
    if policy is None or vllm_version() is None:
        return
    log_pending_hooks(get_plugin_manager, "vLLM process")
    with patch_lock:
        # Patches made under enable() go to its patcher, so disable() undoes them; those of the
        # env-var path live as long as the process (vLLM has no unload hook).
        patcher = adapter_patcher("vllm") or Patcher(owner="precision_plugin[vllm:env]")
        install_vllm_patches(policy, patcher)
    _say_active(policy)


_ACTIVE_LOG = logging.getLogger("vllm.precision_plugin")
_said_active: list[bool] = []


def _say_active(policy: PrecisionPolicy) -> None:
    """One line through vLLM's own logger, so every vLLM process (API server, engine core,
    worker) says under its own prefix that the plugin acts there; the plugin's logger has no
    handler in those processes. vLLM sets its logging up lazily (``create_engine_config``): until
    then the line waits for the first engine config of the process."""
    if _said_active or not logging.getLogger("vllm").handlers:
        return
    from precision_plugin.vllm.cpu_weights import wants_kept_weights

    _said_active.append(True)
    _ACTIVE_LOG.info(
        "precision_plugin active in this process: vLLM runs %s (policy from %s)%s",
        policy.dtype,
        "enable()" if adapter_patcher("vllm") else ENV_VAR,
        "; CPU Linear weights kept (F.linear)"
        if wants_kept_weights(policy, weight_sync=False)
        else "",
    )
