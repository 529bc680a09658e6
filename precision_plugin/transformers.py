"""HF Trainer adapter (also covers every TRL trainer); the callback is in ``callback.py``.

With ``enable()``:

- ``TrainingArguments`` (and TRL configs, which subclass it) get the policy's ``fp16``/``bf16``
  flags: unset flags take the policy's, a contradiction (``bf16=True`` under float16) is coerced
  with a warning or refused under ``strictness="error"``;
- every ``Trainer`` casts its model to the policy's master-weight dtypes once it is built
  (after TRL's QLoRA cast to bf16) and gets a :class:`PrecisionCallback` bound to it, first in
  the callback list so reporters (W&B, TensorBoard) see its metrics.

Without ``enable()``, ``callbacks=[PrecisionCallback()]`` still checks and fixes what a callback
can reach (flags against the policy, parameter dtypes, the dtype the training forward really
ran in) and logs the loss scale; what only exists inside the trainer (the ``Accelerator``'s
mixed precision, fp16 on CPU) it reports instead of fixing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from precision_plugin.errors import settle_conflict
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.report import Finding
from precision_plugin.versions import installed_version

log = logging.getLogger("precision_plugin")

_FLAGS = {"float16": (True, False), "bfloat16": (False, True), "float32": (False, False)}


def _mismatch(policy: PrecisionPolicy, message: str, fix: str, *, coerced: bool = True) -> None:
    outcome = "coerced to the policy" if coerced else f"fix: {fix}"
    settle_conflict(policy.strictness, message, fix=fix, outcome=outcome)


def _uses_deepspeed(args: Any, trainer: Any = None) -> bool:
    """DeepSpeed casts and scales the model itself (see precision_plugin.deepspeed)."""
    if trainer is not None and getattr(trainer, "is_deepspeed_enabled", False):
        return True
    return bool(getattr(args, "deepspeed", None) or getattr(args, "deepspeed_plugin", None))


def coerce_training_flags(args: Any, policy: PrecisionPolicy, *, unset_is_policy: bool) -> None:
    """Set ``args.fp16``/``args.bf16`` (and the ``*_full_eval`` pair) to the policy's.

    A flag that asks for the other half precision is a contradiction (warned and coerced, or
    refused). When both flags are off, ``unset_is_policy`` decides whether that means "not
    specified" (take the policy's) or an explicit fp32 request.
    """
    fp16, bf16 = _FLAGS[policy.dtype]
    asked_fp16, asked_bf16 = bool(getattr(args, "fp16", False)), bool(getattr(args, "bf16", False))
    if (asked_fp16, asked_bf16) != (fp16, bf16):
        if asked_fp16 or asked_bf16 or not unset_is_policy:
            asked = "fp16=True" if asked_fp16 else "bf16=True" if asked_bf16 else "fp32"
            _mismatch(
                policy,
                f"{type(args).__name__}({asked}) contradicts the {policy.dtype} policy",
                f"pass fp16={fp16}, bf16={bf16} (or leave both unset), or enable the plugin with "
                f"the dtype you want",
            )
        args.fp16, args.bf16 = fp16, bf16
    for name, wanted in (("fp16_full_eval", fp16), ("bf16_full_eval", bf16)):
        if getattr(args, name, False) and not wanted:
            _mismatch(
                policy,
                f"{type(args).__name__}({name}=True) contradicts the {policy.dtype} policy",
                f"drop {name}",
            )
            setattr(args, name, False)


def __getattr__(name: str) -> Any:
    """``PrecisionCallback`` lives in :mod:`precision_plugin.callback` (imports transformers)."""
    if name in ("PrecisionCallback", "bind_callback"):
        from precision_plugin import callback

        return getattr(callback, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- hooks -----------------------------------------------------------------------------------


def _wrap_args_post_init(policy: PrecisionPolicy) -> Callable[[Callable[..., Any]], Any]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def __post_init__(self: Any) -> None:
            coerce_training_flags(self, policy, unset_is_policy=True)
            original(self)

        return __post_init__

    return make


def _wrap_trainer_init(policy: PrecisionPolicy) -> Callable[[Callable[..., Any]], Any]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            from precision_plugin.master_weights import prepare_model

            if getattr(self, "model", None) is not None and not _uses_deepspeed(self.args, self):
                prepare_model(self.model, policy)
            from precision_plugin.callback import bind_callback

            bind_callback(self, policy)

        return __init__

    return make


@hookimpl
def precision_install(policy: PrecisionPolicy, patcher: Any) -> None:
    """Wrap ``TrainingArguments.__post_init__`` and ``Trainer.__init__`` (see the module doc)."""
    if installed_version("transformers") is None:
        return
    patcher.when_imported(
        "transformers.training_args",
        lambda module: patcher.wrap(
            module.TrainingArguments,
            "__post_init__",
            _wrap_args_post_init(policy),
            reason="fp16/bf16 are read in __post_init__ (mixed_precision, DeepSpeed 'auto' "
            "fill); no hook runs before it",
        ),
        reason="enable() imports no framework",
    )
    patcher.when_imported(
        "transformers.trainer",
        lambda module: patcher.wrap(
            module.Trainer,
            "__init__",
            _wrap_trainer_init(policy),
            reason="callbacks never receive the trainer; binding it and fixing the model's "
            "dtypes before the first step needs the constructed trainer",
        ),
        reason="enable() imports no framework",
    )


@hookimpl
def precision_train_begin(
    policy: PrecisionPolicy, args: Any, state: Any, model: Any, trainer: Any
) -> None:
    """Check the flags and what the accelerator runs; cast the model to the policy's dtypes."""
    from precision_plugin.master_weights import prepare_model

    fp16, bf16 = _FLAGS[policy.dtype]
    if (bool(getattr(args, "fp16", False)), bool(getattr(args, "bf16", False))) != (fp16, bf16):
        asked = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
        _mismatch(
            policy,
            f"the trainer runs {asked} (args.fp16={args.fp16}, args.bf16={args.bf16}) but the "
            f"policy is {policy.dtype}; the accelerator is already built, so the run stays {asked}",
            f"set fp16={fp16}, bf16={bf16} in the training arguments, or call "
            f"precision_plugin.enable() before building them",
            coerced=False,
        )
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None and policy.uses_loss_scaler and accelerator.scaler is None:
        kind = getattr(accelerator.distributed_type, "name", "")
        if kind not in ("DEEPSPEED", "MEGATRON_LM"):
            _mismatch(
                policy,
                "the trainer's accelerator has no loss scaler although the policy is float16 "
                f"(device {accelerator.device.type}, mixed_precision "
                f"{accelerator.state.mixed_precision!r})",
                "call precision_plugin.enable() before building the trainer",
                coerced=False,
            )
    if model is not None and not _uses_deepspeed(args, trainer):
        prepare_model(model, policy)


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding] | None:
    """What the HF Trainer would run, and what ``enable()`` changes."""
    version = installed_version("transformers")
    if version is None:
        return None
    fp16, bf16 = _FLAGS[policy.dtype]
    return [
        Finding("transformers", "info", f"transformers {version} installed"),
        Finding(
            "transformers",
            "change",
            f"TrainingArguments get fp16={fp16}, bf16={bf16}; every Trainer casts trainable "
            "parameters to fp32 master weights and logs precision/loss_scale and "
            "precision/skipped_steps",
        ),
    ]
