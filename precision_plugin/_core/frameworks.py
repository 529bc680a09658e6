"""The one table from a policy to each framework's spelling of it.

Every adapter asks here what its framework calls the policy, in the spirit of Accelerate's
``KwargsHandler.to_kwargs()``: the HF/TRL ``fp16``/``bf16`` flags, Accelerate's
``mixed_precision`` and ``GradScalerKwargs``, torch's ``GradScaler`` arguments, DeepSpeed's
``fp16``/``bf16`` sections and how DeepSpeed reads their ``enabled`` flag, vLLM's ``dtype`` and
SGLang's ``dtype``.
Where a framework cannot represent a setting exactly, the table says so once: refused under
``strictness="error"``, else a warning with the exact value that runs.

Each decision is made once per object:
[`settle_once`][precision_plugin._core.frameworks.settle_once]
marks an object (a ``TrainingArguments``, a model) as settled for a policy, so the several
places that see the same object (a TRL config's two ``__post_init__`` levels, the ``Trainer``,
``Accelerator.prepare_model``, the callback) do the work once.

Pure: imports no framework and no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from precision_plugin._base.boundary import checked, non_empty, policy_field
from precision_plugin._base.conflicts import settle_conflict
from precision_plugin._base.dtypes import dtype_label, spellings
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import LossScalerSettings, PrecisionPolicy


# -- HF TrainingArguments / TRL configs ------------------------------------------------------
@checked
@dataclass(frozen=True)
class TrainerFlags:
    """The ``fp16``/``bf16`` flags of ``TrainingArguments`` (and every TRL config)."""

    fp16: bool = False
    bf16: bool = False

    def to_kwargs(self) -> dict[str, bool]:
        """``{"fp16": ..., "bf16": ...}``, as ``TrainingArguments(**kwargs)`` takes them."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return f"fp16={self.fp16}, bf16={self.bf16}"


_TRAINER_FLAGS = {
    "float16": TrainerFlags(fp16=True),
    "bfloat16": TrainerFlags(bf16=True),
    "float32": TrainerFlags(),
}


@checked
def trainer_flags(policy: PrecisionPolicy) -> TrainerFlags:
    """The HF/TRL flags that run ``policy.dtype`` (float32: both off)."""
    return _TRAINER_FLAGS[policy.dtype]


@checked
def flags_of(args: Any) -> TrainerFlags:
    """The flags a ``TrainingArguments`` asks for; TRL's unset ``bf16=None`` reads as off."""
    return TrainerFlags(bool(getattr(args, "fp16", False)), bool(getattr(args, "bf16", False)))


# -- Accelerate ------------------------------------------------------------------------------
_MIXED_PRECISION = {"float16": "fp16", "bfloat16": "bf16", "float32": "no"}


@checked
def mixed_precision(policy: PrecisionPolicy) -> str:
    """Accelerate's (and the HF Trainer's) ``mixed_precision``: ``fp16``, ``bf16`` or ``no``."""
    return _MIXED_PRECISION[policy.dtype]


@checked
@dataclass(frozen=True)
class GradScalerSettings:
    """torch ``GradScaler`` keyword arguments; Accelerate's ``GradScalerKwargs`` has the same."""

    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    enabled: bool

    def to_kwargs(self, known: Iterable[str] | None = None) -> dict[str, Any]:
        """The keyword arguments, limited to the names in ``known`` (a handler's fields)."""
        out = dataclasses.asdict(self)
        return out if known is None else {k: v for k, v in out.items() if k in set(known)}


@checked
def grad_scaler(settings: LossScalerSettings) -> GradScalerSettings:
    """The policy's loss-scaler settings as torch ``GradScaler`` / ``GradScalerKwargs`` values."""
    return GradScalerSettings(
        init_scale=float(settings.init_scale),
        growth_factor=float(settings.growth_factor),
        backoff_factor=float(settings.backoff_factor),
        growth_interval=int(settings.growth_interval),
        enabled=bool(settings.enabled),
    )


# -- DeepSpeed -------------------------------------------------------------------------------
#: DeepSpeed's section names for the policy dtypes (``bfloat16`` is the legacy alias of ``bf16``).
DS_FP16, DS_BF16 = "fp16", "bf16"

# pydantic's lax bool parsing, which DeepSpeedFP16Config/DeepSpeedBF16Config use for "enabled".
_DS_TRUE = {"1", "on", "t", "true", "y", "yes"}
_DS_FALSE = {"0", "off", "f", "false", "n", "no"}


@checked
def deepspeed_enabled_sections(policy: PrecisionPolicy) -> dict[str, bool]:
    """``{"fp16": enabled, "bf16": enabled}``: DeepSpeed's sections run what the flags run."""
    flags = trainer_flags(policy)
    return {DS_FP16: flags.fp16, DS_BF16: flags.bf16}


@checked
def deepspeed_flag(value: Any) -> bool | None:
    """``value`` as DeepSpeed reads an ``fp16``/``bf16`` ``"enabled"`` key; ``None`` if it refuses.

    DeepSpeed validates these sections with pydantic, whose bool accepts ``True``/``False``,
    ``1``/``0`` (also ``1.0``/``0.0``) and the strings ``true``/``yes``/``on``/``y``/``t``/``1``
    and their negatives in any case; anything else is a validation error there.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        key = value.lower()
        if key in _DS_TRUE:
            return True
        if key in _DS_FALSE:
            return False
    return None


@checked
def deepspeed_autocast_flag(value: Any) -> bool:
    """``torch_autocast.enabled`` as DeepSpeed reads it: a plain truth test, no validation."""
    return bool(value)


@checked(strictness=policy_field("strictness"))
def deepspeed_scale_power(settings: LossScalerSettings, strictness: str) -> int:
    """DeepSpeed's ``initial_scale_power`` for ``loss_scaler.init_scale``.

    DeepSpeed starts at ``2**initial_scale_power``; an ``init_scale`` that is not a power of two
    becomes the power of two below it. That is refused under ``strictness="error"``, else
    warned about with the scale that runs.
    """
    power = max(0, math.frexp(settings.init_scale)[1] - 1)
    if 2.0**power != settings.init_scale:
        _inexact(
            strictness,
            f"loss_scaler.init_scale={settings.init_scale:g}",
            "DeepSpeed's initial scale is a power of two (fp16.initial_scale_power)",
            f"loss_scaler.init_scale={2.0**power:g} or {2.0 ** (power + 1):g}",
            f"DeepSpeed starts at {2.0**power:g} (initial_scale_power={power})",
        )
    return power


@checked(strictness=policy_field("strictness"))
def deepspeed_min_scale(settings: LossScalerSettings, strictness: str) -> int:
    """DeepSpeed's ``min_loss_scale`` for ``loss_scaler.min_scale`` (DeepSpeed takes an integer
    >= 1; anything else is refused under ``strictness="error"``, else warned about)."""
    floor = max(1, math.floor(settings.min_scale))
    if floor != settings.min_scale:
        _inexact(
            strictness,
            f"loss_scaler.min_scale={settings.min_scale:g}",
            "DeepSpeed's fp16.min_loss_scale is an integer >= 1",
            f"loss_scaler.min_scale={floor}",
            f"DeepSpeed's floor is {floor}",
        )
    return floor


@checked
def deepspeed_dynamic_scaling(policy: PrecisionPolicy) -> dict[str, Any]:
    """The ``fp16`` section keys of DeepSpeed's dynamic loss scaler under ``policy``."""
    settings = policy.loss_scaler
    return {
        "loss_scale": 0,
        "initial_scale_power": deepspeed_scale_power(settings, policy.strictness),
        "loss_scale_window": settings.growth_interval,
        "hysteresis": settings.hysteresis,
        "min_loss_scale": deepspeed_min_scale(settings, policy.strictness),
    }


def _inexact(strictness: str, asked: str, why: str, fix: str, outcome: str) -> None:
    settle_conflict(
        strictness,
        f"{asked} cannot run exactly under DeepSpeed: {why}",
        fix=f"set {fix}",
        outcome=outcome,
    )


# -- vLLM ------------------------------------------------------------------------------------
@checked
def vllm_dtype(policy: PrecisionPolicy) -> str:
    """vLLM's ``dtype`` engine argument: the policy dtype's canonical name."""
    return policy.dtype


# -- OpenRLHF --------------------------------------------------------------------------------
@checked
def openrlhf_param_dtype(policy: PrecisionPolicy) -> str | None:
    """OpenRLHF's ``--ds.param_dtype`` for ``policy``: ``fp16`` or ``bf16`` (Accelerate's
    spelling); ``None`` for float32, which OpenRLHF's learner cannot run (choices bf16, fp16)."""
    return None if policy.dtype == "float32" else _MIXED_PRECISION[policy.dtype]


@checked
def openrlhf_learner_dtype(param_dtype: str) -> str | None:
    """The policy dtype an OpenRLHF ``--ds.param_dtype`` value trains in, or ``None``."""
    found = [d for d, name in _MIXED_PRECISION.items() if name == param_dtype and d != "float32"]
    return found[0] if found else None


# -- SGLang ----------------------------------------------------------------------------------
#: SGLang's ``--dtype`` choices (``ServerArgs.dtype``) and the precision each runs; ``auto`` is
#: decided from the checkpoint (``precision_plugin.sglang.auto_dtype``). SGLang has no ``fp16``.
SGLANG_DTYPE_CHOICES: dict[str, str | None] = {
    "auto": None,
    **spellings(("half", "float16", "bfloat16", "float", "float32")),
}


@checked
def sglang_dtype(policy: PrecisionPolicy) -> str:
    """SGLang's ``--dtype`` / ``ServerArgs.dtype`` for the policy: ``float16``, ``bfloat16`` or
    ``float32`` (never ``fp16``, which SGLang's parser refuses)."""
    return policy.dtype


@checked
def sglang_runs(value: Any) -> str | None:
    """The canonical dtype an SGLang ``dtype`` value runs; ``None`` for ``auto``/unset.

    A ``torch.dtype`` (``sglang.Engine(dtype=torch.float16)``) runs as it is, as SGLang's
    ``_get_and_verify_dtype`` takes it. Raises ``PrecisionConfigError`` for a value SGLang
    refuses (``fp16``, the string ``"torch.float16"``).
    """
    if value is None:
        return None
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        return dtype_label(value)
    if not isinstance(value, str):  # a mapping or list: its repr would not say which argument
        raise PrecisionConfigError(
            f"SGLang dtype (value): got {type(value).__name__}, not a dtype; pass one of "
            f"{', '.join(SGLANG_DTYPE_CHOICES)} or a torch.dtype."
        )
    key = value.strip().lower()
    if key not in SGLANG_DTYPE_CHOICES:
        raise PrecisionConfigError(
            f"SGLang dtype {value!r} is not one SGLang accepts; choose one of "
            f"{', '.join(SGLANG_DTYPE_CHOICES)} (SGLang spells float16 'float16' or 'half', "
            f"never 'fp16')."
        )
    return SGLANG_DTYPE_CHOICES[key]


# -- one decision per object -----------------------------------------------------------------
_SETTLED = "__precision_plugin_settled__"


@checked(what=non_empty("a name for the decision, e.g. 'trainer_flags'"))
def settle_once(obj: Any, what: str, policy: PrecisionPolicy, settle: Callable[[], Any]) -> None:
    """Run ``settle()`` for ``obj`` unless ``what`` was already settled for ``policy`` on it.

    The mark lives on the object itself (no registry) and names the object, so a copy (which
    carries the mark along) is settled anew, and another policy settles again. Objects that
    refuse attributes are settled every time.
    """
    marks = getattr(obj, _SETTLED, None)
    if isinstance(marks, dict) and marks.get(what) == (id(obj), policy):
        return
    settle()
    marks = dict(marks) if isinstance(marks, dict) else {}
    marks[what] = (id(obj), policy)
    with contextlib.suppress(AttributeError, TypeError):  # slots: settled again next time
        object.__setattr__(obj, _SETTLED, marks)
