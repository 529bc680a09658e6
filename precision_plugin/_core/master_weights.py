"""Master weights: which parameter dtypes a training run needs under the policy, checked and fixed.

Under a float16 policy autocast computes in fp16 while the optimizer updates fp32 *master*
weights; the loss scaler unscales fp32 gradients. Trainable parameters in fp16 end in torch's
"Attempting to unscale FP16 gradients" (a model loaded with ``dtype=torch.float16``), in bf16
they break the fp16 scaler (TRL casts QLoRA adapters to bf16). Frozen parameters (a LoRA base)
may stay in the policy dtype; modules a model declares in ``_keep_in_fp32_modules`` (fp16 only)
or ``_keep_in_fp32_modules_strict`` (fp16 and bf16) stay fp32, as transformers loads them.
The buffers vLLM keeps in float32 (RoPE frequencies, the MoE routing bias: ``buffers.py``) go back
to float32 where a wholesale ``model.half()`` rounded them (``policy.float32_buffers``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from precision_plugin._base.boundary import checked
from precision_plugin._base.report import Finding
from precision_plugin._core.buffers import buffer_dtypes, keep_float32_buffers
from precision_plugin._core.frameworks import settle_once
from precision_plugin._core.manager import resolve_policy
from precision_plugin.errors import PrecisionMismatchError
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

_LOW = (torch.float16, torch.bfloat16)
_SHOWN = 3  # parameter names quoted in a message


@dataclass(frozen=True)
class _Cast:
    """Parameters that must change dtype, and why."""

    names: tuple[str, ...]
    found: torch.dtype
    wanted: torch.dtype
    why: str


def _fp32_names(model: torch.nn.Module, policy: PrecisionPolicy) -> set[str]:
    """Names (relative to ``model``) of parameters in modules declared keep-in-fp32."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        patterns = set(getattr(module, "_keep_in_fp32_modules_strict", None) or ())
        if policy.is_fp16:
            patterns |= set(getattr(module, "_keep_in_fp32_modules", None) or ())
        patterns.discard("")  # names no module: transformers' pattern never matches it either
        if not patterns:
            continue
        regex = re.compile("|".join(rf"(^|\.){re.escape(p)}($|\.)" for p in sorted(patterns)))
        for name, _ in module.named_parameters():
            if regex.search(name):
                names.add(f"{prefix}.{name}" if prefix else name)
    return names


def _plan(model: torch.nn.Module, policy: PrecisionPolicy) -> list[_Cast]:
    fp32_names = _fp32_names(model, policy)
    groups: dict[tuple[torch.dtype, torch.dtype, str], list[str]] = {}
    target = policy.torch_dtype
    for name, param in model.named_parameters():
        if not param.is_floating_point():  # quantized storage (bitsandbytes) is not ours
            continue
        found = param.dtype
        if name in fp32_names:
            wanted, why = torch.float32, "declared in the model's _keep_in_fp32_modules"
        elif param.requires_grad:
            if found not in _LOW:
                continue
            wanted = torch.float32
            why = (
                "trainable in fp16: the loss scaler cannot unscale fp16 gradients ('Attempting "
                "to unscale FP16 gradients')"
                if found == torch.float16
                else f"trainable in {_short(found)} under a {policy.dtype} policy (master weights "
                "must be fp32; TRL casts QLoRA adapters to bf16)"
            )
            if policy.dtype == "bfloat16" and found == torch.bfloat16:
                continue  # consistent bf16 training without master weights is a valid choice
        else:
            # Frozen weights only feed the forward: store them in the policy dtype (fp16 halves
            # the memory of a LoRA base and matches the rollout engine).
            if found not in _LOW or found == target or target == torch.float32:
                continue
            wanted, why = target, f"frozen in {_short(found)} under a {policy.dtype} policy"
        if found != wanted:
            groups.setdefault((found, wanted, why), []).append(name)
    return [_Cast(tuple(n), f, w, why) for (f, w, why), n in groups.items()]


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _describe(cast: _Cast) -> str:
    shown = ", ".join(cast.names[:_SHOWN])
    more = f" and {len(cast.names) - _SHOWN} more" if len(cast.names) > _SHOWN else ""
    return (
        f"{len(cast.names)} parameter(s) {_short(cast.found)} -> {_short(cast.wanted)} "
        f"({shown}{more}): {cast.why}"
    )


@checked
def check_model(
    model: torch.nn.Module, policy: PrecisionPolicy | Mapping[str, Any] | str | None = None
) -> list[Finding]:
    """Report, without changing anything, which parameter dtypes contradict the policy.

    One ``change`` finding per group of parameters ``prepare_model`` would cast; a single ``ok``
    finding when nothing needs to change.
    """
    policy = resolve_policy(policy)
    findings = [
        Finding(
            framework="torch",
            status="change",
            message=_describe(cast),
            fix=_fix_text(cast),
            details={
                "parameters": list(cast.names),
                "from": _short(cast.found),
                "to": _short(cast.wanted),
            },
        )
        for cast in _plan(model, policy)
    ]
    rounded = _rounded_buffers(model, policy)
    if rounded:
        findings.append(
            Finding(
                framework="torch",
                status="change",
                message=(
                    f"{sum(rounded.values())} values of the buffers vLLM keeps in float32 (RoPE "
                    f"frequencies, the MoE routing bias) are rounded to "
                    f"{', '.join(sorted(rounded))}: the learner would compute positions "
                    "differently from the rollout engine"
                ),
                fix=(
                    "prepare_model() (enable() and PrecisionCallback run it) recomputes them in "
                    "float32; cast with precision_plugin._core.buffers.cast_model instead of "
                    "model.half()"
                ),
                details={"buffers": rounded},
            )
        )
    if not findings:
        findings.append(
            Finding("torch", "ok", f"parameter dtypes match the {policy.dtype} policy", "")
        )
    return findings


def _fix_text(cast: _Cast) -> str:
    if cast.wanted == torch.float32 and cast.found == torch.float16:
        return (
            "load the model in float32 (from_pretrained(..., dtype=torch.float32)) and let "
            "autocast compute in fp16, or call precision_plugin.prepare_model(model)"
        )
    if cast.wanted == torch.float32:
        return (
            "keep trainable (adapter) parameters in float32, or call "
            "precision_plugin.prepare_model(model) after the trainer casts them"
        )
    return f"load the model with dtype=torch.{_short(cast.wanted)}, or call prepare_model(model)"


def _params(model: torch.nn.Module, names: set[str]) -> Iterator[torch.nn.Parameter]:
    for name, param in model.named_parameters():
        if name in names:
            yield param


@checked
def prepare_model(
    model: torch.nn.Module, policy: PrecisionPolicy | Mapping[str, Any] | str | None = None
) -> torch.nn.Module:
    """Give ``model`` the parameter dtypes the policy needs; return the same model.

    Under float16: trainable parameters become fp32 master weights (autocast computes in fp16),
    frozen fp16/bf16 parameters are stored in fp16, and ``_keep_in_fp32_modules`` stay fp32.
    Parameters are cast in place (``param.data``), so an optimizer built already keeps working.
    With ``policy.float32_buffers`` the buffers vLLM keeps in float32 (RoPE frequencies) that a
    ``model.half()`` rounded are recomputed in float32
    ([`keep_float32_buffers`][precision_plugin._core.buffers.keep_float32_buffers]).
    With ``policy.strictness == "error"`` nothing is changed and a
    [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError] says what to change
    instead. ``policy`` defaults to the active policy, else the default (float16) one. Anything
    but a ``torch.nn.Module`` is refused with
    [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError].
    """
    return _prepare(model, resolve_policy(policy))


def _prepare(model: torch.nn.Module, policy: PrecisionPolicy) -> torch.nn.Module:
    """``prepare_model`` for a resolved ``policy``."""
    plan = _plan(model, policy)
    if plan and policy.strictness == "error":
        raise PrecisionMismatchError(
            "precision_plugin: the model's parameter dtypes contradict the "
            f"{policy.dtype} policy (strictness='error'): "
            + "; ".join(_describe(c) for c in plan)
            + ". Fix: "
            + _fix_text(plan[0])
            + ", or use strictness='warn' to let the plugin cast them."
        )
    with torch.no_grad():
        for cast in plan:
            for param in _params(model, set(cast.names)):
                param.data = param.data.to(cast.wanted)
                if param.grad is not None:
                    param.grad = param.grad.to(cast.wanted)
            trainable = cast.wanted == torch.float32 and "_keep_in_fp32" not in cast.why
            level = logging.WARNING if trainable else logging.INFO
            log.log(level, "precision_plugin: cast %s", _describe(cast))
    if _rounded_buffers(model, policy):
        restored = keep_float32_buffers(model)
        log.warning(
            "precision_plugin: %d buffers vLLM keeps in float32 were rounded (model.half()?); "
            "back in float32 so learner and rollout compute positions alike "
            "(policy.float32_buffers): %s",
            len(restored),
            ", ".join(f"{name} ({how})" for name, how in restored.items()),
        )
    return model


def _rounded_buffers(model: torch.nn.Module, policy: PrecisionPolicy) -> dict[str, int]:
    """``{dtype: count}`` of the table's buffers not in float32, when the policy keeps them."""
    if not policy.float32_buffers:
        return {}
    return {dtype: n for dtype, n in buffer_dtypes(model).items() if dtype != "float32"}


def prepare_model_once(model: Any, policy: PrecisionPolicy) -> Any:
    """[`prepare_model`][precision_plugin._core.master_weights.prepare_model], once per model and
    policy: the ``Trainer``, ``Accelerator.prepare_model`` and the callback all see the same
    model, and the first one settles it."""
    if not isinstance(model, torch.nn.Module):
        return model  # the framework decides what a non-module is; it has no dtypes to fix
    settle_once(model, "master_weights", policy, lambda: _prepare(model, policy))
    return model
