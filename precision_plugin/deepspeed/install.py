"""The DeepSpeed entry applied wherever DeepSpeed starts: ``deepspeed.initialize`` (direct,
Accelerate, TRL, HF Trainer), Accelerate's ``HfDeepSpeedConfig``/``DeepSpeedPlugin``, and the HF
Trainer's config processing (its fp16/bf16 flags are reconciled with the policy first)."""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from precision_plugin._base.conflicts import settle_conflict
from precision_plugin._base.patching import Patcher
from precision_plugin._base.versions import installed_version
from precision_plugin._core import frameworks
from precision_plugin._core.buffers import float32_buffers, keep_float32_buffers
from precision_plugin.deepspeed.config import load_config, section_policy, translated
from precision_plugin.deepspeed.device import (
    EXTENSIONS_VARIABLE,
    build_notice,
    check_engine_dtype,
    environment_extensions_dir,
    pending_cpu_build,
)
from precision_plugin.deepspeed.telemetry import track
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")


def _initialize(
    policy: PrecisionPolicy, original: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """``deepspeed.initialize`` with its config (``config``, ``config_params`` or the file in
    ``args.deepspeed_config``) translated for the policy, and the engine tracked."""
    bound = inspect.signature(original).bind_partial(*args, **kwargs)
    arguments = bound.arguments
    resolved = policy
    ds_args = arguments.get("args")
    ds_path = getattr(ds_args, "deepspeed_config", None)
    if ds_path is not None:
        # DeepSpeed reads args.deepspeed_config and asserts config is None: hand it the
        # applied dict instead, on a copy of args so the caller's object is untouched.
        ds_args = copy.copy(ds_args)
        ds_args.deepspeed_config = None
        arguments["args"] = ds_args
        arguments.pop("config_params", None)
        key, raw = "config", ds_path
    else:
        key = "config" if arguments.get("config") is not None else "config_params"
        raw = arguments.get(key)
    if raw is not None:
        cfg = load_config(raw)
        resolved = section_policy(cfg, policy, requested=True)
        runs = check_engine_dtype(resolved)  # refuse before DeepSpeed's own device check
        arguments[key] = translated(cfg, resolved)
        if runs != resolved.dtype:
            resolved = resolved.replace(dtype=runs)
            arguments[key] = _precision_off(arguments[key])
    pending = pending_cpu_build()
    if pending is not None:
        log.warning("precision_plugin: %s.", build_notice(pending))
    model = arguments.get("model")
    saved = float32_buffers(model) if resolved.float32_buffers and model is not None else {}
    result = original(*bound.args, **bound.kwargs)
    if resolved.float32_buffers and resolved.dtype != "float32":
        _keep_float32_buffers(getattr(result[0], "module", None), saved)
    track(result[0], resolved)
    return result


def _keep_float32_buffers(module: Any, saved: dict[str, Any]) -> None:
    """The buffers vLLM keeps in float32 back in float32 after DeepSpeed's module cast (older
    DeepSpeed casts the whole module, newer ones buffers with ``data_types.buffer_dtype``;
    ZeRO-3's ``zero.Init`` creates them in the training dtype)."""
    if module is None:
        return
    done = keep_float32_buffers(module, saved)
    if done:
        log.info(
            "precision_plugin: DeepSpeed cast %d buffer(s) vLLM keeps in float32; back in "
            "float32 (policy.float32_buffers): %s",
            len(done),
            ", ".join(f"{name} ({how})" for name, how in list(done.items())[:3])
            + (" ..." if len(done) > 3 else ""),
        )


def _precision_off(cfg: dict[str, Any]) -> dict[str, Any]:
    """The translated config with fp16/bf16 off: what runs when the device refuses both."""
    for name in ("fp16", "bf16", "bfloat16"):
        if isinstance(cfg.get(name), dict):
            cfg[name]["enabled"] = False
    return cfg


def _hf_config_init(
    policy: PrecisionPolicy, original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any
) -> None:
    original(self, *args, **kwargs)
    cfg = load_config(self.config)
    self.config = translated(cfg, section_policy(cfg, policy, requested=True))


_PRECISION_MISMATCH = ("- ds fp16.enabled=", "- ds bf16.enabled=")


def _trainer_config_process(
    policy: PrecisionPolicy,
    original: Callable[..., Any],
    self: Any,
    args: Any,
    *rest: Any,
    **kwargs: Any,
) -> Any:
    result = original(self, args, *rest, **kwargs)
    # The config already follows the policy; HF recorded its fp16/bf16 flags as mismatches
    # that would raise at train(). The policy settles them here.
    pol = section_policy(self.config, policy, requested=True)
    ours = [m for m in self.mismatches if m.startswith(_PRECISION_MISMATCH)]
    if ours:
        settle_conflict(
            pol.strictness,
            f"TrainingArguments fp16={args.fp16}, bf16={args.bf16} contradict the precision "
            f"policy (dtype={pol.dtype!r}) that the DeepSpeed config follows "
            f"({'; '.join(m[2:] for m in ours)})",
            fix=f"pass {frameworks.trainer_flags(pol)} (TRL configs default to bf16=True), or use "
            "strictness='warn'",
            outcome=f"DeepSpeed runs {pol.dtype}",
        )
        self.mismatches = [m for m in self.mismatches if m not in ours]
    self._dtype = pol.torch_dtype
    return result


def _set_mixed_precision(
    policy: PrecisionPolicy,
    original: Callable[..., Any],
    self: Any,
    mixed_precision: Any,
    *args: Any,
    **kwargs: Any,
) -> Any:
    pol = section_policy(self.deepspeed_config, policy, requested=True)
    wanted = frameworks.mixed_precision(pol)
    if mixed_precision not in (None, "no", wanted):
        settle_conflict(
            pol.strictness,
            f"Accelerate mixed_precision={mixed_precision!r} contradicts the precision policy "
            f"(dtype={pol.dtype!r}) that the DeepSpeed config follows",
            fix=f"use mixed_precision={wanted!r} (accelerate config / --mixed_precision), "
            "or strictness='warn'",
            outcome=f"DeepSpeed runs {pol.dtype}",
        )
    return original(self, wanted, *args, **kwargs)


def install(policy: PrecisionPolicy, patcher: Patcher) -> None:
    """Apply the config entry in ``deepspeed.initialize`` and where HF/Accelerate build configs;
    give DeepSpeed's JIT-built ops a cache of this environment's own (unless the user set
    ``TORCH_EXTENSIONS_DIR``)."""
    folder = environment_extensions_dir(os.environ, sys.prefix)
    if folder is not None:
        patcher.setenv(
            EXTENSIONS_VARIABLE,
            folder,
            reason="torch's default build cache is shared by every environment: DeepSpeed's "
            "CPU op built from another environment is rebuilt, silently, on each switch",
        )
    # Not imported here: importing DeepSpeed is slow and logs to stdout; Accelerate, TRL and HF
    # import it only when they start an engine.
    patcher.wrap_on_import(
        "deepspeed",
        "initialize",
        functools.partial(_initialize, policy),
        reason="DeepSpeed has no config or engine hook; Accelerate, TRL and HF look "
        "deepspeed.initialize up at call time, so one wrap covers every caller",
    )
    if installed_version("accelerate") is not None:
        patcher.wrap_on_import(
            "accelerate.utils.deepspeed",
            "HfDeepSpeedConfig.__init__",
            functools.partial(_hf_config_init, policy),
            reason="Accelerate and the HF Trainer read fp16/bf16 from this object long before "
            "deepspeed.initialize; it must already follow the policy",
        )
        patcher.wrap_on_import(
            "accelerate.utils.dataclasses",
            "DeepSpeedPlugin.set_mixed_precision",
            functools.partial(_set_mixed_precision, policy),
            reason="Accelerate raises when its mixed_precision contradicts the DeepSpeed "
            "config; under the policy the config is right and the request is reconciled",
        )
    if installed_version("transformers") is not None:
        patcher.wrap_on_import(
            "transformers.integrations.deepspeed",
            "HfTrainerDeepSpeedConfig.trainer_config_process",
            functools.partial(_trainer_config_process, policy),
            reason="the HF Trainer fills fp16/bf16 from TrainingArguments and raises on any "
            "difference at train(); the policy must settle them",
            missing="the HF Trainer's fp16/bf16 flags are left to transformers",
        )
