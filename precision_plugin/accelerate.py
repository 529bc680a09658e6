"""Accelerate adapter: ``Accelerator`` runs the policy's precision, with the policy's loss scaler.

After ``enable()``, every ``Accelerator`` (yours, the HF Trainer's, TRL's):

- gets ``mixed_precision`` from the policy. Unspecified (no argument, no
  ``ACCELERATE_MIXED_PRECISION``) takes the policy's; a contradiction (``"bf16"`` under a float16
  policy) is coerced with a warning, or refused with
  [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError] under
  ``strictness="error"``;
- builds its GradScaler from ``policy.loss_scaler`` through Accelerate's own
  ``GradScalerKwargs`` handler, and that scaler reports
  [`ScalerStats`][precision_plugin._core.scaler.ScalerStats] (saved and restored with
  ``save_state``/``load_state``);
- on CPU, where Accelerate silently runs fp32 without a scaler when asked for fp16, runs real
  fp16 autocast with a CPU GradScaler;
- casts the model's parameters to the dtypes the policy needs when it is prepared
  ([`precision_plugin.prepare_model`][precision_plugin._core.master_weights.prepare_model]).

DeepSpeed runs keep DeepSpeed's own loss scaler (see ``precision_plugin.deepspeed``). Without
``enable()``, ``apply_policy`` does the same to one accelerator you built.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from precision_plugin._base.conflicts import settle_conflict
from precision_plugin._base.report import Finding
from precision_plugin._base.versions import accelerator as device_info
from precision_plugin._base.versions import installed_version
from precision_plugin._core.frameworks import grad_scaler, mixed_precision
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

_SCALER_FREE = ("DEEPSPEED", "MEGATRON_LM")


def _available() -> bool:
    return installed_version("accelerate") is not None


def resolve_mixed_precision(requested: str | None, policy: PrecisionPolicy, *, where: str) -> str:
    """Return the ``mixed_precision`` to run: the policy's, after checking ``requested``.

    ``requested`` ``None`` means unspecified and takes the policy's silently. Anything else that
    differs is coerced with a warning (``strictness="warn"``) or refused.
    """
    wanted = mixed_precision(policy)
    if requested is None or str(requested).lower() == wanted:
        return wanted
    message = (
        f"{where} asked for mixed_precision={str(requested)!r} but the precision_plugin policy "
        f"is {policy.dtype} (mixed_precision={wanted!r})"
    )
    settle_conflict(
        policy.strictness,
        message,
        fix=f"pass mixed_precision={wanted!r} (or leave it unset), or enable the plugin with the "
        f"dtype you want (enable(dtype='bfloat16') for bf16)",
        outcome=f"running {wanted!r} instead",
    )
    return wanted


def _scaler_handler(policy: PrecisionPolicy) -> Any:
    from accelerate.utils import GradScalerKwargs

    known = [f.name for f in dataclasses.fields(GradScalerKwargs)]
    return GradScalerKwargs(**grad_scaler(policy.loss_scaler).to_kwargs(known))


def _distributed_type(accelerator: Any) -> str:
    kind = getattr(accelerator, "distributed_type", None)
    return str(getattr(kind, "name", kind))


def apply_policy(accelerator: Any, policy: PrecisionPolicy) -> Any:
    """Make an already-built ``Accelerator`` follow ``policy``'s loss scaling; return it.

    Call it right after building the accelerator and before ``prepare()``. Gives the scaler
    Accelerate built the plugin's telemetry, and on CPU under fp16 switches on fp16 autocast
    with a CPU GradScaler (Accelerate builds neither there). Does nothing under DeepSpeed or
    Megatron, whose engines scale the loss themselves.
    """
    from precision_plugin._core.manager import resolve_policy

    return _apply_policy(accelerator, resolve_policy(policy, what="apply_policy()"))


def _apply_policy(accelerator: Any, policy: PrecisionPolicy) -> Any:
    """``apply_policy`` for a resolved ``policy`` (every ``Accelerator`` under ``enable()``)."""
    from precision_plugin._core.scaler import attach_telemetry, build_grad_scaler

    if not hasattr(accelerator, "scaler") or not hasattr(accelerator, "state"):
        from precision_plugin.errors import PrecisionConfigError

        raise PrecisionConfigError(
            f"apply_policy(): expected an accelerate.Accelerator, got {type(accelerator).__name__}."
        )
    if _distributed_type(accelerator) in _SCALER_FREE:
        return accelerator
    if accelerator.state.mixed_precision != "fp16" or not policy.is_fp16:
        return accelerator
    if accelerator.scaler is not None:
        attach_telemetry(accelerator.scaler, policy.loss_scaler)
        return accelerator
    if accelerator.device.type == "cpu":
        # Accelerate turns fp16 off on CPU (accelerator.py: `device.type != "cpu"`), yet torch
        # has fp16 CPU autocast and a CPU GradScaler: run what was asked for.
        accelerator.native_amp = True
        sharded = _distributed_type(accelerator) == "FSDP"
        accelerator.scaler = build_grad_scaler(policy, "cpu", sharded=sharded or None)
        log.info(
            "precision_plugin: Accelerate on CPU with mixed_precision='fp16': running fp16 "
            "autocast with a CPU GradScaler (Accelerate alone would silently run fp32)"
        )
    return accelerator


def accelerator_stats(accelerator: Any) -> Any:
    """The [`ScalerStats`][precision_plugin._core.scaler.ScalerStats] of an accelerator's scaler, or
    ``None``."""
    from precision_plugin._core.scaler import scaler_stats

    return scaler_stats(getattr(accelerator, "scaler", None))


def _launcher_mixed_precision(arguments: Mapping[str, Any]) -> str | None:
    """``ACCELERATE_MIXED_PRECISION``, or ``None`` when it is no request.

    ``accelerate launch`` writes ``"no"`` when the config file has no ``mixed_precision`` key,
    which a DeepSpeed config file must leave out (the precision comes from the DeepSpeed file):
    under DeepSpeed that ``"no"`` is not a request for fp32.
    """
    value = os.environ.get("ACCELERATE_MIXED_PRECISION")
    deepspeed = (
        arguments.get("deepspeed_plugin") is not None
        or arguments.get("deepspeed_plugins") is not None
        or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    )
    if deepspeed and value is not None and value.lower() == "no":
        return None
    return value


def _init(
    policy: PrecisionPolicy, original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any
) -> None:
    """``Accelerator.__init__`` with the policy's ``mixed_precision`` and GradScaler settings."""
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    arguments = bound.arguments
    requested = arguments.get("mixed_precision")
    if requested is None:
        requested = _launcher_mixed_precision(arguments)
    arguments["mixed_precision"] = resolve_mixed_precision(requested, policy, where="Accelerator")
    if policy.uses_loss_scaler:
        from accelerate.utils import GradScalerKwargs

        handlers = list(arguments.get("kwargs_handlers") or [])
        if any(type(h) is GradScalerKwargs for h in handlers):
            log.info("precision_plugin: keeping the GradScalerKwargs passed explicitly")
        else:
            handlers.append(_scaler_handler(policy))
        arguments["kwargs_handlers"] = handlers
    original(*bound.args, **bound.kwargs)
    _apply_policy(self, policy)


def _prepare_model(
    policy: PrecisionPolicy,
    original: Callable[..., Any],
    self: Any,
    model: Any,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``Accelerator.prepare_model`` after the model got the policy's master-weight dtypes."""
    if not kwargs.get("evaluation_mode", False):
        from precision_plugin._core.master_weights import prepare_model_once

        prepare_model_once(model, policy)
    return original(self, model, *args, **kwargs)


@hookimpl
def precision_install(policy: PrecisionPolicy, patcher: Any) -> None:
    """Wrap ``Accelerator.__init__`` and ``Accelerator.prepare_model`` (see the module doc)."""
    if not _available():
        return

    patcher.wrap_on_import(
        "accelerate.accelerator",
        "Accelerator.__init__",
        functools.partial(_init, policy),
        reason="no Accelerate hook sees mixed_precision/kwargs_handlers before the scaler "
        "is built, and none builds one on CPU",
    )
    patcher.wrap_on_import(
        "accelerate.accelerator",
        "Accelerator.prepare_model",
        functools.partial(_prepare_model, policy),
        reason="no Accelerate hook runs before a model is wrapped; fp16/bf16 trainable "
        "parameters must become fp32 master weights before the first step",
    )


@hookimpl
def precision_collect_metrics(trainer: Any, optimizer: Any) -> dict[str, float] | None:
    """Loss-scaler metrics of the trainer's accelerator (none under DeepSpeed), else of the
    optimizer's scaler (Accelerate's optimizer wrapper holds it; the callback may not know the
    trainer)."""
    from precision_plugin._core.scaler import scaler_stats

    stats = accelerator_stats(getattr(trainer, "accelerator", None))
    if stats is None:
        stats = scaler_stats(getattr(optimizer, "scaler", None))
    return stats.as_metrics() if stats is not None else None


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding] | None:
    """What Accelerate would run, and what ``enable()`` changes."""
    version = installed_version("accelerate")
    if version is None:
        return None
    findings = [Finding("accelerate", "info", f"accelerate {version} installed")]
    if policy.uses_loss_scaler:
        s = policy.loss_scaler
        findings.append(
            Finding(
                "accelerate",
                "change",
                f"GradScaler from the policy (init {s.init_scale:g}, growth every "
                f"{s.growth_interval} steps, floor {s.min_scale:g}) instead of torch's defaults "
                "(growth every 2000 steps, no floor), with loss-scale telemetry",
            )
        )
        if device_info().kind == "cpu":
            findings.append(
                Finding(
                    "accelerate",
                    "change",
                    "on CPU, Accelerate runs mixed_precision='fp16' as plain fp32 with no "
                    "scaler; enable() runs real fp16 autocast with a CPU GradScaler",
                )
            )
    findings.append(
        Finding(
            "accelerate",
            "change",
            f"Accelerator mixed_precision follows the policy ({mixed_precision(policy)!r}); a "
            f"different request is "
            + ("refused" if policy.strictness == "error" else "coerced with a warning"),
        )
    )
    return findings
