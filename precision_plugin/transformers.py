"""HF Trainer adapter and :class:`PrecisionCallback` (also used by every TRL trainer).

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
import weakref
from collections.abc import Callable
from typing import Any

from precision_plugin.errors import PrecisionMismatchError
from precision_plugin.hookspecs import hookimpl
from precision_plugin.manager import current_policy, get_plugin_manager
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.report import Finding
from precision_plugin.versions import installed_version

log = logging.getLogger("precision_plugin")

PREFIX = "precision/"

_FLAGS = {"float16": (True, False), "bfloat16": (False, True), "float32": (False, False)}


def _mismatch(policy: PrecisionPolicy, message: str, fix: str, *, coerced: bool = True) -> None:
    if policy.strictness == "error":
        raise PrecisionMismatchError(
            f"precision_plugin: {message} (strictness='error'). Fix: {fix}"
        )
    action = "coerced to the policy" if coerced else f"fix: {fix}"
    log.warning("precision_plugin: %s; %s.", message, action)


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


class _ForwardProbe:
    """Records the output dtype of the first ``Linear`` in the first grad-enabled forward."""

    def __init__(self, model: Any) -> None:
        import torch

        self.dtype: Any = None
        self._handle = None
        linear = next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)
        if linear is not None:
            self._handle = linear.register_forward_hook(self._hook)

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        import torch

        if torch.is_grad_enabled() and module.training and hasattr(output, "dtype"):
            self.dtype = output.dtype
            self.remove()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _no_trainer() -> None:
    return None


def _make_callback_class() -> type:
    from transformers import TrainerCallback

    class PrecisionCallback(TrainerCallback):
        """TrainerCallback for the HF Trainer and TRL trainers: checks precision, logs metrics.

        On train begin it runs every adapter's ``precision_train_begin`` hook (flags and model
        dtypes against the policy, a vLLM server's dtype, ...); on the first training step it
        checks the dtype the forward really ran in; on every log it adds the adapters'
        ``precision_collect_metrics`` (loss scale, skipped steps, ...) as ``precision/<name>``.
        ``policy`` defaults to the active policy, else the default (float16) policy. The trainer
        is known when ``enable()`` is on (the plugin binds it) or after :meth:`bind`.
        """

        def __init__(self, policy: PrecisionPolicy | None = None) -> None:
            self._policy = policy
            self._trainer: Callable[[], Any] = _no_trainer
            self._probe: _ForwardProbe | None = None
            #: The dtype the first training forward ran in (``None`` until it ran).
            self.forward_dtype: Any = None

        def __getstate__(self) -> dict[str, Any]:
            # The trainer reference and the forward hook belong to this process only.
            return {**self.__dict__, "_trainer": _no_trainer, "_probe": None}

        @property
        def policy(self) -> PrecisionPolicy:
            """The policy this callback enforces."""
            return self._policy or current_policy() or PrecisionPolicy()

        @property
        def trainer(self) -> Any:
            """The bound trainer, or ``None``."""
            return self._trainer()

        def bind(self, trainer: Any) -> PrecisionCallback:
            """Give the callback its trainer (held weakly); return the callback."""
            self._trainer = weakref.ref(trainer)
            return self

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            model = kwargs.get("model")
            get_plugin_manager().hook.precision_train_begin(
                policy=self.policy, args=args, state=state, model=model, trainer=self.trainer
            )
            if model is not None and self.forward_dtype is None:
                self._probe = _ForwardProbe(model)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            probe, self._probe = self._probe, None
            if probe is None:
                return
            probe.remove()
            self.forward_dtype = probe.dtype
            wanted = self.policy.torch_dtype
            if probe.dtype is not None and probe.dtype != wanted:
                _report_forward(self.policy, probe.dtype, args)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
            if logs is None:
                return
            metrics = self.collect(optimizer=kwargs.get("optimizer"), logs=logs)
            if not metrics:
                return
            logs.update(metrics)
            if state.log_history:  # Trainer.log appended a copy of `logs` just before on_log
                state.log_history[-1].update(metrics)

        def collect(self, optimizer: Any = None, logs: Any = None) -> dict[str, float]:
            """The ``precision/<name>`` metrics to log now."""
            merged: dict[str, float] = {}
            results = get_plugin_manager().hook.precision_collect_metrics(
                policy=self.policy, trainer=self.trainer
            )
            for result in reversed(results):  # first-registered adapter wins a name clash
                merged.update(result or {})
            if "loss_scale" not in merged:
                from precision_plugin.scaler import scaler_stats

                stats = scaler_stats(getattr(optimizer, "scaler", None))
                if stats is not None:
                    merged.update(stats.as_metrics())
            if logs:
                from precision_plugin.trl import alias_metrics

                merged.update(alias_metrics(logs))
            return {PREFIX + k: float(v) for k, v in merged.items()}

    PrecisionCallback.__qualname__ = "PrecisionCallback"  # importable name: pickling, docs
    PrecisionCallback.__module__ = __name__
    return PrecisionCallback


def _report_forward(policy: PrecisionPolicy, ran: Any, args: Any) -> None:
    short = str(ran).removeprefix("torch.")
    message = (
        f"the training forward ran in {short} but the policy is {policy.dtype} (mixed_precision "
        f"{getattr(args, 'mixed_precision', '?')!r})"
    )
    fix = (
        "call precision_plugin.enable() before building the trainer (on CPU, Accelerate and the "
        "HF Trainer silently run fp32 when asked for fp16; enable() makes them run fp16)"
    )
    if policy.strictness == "error":
        raise PrecisionMismatchError(f"precision_plugin: {message}. Fix: {fix}.")
    log.warning("precision_plugin: %s. Fix: %s.", message, fix)


_callback_class: type | None = None


def __getattr__(name: str) -> Any:
    """``PrecisionCallback`` is built on first use: transformers is imported only then."""
    global _callback_class
    if name == "PrecisionCallback":
        if _callback_class is None:
            _callback_class = _make_callback_class()
        return _callback_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def bind_callback(trainer: Any, policy: PrecisionPolicy | None = None) -> Any:
    """Find (or add) the trainer's ``PrecisionCallback``, bind it, and move it first."""
    cls = __getattr__("PrecisionCallback")
    handler = trainer.callback_handler
    found = next((cb for cb in handler.callbacks if isinstance(cb, cls)), None)
    if found is None:
        found = cls(policy)
    else:
        handler.callbacks.remove(found)
    handler.callbacks.insert(0, found)
    return found.bind(trainer)


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
