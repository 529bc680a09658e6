"""vLLM adapter: one dtype and the cascade-attention guard for every vLLM engine.

Public entry points:

- :func:`engine_kwargs` - the kwargs an ``LLM(...)`` / ``EngineArgs`` should get (pure).
- :func:`cascade_guard` - the guard's decision and reason for the installed vLLM and GPU.
- :func:`check_model_config` - fp16 refusals (raise) and overflow risks (warn) of a checkpoint.
- :func:`general_plugin` - the ``vllm.general_plugins`` entry point: active when
  ``PRECISION_PLUGIN`` is set or :func:`precision_plugin.enable` ran in the process; reaches
  ``LLM(...)``, ``vllm serve`` and ``trl vllm-serve`` alike.
- :func:`verify_server` / :func:`verify_engine` - compare what a server or a colocated engine
  actually runs with the policy.

vLLM is imported lazily, inside functions; without vLLM every hook does nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from precision_plugin import versions
from precision_plugin.errors import PrecisionConfigError, settle_conflict
from precision_plugin.hookspecs import hookimpl
from precision_plugin.manager import current_policy
from precision_plugin.patching import Patcher
from precision_plugin.policy import ENV_VAR, PrecisionPolicy, normalize_dtype
from precision_plugin.report import Finding
from precision_plugin.vllm_models import check_model_config, vllm_refusal_table
from precision_plugin.vllm_server import verify_engine, verify_server
from precision_plugin.vllm_versions import FLAG, CascadeDecision, cascade_decision

__all__ = [
    "EngineSettings",
    "cascade_guard",
    "check_model_config",
    "engine_kwargs",
    "general_plugin",
    "resolve_engine_kwargs",
    "verify_engine",
    "verify_server",
]

log = logging.getLogger("precision_plugin")

_AUTO: Any = object()
_NO_DEFAULT: Any = object()
#: Marks the wrappers this module installs, so installing twice is a no-op.
_MARK = "__precision_plugin_vllm__"
#: EngineArgs fields the plugin manages.
_MANAGED = ("dtype", "kv_cache_dtype", FLAG)
_HALF_KV = {"float16": "float16", "half": "float16", "bfloat16": "bfloat16"}

_lock = threading.RLock()
# Patches made by the env-var path live as long as the process (vLLM has no unload hook).
_env_patcher = Patcher(owner="precision_plugin[vllm:env]")
# The patcher enable() gave this adapter: patches made while enable() is active go there, so
# disable() restores them.
_enable_patcher: Patcher | None = None


# -- engine settings ---------------------------------------------------------------------------
@dataclasses.dataclass
class EngineSettings:
    """The result of :func:`resolve_engine_kwargs`: kwargs, the guard decision, and what changed.

    ``notes`` are changes that follow the policy without contradicting the caller (logged at
    info level); ``conflicts`` are requests that contradict it (a warning, or
    ``PrecisionMismatchError`` under ``strictness="error"``).
    """

    kwargs: dict[str, Any]
    decision: CascadeDecision
    notes: list[str] = dataclasses.field(default_factory=list)
    conflicts: list[str] = dataclasses.field(default_factory=list)


def _canonical(value: Any) -> str | None:
    """Canonical dtype name of a vLLM ``dtype`` value; ``None`` for ``auto``/unset."""
    if value is None or str(value).strip().lower() == "auto":
        return None
    try:
        return normalize_dtype(value)
    except PrecisionConfigError:
        return str(value)


def resolve_engine_kwargs(
    kwargs: Mapping[str, Any],
    policy: PrecisionPolicy,
    decision: CascadeDecision,
    fields: Mapping[str, Any] | None = None,
) -> EngineSettings:
    """Apply ``policy`` and the cascade ``decision`` to engine ``kwargs``; pure, never raises.

    ``fields`` maps the installed ``EngineArgs`` field names to their defaults (``None`` when
    vLLM cannot be imported): a field that does not exist, or whose default is ``None`` (the
    deprecated ``disable_cascade_attn`` of vLLM >= 0.32), is never passed.
    """
    out = dict(kwargs)
    result = EngineSettings(out, decision)

    model_dtype = _canonical(out.get("dtype"))
    if policy.vllm.enforce_dtype:
        if model_dtype is None:
            out["dtype"] = policy.dtype
            result.notes.append(f"dtype auto -> {policy.dtype}")
        elif model_dtype != policy.dtype:
            result.conflicts.append(
                f"dtype={kwargs['dtype']!r} contradicts the policy dtype {policy.dtype}"
            )
            out["dtype"] = policy.dtype
        model_dtype = policy.dtype

    kv = out.get("kv_cache_dtype")
    kv_name = str(kv).strip().lower() if kv is not None else "auto"
    if kv_name in _HALF_KV and model_dtype is not None and _HALF_KV[kv_name] != model_dtype:
        result.conflicts.append(
            f"kv_cache_dtype={kv!r} must match the model dtype {model_dtype}; set to 'auto'"
        )
        out["kv_cache_dtype"] = "auto"
    elif kv_name.startswith("fp8"):
        result.conflicts.append(
            f"kv_cache_dtype={kv!r} rounds the KV cache below {model_dtype or 'the model dtype'} "
            f"and adds rollout-only error the learner does not have (kept; use 'auto')"
        )

    has_flag = fields is None or (FLAG in fields and fields[FLAG] is not None)
    if decision.action == "pass_flag":
        if not has_flag:
            out.pop(FLAG, None)
            result.notes.append(f"{FLAG} is not a live EngineArgs field here; not passed")
        else:
            if out.get(FLAG) is False:
                result.conflicts.append(f"{FLAG}=False, but {decision.reason}")
            out[FLAG] = True
            result.notes.append(f"{FLAG}=True ({decision.reason})")
    elif decision.action in ("drop_flag", "patch_runner") and FLAG in out:
        out.pop(FLAG)
        result.notes.append(f"{FLAG} dropped ({decision.reason})")
    return result


def _report(settings: EngineSettings, policy: PrecisionPolicy, where: str) -> None:
    """Log what changed; raise or warn about conflicts according to ``policy.strictness``."""
    if settings.conflicts:
        text = "; ".join(settings.conflicts)
        settle_conflict(
            policy.strictness,
            f"{where}: {text}",
            fix=f"leave dtype/kv_cache_dtype at 'auto' (the plugin sets {policy.dtype}), or "
            f"enable the dtype you want, e.g. precision_plugin.enable(dtype='bfloat16') / "
            f"{ENV_VAR}=bfloat16",
            outcome="the precision policy wins (strictness='warn')",
        )
    if settings.notes:
        log.info("%s: %s", where, "; ".join(settings.notes))


def vllm_version() -> versions.PackageInfo | None:
    """The installed vLLM (any distribution that ships ``vllm``), without importing it."""
    return versions.package_info("vllm")


def engine_arg_fields(engine_args_cls: type | None = None) -> dict[str, Any] | None:
    """``EngineArgs`` field names -> defaults of the installed vLLM, or ``None`` without vLLM."""
    if engine_args_cls is None:
        if vllm_version() is None:
            return None
        try:
            from vllm.engine.arg_utils import EngineArgs
        except Exception as exc:  # a broken vLLM install must not break the caller
            log.debug("vllm.engine.arg_utils not importable: %s", exc)
            return None
        engine_args_cls = EngineArgs
    out: dict[str, Any] = {}
    for f in dataclasses.fields(engine_args_cls):
        out[f.name] = f.default if f.default is not dataclasses.MISSING else _NO_DEFAULT
    return out


def rollout_gpu_capability() -> tuple[int, int] | None:
    """Compute capability of the GPU vLLM will use, or ``None`` (no GPU, or unknown).

    Inside a vLLM process, vLLM's platform answers through NVML without initialising CUDA
    (an initialised CUDA context would break vLLM's forked workers).
    """
    platforms = sys.modules.get("vllm.platforms")
    if platforms is not None:
        try:
            cap = platforms.current_platform.get_device_capability()
        except Exception:
            cap = None
        return (int(cap[0]), int(cap[1])) if cap is not None else None
    try:
        info = versions.accelerator()
    except Exception:
        return None
    return info.capability if info.kind == "cuda" else None


def cascade_guard(
    policy: PrecisionPolicy | None = None,
    *,
    version: Any = _AUTO,
    capability: Any = _AUTO,
) -> CascadeDecision:
    """The cascade-attention guard's decision for the installed vLLM and GPU (or those given)."""
    policy = policy or _active_policy() or PrecisionPolicy()
    if version is _AUTO:
        info = vllm_version()
        version = info.version if info else None
    if capability is _AUTO:
        capability = rollout_gpu_capability() if version is not None else None
    return cascade_decision(version, capability, policy.vllm.cascade_guard)


def engine_kwargs(
    kwargs: Mapping[str, Any] | None = None,
    policy: PrecisionPolicy | None = None,
    *,
    version: Any = _AUTO,
    capability: Any = _AUTO,
    fields: Any = _AUTO,
) -> dict[str, Any]:
    """Return the kwargs an ``LLM(...)``/``EngineArgs`` should get under ``policy``.

    ``dtype`` becomes the policy dtype (float16 by default); ``kv_cache_dtype`` stays ``auto``
    (an explicit float16/bfloat16 must match the model dtype); ``disable_cascade_attn`` is set
    or removed by the cascade guard, and never passed where the installed vLLM lacks it or has
    deprecated it. ``kwargs`` is not modified. ``policy`` defaults to the active one, then
    ``PRECISION_PLUGIN``, then the defaults; ``version``/``capability``/``fields`` default to
    the installed vLLM and GPU. A request that contradicts the policy is coerced with a warning,
    or raises :class:`PrecisionMismatchError` under ``strictness="error"``.
    """
    policy = policy or _active_policy() or PrecisionPolicy()
    decision = cascade_guard(policy, version=version, capability=capability)
    if fields is _AUTO:
        fields = engine_arg_fields() if decision.era != "missing" else None
    settings = resolve_engine_kwargs(dict(kwargs or {}), policy, decision, fields)
    _report(settings, policy, "vLLM engine_kwargs()")
    return settings.kwargs


# -- enforcement inside vLLM ---------------------------------------------------------------------
def _active_policy() -> PrecisionPolicy | None:
    """The policy ``enable()`` installed here, else the one ``PRECISION_PLUGIN`` describes."""
    return current_policy() or PrecisionPolicy.from_env()


def _config_json_for(model: Any, revision: Any = None) -> str | None:
    """Local ``config.json`` of a model path or an already cached hub id; never downloads."""
    if not model:
        return None
    path = os.path.join(str(model), "config.json")
    if os.path.isfile(path):
        return path
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(str(model), "config.json", revision=revision)
    except Exception:
        return None
    return found if isinstance(found, str) else None


def _check_checkpoint(engine_args: Any, policy: PrecisionPolicy) -> None:
    """Refuse (or warn about) the checkpoint before vLLM resolves its config in float16."""
    if _canonical(engine_args.dtype) != "float16":
        return
    source = getattr(engine_args, "hf_config_path", None) or engine_args.model
    path = _config_json_for(source, getattr(engine_args, "revision", None))
    if path is None:
        return
    fp16 = policy.replace(dtype="float16")
    for finding in check_model_config(path, fp16, refused=vllm_refusal_table()):
        if finding.status == "warning":
            log.warning("vLLM model %s: %s %s", engine_args.model, finding.message, finding.fix)


def enforce_on_engine_args(engine_args: Any, policy: PrecisionPolicy) -> EngineSettings:
    """Apply :func:`engine_kwargs` to an ``EngineArgs`` instance in place (fields as defaults)."""
    fields = engine_arg_fields(type(engine_args)) or {}
    explicit = {
        name: getattr(engine_args, name)
        for name in _MANAGED
        if name in fields and getattr(engine_args, name) != fields[name]
    }
    decision = cascade_guard(policy)
    settings = resolve_engine_kwargs(explicit, policy, decision, fields)
    _report(settings, policy, f"vLLM engine for {engine_args.model!r}")
    for name in _MANAGED:
        if name not in fields:
            continue
        wanted = settings.kwargs.get(name, fields[name])
        if wanted is not _NO_DEFAULT and getattr(engine_args, name) != wanted:
            setattr(engine_args, name, wanted)
    return settings


def _fp16_refusal(exc: BaseException, policy: PrecisionPolicy) -> PrecisionConfigError | None:
    text = str(exc)
    if "does not support float16" not in text:
        return None
    line = next((ln.strip() for ln in text.splitlines() if "does not support float16" in ln), text)
    return PrecisionConfigError(
        f"vLLM refused the policy dtype {policy.dtype}: {line} Fix: use the consistent-bf16 "
        f"mode: precision_plugin.enable(dtype='bfloat16') or {ENV_VAR}=bfloat16."
    )


def _wrap_create_model_config(original: Any) -> Any:
    def create_model_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        policy = _active_policy()
        if policy is not None:
            enforce_on_engine_args(self, policy)
            _check_checkpoint(self, policy)
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:
            refusal = _fp16_refusal(exc, policy) if policy is not None else None
            if refusal is not None:
                raise refusal from exc
            raise

    setattr(create_model_config, _MARK, True)
    return create_model_config


def _no_cascade_prefix(original: Any) -> Any:
    def _compute_cascade_attn_prefix_len(*args: Any, **kwargs: Any) -> int:
        return 0

    setattr(_compute_cascade_attn_prefix_len, _MARK, True)
    return _compute_cascade_attn_prefix_len


def _is_ours(obj: Any) -> bool:
    return bool(getattr(obj, _MARK, False))


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
    if not _is_ours(vars(EngineArgs).get("create_model_config")):
        patcher.wrap(
            EngineArgs,
            "create_model_config",
            _wrap_create_model_config,
            reason="vLLM has no hook between argument parsing and config resolution; the "
            "wrapper applies engine_kwargs() for LLM(...), vllm serve and trl vllm-serve",
        )
        done.append("EngineArgs.create_model_config")
    decision = cascade_guard(policy)
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
            if name in vars(GPUModelRunner) and not _is_ours(vars(GPUModelRunner)[name]):
                patcher.wrap(
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


def general_plugin() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM calls it in each of its processes).

    Does nothing unless ``PRECISION_PLUGIN`` is set or ``enable()`` ran in this process.
    Idempotent. vLLM itself skips it when ``VLLM_PLUGINS`` does not name ``precision_plugin``.
    """
    policy = _active_policy()
    if policy is None or vllm_version() is None:
        return
    with _lock:
        patcher = _env_patcher
        if current_policy() is not None and _enable_patcher is not None:
            patcher = _enable_patcher  # patches made under enable() are undone by disable()
        install_vllm_patches(policy, patcher)


# -- hooks ---------------------------------------------------------------------------------------
@hookimpl
def precision_adapter_name() -> str:
    """This adapter's short name."""
    return "vllm"


@hookimpl
def precision_install(policy: PrecisionPolicy, patcher: Patcher) -> None:
    """Make colocated engines (TRL's ``LLM(...)`` passes no dtype) and child processes follow
    ``policy``: patch now if vLLM is already imported, else when vLLM loads its plugins."""
    global _enable_patcher
    if vllm_version() is None:
        return
    patcher.setenv(
        ENV_VAR,
        policy.to_json(),
        reason="engine-core and worker processes vLLM starts from here read the policy in "
        "the general plugin",
    )
    with _lock:
        _enable_patcher = patcher
        if any(name == "vllm" or name.startswith("vllm.") for name in list(sys.modules)):
            install_vllm_patches(policy, patcher)
            return
    # Not through the general plugin alone: vLLM loads general plugins once per process and
    # only those VLLM_PLUGINS allows, but enable() here must reach this process's engines.
    patcher.when_imported(
        "vllm.engine.arg_utils",
        lambda module: install_vllm_patches(policy, patcher, runner=False),
        reason="enable() imports no framework",
    )


@hookimpl
def precision_uninstall(policy: PrecisionPolicy) -> None:
    """Forget the enable() patcher (its patches are restored by the manager)."""
    global _enable_patcher
    with _lock:
        _enable_patcher = None


@hookimpl
def precision_train_begin(policy: PrecisionPolicy, args: Any, trainer: Any) -> None:
    """Verify the vLLM a TRL trainer uses: the server (server mode) or the colocated engine."""
    if not getattr(args, "use_vllm", False) or trainer is None:
        return
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None:
        return
    mode = getattr(args, "vllm_mode", None) or getattr(generation, "mode", None)
    if mode == "server":
        client = getattr(generation, "vllm_client", None)
        if policy.vllm.verify_server and client is not None:  # the client lives on rank 0 only
            verify_server(client, policy)
    elif getattr(generation, "llm", None) is not None:
        verify_engine(generation.llm, policy)


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding]:
    """What vLLM is installed, whether TRL supports it, the cascade verdict, what enable()
    changes."""
    from precision_plugin.vllm_doctor import doctor_findings

    return doctor_findings(policy)


@hookimpl
def precision_probe_engines() -> dict[str, Any]:
    """``{"vllm": factory}``: vLLM as the probe's rollout engine (CUDA only)."""
    from precision_plugin.vllm_probe import VLLMRolloutEngine

    return {"vllm": VLLMRolloutEngine}
