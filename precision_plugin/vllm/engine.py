"""vLLM engine settings: the kwargs an ``LLM(...)``/``EngineArgs`` gets under a policy (pure),
and the cascade-attention guard's decision for the installed vLLM and GPU."""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Mapping
from typing import Any

from precision_plugin._base import versions
from precision_plugin._base.boundary import (
    Invalid,
    Validator,
    checked,
    fix_hint,
    gpu_capability,
    version_text,
)
from precision_plugin._base.conflicts import settle_conflict
from precision_plugin._core.frameworks import vllm_dtype
from precision_plugin._core.manager import resolve_policy
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import ENV_VAR, PrecisionPolicy, normalize_dtype
from precision_plugin.vllm.cascade import FLAG, CascadeDecision, cascade_decision

log = logging.getLogger("precision_plugin")

#: Key of an engine's ``additional_config`` that the plugin writes where it ran inside the engine
#: (``precision_plugin.vllm.enforce``); ``verify_engine``/``verify_server`` read it back.
MARKER = "precision_plugin"

_AUTO: Any = object()


def _engine_args_class(value: Any) -> Any:
    if not dataclasses.is_dataclass(value):
        raise Invalid("is not vLLM's EngineArgs class (a dataclass); pass vllm's EngineArgs")
    return value


_VERSION = version_text("vLLM")
_KWARGS = fix_hint("pass the LLM(...) keyword arguments as a dict such as {'model': PATH}")


#: Default of an ``EngineArgs`` field that has none (a required field).
NO_DEFAULT: Any = object()
#: EngineArgs fields the plugin manages.
MANAGED = ("dtype", "kv_cache_dtype", FLAG)
_HALF_KV = {"float16": "float16", "half": "float16", "bfloat16": "bfloat16"}


# -- engine settings ---------------------------------------------------------------------------
@checked
@dataclasses.dataclass
class EngineSettings:
    """The result of ``resolve_engine_kwargs``: kwargs, the guard decision, and what changed.

    ``notes`` are changes that follow the policy without contradicting the caller (logged at
    info level); ``conflicts`` are requests that contradict it (a warning, or
    ``PrecisionMismatchError`` under ``strictness="error"``).
    """

    kwargs: dict[str, Any]
    decision: CascadeDecision
    notes: list[str] = dataclasses.field(default_factory=list)
    conflicts: list[str] = dataclasses.field(default_factory=list)


@checked
def canonical_dtype(value: Any) -> str | None:
    """Canonical dtype name of a vLLM ``dtype`` value; ``None`` for ``auto``/unset."""
    if value is None or str(value).strip().lower() == "auto":
        return None
    try:
        return normalize_dtype(value)
    except PrecisionConfigError:
        return str(value)


@checked
def resolve_engine_kwargs(
    kwargs: Mapping[str, Any],
    policy: PrecisionPolicy,
    decision: CascadeDecision,
    fields: Mapping[str, Any] | None = None,
) -> EngineSettings:
    """Apply ``policy`` and the cascade ``decision`` to engine ``kwargs``; pure.

    Raises only for a ``policy`` that is not a ``PrecisionPolicy`` (refused at the boundary).

    ``fields`` maps the installed ``EngineArgs`` field names to their defaults (``None`` when
    vLLM cannot be imported): a field that does not exist, or whose default is ``None`` (the
    deprecated ``disable_cascade_attn`` of vLLM >= 0.32), is never passed.
    """
    out = dict(kwargs)
    result = EngineSettings(out, decision)

    model_dtype = canonical_dtype(out.get("dtype"))
    if policy.vllm.enforce_dtype:
        wanted = vllm_dtype(policy)
        if model_dtype is None:
            out["dtype"] = wanted
            result.notes.append(f"dtype auto -> {wanted}")
        elif model_dtype != wanted:
            result.conflicts.append(
                f"dtype={kwargs['dtype']!r} contradicts the policy dtype {wanted}"
            )
            out["dtype"] = wanted
        model_dtype = wanted

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


@checked
def report_settings(settings: EngineSettings, policy: PrecisionPolicy, where: str) -> None:
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


@checked
def vllm_version() -> versions.PackageInfo | None:
    """The installed vLLM (any distribution that ships ``vllm``), without importing it."""
    return versions.package_info("vllm")


@checked(engine_args_cls=Validator("vLLM's EngineArgs class", _engine_args_class))
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
        out[f.name] = f.default if f.default is not dataclasses.MISSING else NO_DEFAULT
    return out


@checked
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


@checked(version=_VERSION, capability=gpu_capability)
def cascade_guard(
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    version: Any = _AUTO,
    capability: Any = _AUTO,
) -> CascadeDecision:
    """The cascade-attention guard's decision for the installed vLLM and GPU (or those given)."""
    return decide_cascade(resolve_policy(policy), version=version, capability=capability)


def decide_cascade(
    policy: PrecisionPolicy, *, version: Any = _AUTO, capability: Any = _AUTO
) -> CascadeDecision:
    """[`cascade_guard`][precision_plugin.vllm.cascade_guard] for a resolved ``policy``."""
    if version is _AUTO:
        info = vllm_version()
        version = info.version if info else None
    if capability is _AUTO:
        capability = rollout_gpu_capability() if version is not None else None
    return cascade_decision(version, capability, policy.vllm.cascade_guard)


def _fields(value: Any) -> Any:
    if value is not None and not isinstance(value, Mapping):
        raise Invalid(
            "is not a mapping of EngineArgs field names to their defaults; pass "
            "engine_arg_fields(EngineArgs), None for a vLLM without those fields, or leave it "
            "out for the installed vLLM"
        )
    return value


@checked(
    kwargs=_KWARGS,
    version=_VERSION,
    capability=gpu_capability,
    fields=Validator("EngineArgs' fields, or None", _fields, ("x", 5, ["dtype"])),
)
def engine_kwargs(
    kwargs: Mapping[str, Any] | None = None,
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    version: Any = _AUTO,
    capability: Any = _AUTO,
    fields: Any = _AUTO,
) -> dict[str, Any]:
    """Return the kwargs an ``LLM(...)``/``EngineArgs`` should get under ``policy``.

    ``dtype`` becomes the policy dtype (float16 by default); ``kv_cache_dtype`` stays ``auto`` (an
    explicit float16/bfloat16 must match the model dtype); ``disable_cascade_attn`` is set or
    removed by the cascade guard, and never passed where the installed vLLM lacks it or has
    deprecated it. ``kwargs`` is not modified. ``policy`` defaults to the active one, then
    ``PRECISION_PLUGIN``, then the defaults; ``version``/``capability``/``fields`` default to the
    installed vLLM and GPU. A request that contradicts the policy is coerced with a warning, or
    raises [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError] under
    ``strictness="error"``.
    """
    return build_engine_kwargs(
        kwargs or {}, resolve_policy(policy), version=version, capability=capability, fields=fields
    )


def build_engine_kwargs(
    kwargs: Mapping[str, Any],
    policy: PrecisionPolicy,
    *,
    version: Any = _AUTO,
    capability: Any = _AUTO,
    fields: Any = _AUTO,
) -> dict[str, Any]:
    """[`engine_kwargs`][precision_plugin.vllm.engine_kwargs] for a resolved ``policy``."""
    from precision_plugin._core.model_risks import check_engine_model

    decision = decide_cascade(policy, version=version, capability=capability)
    if fields is _AUTO:
        fields = engine_arg_fields() if decision.era != "missing" else None
    settings = resolve_engine_kwargs(dict(kwargs), policy, decision, fields)
    report_settings(settings, policy, "vLLM engine_kwargs()")
    out = settings.kwargs
    check_engine_model(
        out.get("hf_config_path") or out.get("model"),
        policy,
        dtype=canonical_dtype(out.get("dtype")),
        revision=out.get("revision"),
    )
    from precision_plugin.vllm.invariance import check_attention_backend

    check_attention_backend(policy, out)  # batch_invariant='on': a backend its mode supports
    return out
