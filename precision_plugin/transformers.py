"""HF Trainer adapter (also covers every TRL trainer); the callback is in ``callback.py``.

With ``enable()``:

- ``TrainingArguments`` (and TRL configs, which subclass it) get the policy's ``fp16``/``bf16``
  flags: unset flags take the policy's, a contradiction (``bf16=True`` under float16) is coerced
  with a warning or refused under ``strictness="error"``;
- every ``Trainer`` casts its model to the policy's master-weight dtypes once it is built
  (after TRL's QLoRA cast to bf16) and gets a
  [`PrecisionCallback`][precision_plugin.callback.PrecisionCallback] bound to it, first in the
  callback list so reporters (W&B, TensorBoard) see its metrics;
- ``Trainer.train`` releases what the callback changed for the run (fp32 wrappers, detector
  hooks, telemetry) when it returns *or raises* (an exception, ``KeyboardInterrupt``).

Without ``enable()``, ``callbacks=[PrecisionCallback()]`` still checks and fixes what a callback
can reach (flags against the policy, parameter dtypes, the dtype the training forward really
ran in) and logs the loss scale; what only exists inside the trainer (the ``Accelerator``'s
mixed precision, fp16 on CPU) it reports instead of fixing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from precision_plugin._base import moved
from precision_plugin._base.conflicts import settle_conflict
from precision_plugin._base.report import Finding
from precision_plugin._base.versions import installed_version
from precision_plugin._core.frameworks import TrainerFlags, flags_of, settle_once, trainer_flags
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")


def _mismatch(policy: PrecisionPolicy, message: str, fix: str, *, coerced: bool = True) -> None:
    outcome = "coerced to the policy" if coerced else f"fix: {fix}"
    settle_conflict(policy.strictness, message, fix=fix, outcome=outcome)


def _uses_deepspeed(args: Any, trainer: Any = None) -> bool:
    """DeepSpeed casts and scales the model itself (see precision_plugin.deepspeed)."""
    if trainer is not None and getattr(trainer, "is_deepspeed_enabled", False):
        return True
    return bool(getattr(args, "deepspeed", None) or getattr(args, "deepspeed_plugin", None))


def contradicting_flags(asked: TrainerFlags, policy: PrecisionPolicy) -> str:
    """The flag(s) the user set that the policy contradicts, as the user wrote them.

    ``fp16=True, bf16=True`` under float16 names ``bf16=True`` (``fp16=True`` is right); both
    off under a half-precision policy names the fp32 request.
    """
    wanted = trainer_flags(policy)
    wrong = [
        f"{name}=True"
        for name in ("fp16", "bf16")
        if getattr(asked, name) and not getattr(wanted, name)
    ]
    return ", ".join(wrong) if wrong else "fp16=False, bf16=False (fp32)"


def settle_training_flags(args: Any, policy: PrecisionPolicy) -> None:
    """Give ``args.fp16``/``args.bf16`` (and the ``*_full_eval`` pair) the policy's flags, once.

    Both flags off or unset (TRL's ``bf16=None``) take the policy's; a flag that asks for
    another precision is a contradiction (warned and coerced, or refused). A TRL config reaches
    this from two ``__post_init__`` levels; the first one settles it.
    """
    settle_once(args, "trainer_flags", policy, lambda: _coerce_flags(args, policy))


def _coerce_flags(args: Any, policy: PrecisionPolicy) -> None:
    wanted, asked = trainer_flags(policy), flags_of(args)
    if asked != wanted and (asked.fp16 or asked.bf16):
        shown = contradicting_flags(asked, policy)
        _mismatch(
            policy,
            f"{type(args).__name__}({shown}) contradicts the {policy.dtype} policy",
            f"pass {wanted} (or leave both unset), or enable the plugin with the dtype you want",
        )
    args.fp16, args.bf16 = wanted.fp16, wanted.bf16
    for name, allowed in (("fp16_full_eval", wanted.fp16), ("bf16_full_eval", wanted.bf16)):
        if getattr(args, name, False) and not allowed:
            _mismatch(
                policy,
                f"{type(args).__name__}({name}=True) contradicts the {policy.dtype} policy",
                f"drop {name}",
            )
            setattr(args, name, False)


# PrecisionCallback and bind_callback live in precision_plugin.callback (layer 4, it imports
# transformers); their old path here resolves through the alias table, by name.
__getattr__ = moved.getattr_of(__name__)


# -- hooks -----------------------------------------------------------------------------------


def _args_post_init(policy: PrecisionPolicy, original: Callable[..., Any], self: Any) -> None:
    settle_training_flags(self, policy)
    original(self)


@hookimpl
def precision_install(policy: PrecisionPolicy, patcher: Any) -> None:
    """Wrap ``TrainingArguments.__post_init__`` (see the module doc; ``Trainer.__init__`` and
    ``Trainer.train`` are wrapped by ``precision_plugin.trainer_hooks``, beside
    the callback they bind)."""
    if installed_version("transformers") is None:
        return
    patcher.wrap_on_import(
        "transformers.training_args",
        "TrainingArguments.__post_init__",
        functools.partial(_args_post_init, policy),
        reason="fp16/bf16 are read in __post_init__ (mixed_precision, DeepSpeed 'auto' "
        "fill); no hook runs before it",
    )


@hookimpl
def precision_train_begin(
    policy: PrecisionPolicy, args: Any, state: Any, model: Any, trainer: Any
) -> None:
    """Check the flags and what the accelerator runs; cast the model to the policy's dtypes."""
    from precision_plugin._core.master_weights import prepare_model_once

    wanted, ran = trainer_flags(policy), flags_of(args)
    if ran != wanted:
        asked = "fp16" if ran.fp16 else "bf16" if ran.bf16 else "fp32"
        _mismatch(
            policy,
            f"the trainer runs {asked} ({contradicting_flags(ran, policy)} in the training "
            f"arguments) but the policy is {policy.dtype}; the accelerator is already built, so "
            f"the run stays {asked}",
            f"set {wanted} in the training arguments, or call "
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
        prepare_model_once(model, policy)


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding] | None:
    """What the HF Trainer would run, and what ``enable()`` changes."""
    version = installed_version("transformers")
    if version is None:
        return None
    return [
        Finding("transformers", "info", f"transformers {version} installed"),
        Finding(
            "transformers",
            "change",
            f"TrainingArguments get {trainer_flags(policy)}; every Trainer casts trainable "
            "parameters to fp32 master weights and logs precision/loss_scale and "
            "precision/skipped_steps",
        ),
    ]
