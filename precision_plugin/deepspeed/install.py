"""The DeepSpeed entry applied wherever DeepSpeed starts: ``deepspeed.initialize`` (direct,
Accelerate, TRL, HF Trainer), Accelerate's ``HfDeepSpeedConfig``/``DeepSpeedPlugin``, and the HF
Trainer's config processing (its fp16/bf16 flags are reconciled with the policy first)."""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable
from typing import Any

from precision_plugin.deepspeed.config import apply_config, config_policy, load_config, translate
from precision_plugin.deepspeed.telemetry import track_engine
from precision_plugin.errors import settle_conflict
from precision_plugin.patching import Patcher
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.versions import installed_version

log = logging.getLogger("precision_plugin")

_Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]


def _wrap_initialize(policy: PrecisionPolicy) -> _Wrapper:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def initialize(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind_partial(*args, **kwargs)
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
                resolved = config_policy(cfg, policy)
                arguments[key] = translate(cfg, resolved)
            result = original(*bound.args, **bound.kwargs)
            track_engine(result[0], resolved)
            return result

        return initialize

    return make


def _wrap_hf_config_init(policy: PrecisionPolicy) -> _Wrapper:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            self.config = apply_config(self.config, policy)

        return __init__

    return make


_PRECISION_MISMATCH = ("- ds fp16.enabled=", "- ds bf16.enabled=")


def _wrap_trainer_config_process(policy: PrecisionPolicy) -> _Wrapper:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def trainer_config_process(self: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
            result = original(self, args, *rest, **kwargs)
            # The config already follows the policy; HF recorded its fp16/bf16 flags as
            # mismatches that would raise at train(). The policy settles them here.
            ours = [m for m in self.mismatches if m.startswith(_PRECISION_MISMATCH)]
            if ours:
                pol = config_policy(self.config, policy)
                message = (
                    f"TrainingArguments fp16={args.fp16}, bf16={args.bf16} contradict the "
                    f"precision policy (dtype={pol.dtype!r}) that the DeepSpeed config follows "
                    f"({'; '.join(m[2:] for m in ours)})"
                )
                flags = "fp16=True, bf16=False" if pol.is_fp16 else "bf16=True, fp16=False"
                settle_conflict(
                    pol.strictness,
                    message,
                    fix=f"pass {flags} (TRL configs default to bf16=True), or use "
                    "strictness='warn'",
                    outcome=f"DeepSpeed runs {pol.dtype}",
                )
                self.mismatches = [m for m in self.mismatches if m not in ours]
            self._dtype = config_policy(self.config, policy).torch_dtype
            return result

        return trainer_config_process

    return make


def _wrap_set_mixed_precision(policy: PrecisionPolicy) -> _Wrapper:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def set_mixed_precision(self: Any, mixed_precision: Any, *args: Any, **kwargs: Any) -> Any:
            pol = config_policy(self.deepspeed_config, policy)
            wanted = pol.mixed_precision
            if mixed_precision not in (None, "no", wanted):
                message = (
                    f"Accelerate mixed_precision={mixed_precision!r} contradicts the precision "
                    f"policy (dtype={pol.dtype!r}) that the DeepSpeed config follows"
                )
                settle_conflict(
                    pol.strictness,
                    message,
                    fix=f"use mixed_precision={wanted!r} (accelerate config / --mixed_precision), "
                    "or strictness='warn'",
                    outcome=f"DeepSpeed runs {pol.dtype}",
                )
            return original(self, wanted, *args, **kwargs)

        return set_mixed_precision

    return make


def _patch_deepspeed(deepspeed: Any, policy: PrecisionPolicy, patcher: Patcher) -> None:
    patcher.wrap(
        deepspeed,
        "initialize",
        _wrap_initialize(policy),
        reason="DeepSpeed has no config or engine hook; Accelerate, TRL and HF look "
        "deepspeed.initialize up at call time, so one wrap covers every caller",
    )


def _patch_hf_trainer_config(module: Any, policy: PrecisionPolicy, patcher: Patcher) -> None:
    cls = getattr(module, "HfTrainerDeepSpeedConfig", None)
    if cls is None or not hasattr(cls, "trainer_config_process"):
        log.info(
            "precision_plugin: transformers has no HfTrainerDeepSpeedConfig.trainer_config_process;"
            " the HF Trainer's fp16/bf16 flags are left to transformers"
        )
        return
    patcher.wrap(
        cls,
        "trainer_config_process",
        _wrap_trainer_config_process(policy),
        reason="the HF Trainer fills fp16/bf16 from TrainingArguments and raises on any "
        "difference at train(); the policy must settle them",
    )


def _patch_accelerate_on_import(policy: PrecisionPolicy, patcher: Patcher) -> None:
    patcher.when_imported(
        "accelerate.utils.deepspeed",
        lambda module: patcher.wrap(
            module.HfDeepSpeedConfig,
            "__init__",
            _wrap_hf_config_init(policy),
            reason="Accelerate and the HF Trainer read fp16/bf16 from this object long before "
            "deepspeed.initialize; it must already follow the policy",
        ),
        reason="enable() imports no framework",
    )
    patcher.when_imported(
        "accelerate.utils.dataclasses",
        lambda module: patcher.wrap(
            module.DeepSpeedPlugin,
            "set_mixed_precision",
            _wrap_set_mixed_precision(policy),
            reason="Accelerate raises when its mixed_precision contradicts the DeepSpeed "
            "config; under the policy the config is right and the request is reconciled",
        ),
        reason="enable() imports no framework",
    )


def install(policy: PrecisionPolicy, patcher: Patcher) -> None:
    """Apply the config entry in ``deepspeed.initialize`` and where HF/Accelerate build configs."""
    patcher.when_imported(
        "deepspeed",
        lambda module: _patch_deepspeed(module, policy, patcher),
        reason="importing DeepSpeed in enable() is slow and logs to stdout; Accelerate, TRL "
        "and HF import it only when they start an engine",
    )
    if installed_version("accelerate") is not None:
        _patch_accelerate_on_import(policy, patcher)
    if installed_version("transformers") is not None:
        patcher.when_imported(
            "transformers.integrations.deepspeed",
            lambda module: _patch_hf_trainer_config(module, policy, patcher),
            reason="enable() imports no framework",
        )
