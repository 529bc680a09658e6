"""What the rollout side runs with (``--rollout KEY=VALUE,...``), under vLLM's names.

``temperature``, ``top_p``, ``top_k`` and ``logprobs_mode`` are vLLM's ``SamplingParams`` /
engine settings, ``kv_cache_dtype`` is vLLM's ``--kv-cache-dtype`` (``auto``, ``fp8`` =
``fp8_e4m3``, ``fp8_e5m2``), and ``lm_head_fp32`` is SGLang's ``--enable-fp32-lm-head`` (the LM
head's logits in float32 on the rollout side). The attribution applies them to the rollout side
the way the engine does and measures what each costs.

Three more fields exist for the Python API and the tests (no engine spells them): ``rope_dtype``
(RoPE ``inv_freq`` rounded to this dtype on the rollout side; vLLM keeps it in float32),
``lm_head_dtype`` (the LM head computed in this dtype on the rollout side) and ``router_dtype``
(an MoE router computed in this dtype on the rollout side). They inject one component's rounding
under any compute dtype, float32 included.
"""

from __future__ import annotations

import contextlib
import decimal
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._base.dtypes import canonical_dtype_name
from precision_plugin._core.sampling import SamplingSettings
from precision_plugin.errors import PrecisionConfigError

#: ``--kv-cache-dtype`` values, as vLLM spells them, and the torch format each emulates.
KV_CACHE_DTYPES: dict[str, str | None] = {
    "auto": None,
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
#: The stale-weights step's learning rate unless ``--learning-rate`` says otherwise: a typical RL
#: fine-tuning rate (GRPO recipes use 1e-6 to 3e-6). The one definition: ``AttributionSettings``,
#: ``measure.attribute`` and the CLI's ``--learning-rate`` (``cli/probe_attribution.py``) read it.
DEFAULT_LEARNING_RATE = 1e-6
_ROUNDINGS = ("float16", "bfloat16", "float32")
#: The keys ``--rollout`` takes, with what each means (the error message lists them).
ROLLOUT_KEYS: dict[str, str] = {
    "temperature": "a number in [1e-05, 2] (vLLM SamplingParams.temperature)",
    "top_p": "a number in (0, 1] (vLLM SamplingParams.top_p)",
    "top_k": "a whole number, 0 or -1 (off) or at least 1 (vLLM SamplingParams.top_k)",
    "logprobs_mode": "raw_logprobs or processed_logprobs (vLLM --logprobs-mode)",
    "kv_cache_dtype": "auto, fp8, fp8_e4m3 or fp8_e5m2 (vLLM --kv-cache-dtype)",
    "lm_head_fp32": "true or false (SGLang --enable-fp32-lm-head)",
}


@checked
@dataclass(frozen=True)
class RolloutSettings:
    """The rollout side's settings the attribution applies (see the module docstring)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    logprobs_mode: str = "raw_logprobs"
    kv_cache_dtype: str = "auto"
    lm_head_fp32: bool = False
    rope_dtype: str | None = None
    lm_head_dtype: str | None = None
    router_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise PrecisionConfigError(
                f"rollout: logprobs_mode={self.logprobs_mode!r} is not one of "
                f"{', '.join(LOGPROBS_MODES)}; pass e.g. logprobs_mode=processed_logprobs."
            )
        # SamplingSettings checks the sampling ranges and names the setting; the message says
        # where the user gave it (the rollout's settings, not a class they never wrote).
        try:
            self.sampling()
        except PrecisionConfigError as exc:
            raise PrecisionConfigError(
                str(exc).replace("SamplingSettings(): ", "rollout: ", 1)
            ) from None
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise PrecisionConfigError(
                f"rollout: kv_cache_dtype={self.kv_cache_dtype!r} is not one the probe can "
                f"emulate ({', '.join(KV_CACHE_DTYPES)}); pass e.g. kv_cache_dtype=fp8_e4m3."
            )
        for name in ("rope_dtype", "lm_head_dtype", "router_dtype"):
            value = getattr(self, name)
            canonical = None if value is None else canonical_dtype_name(value)
            if value is not None and canonical is None:
                raise PrecisionConfigError(
                    f"rollout: {name}={value!r} is not one of {', '.join(_ROUNDINGS)} (aliases "
                    f"fp16, bf16, fp32; or None)."
                )
            object.__setattr__(self, name, canonical)  # fp16 as float16
        if self.lm_head_fp32 and self.lm_head_dtype not in (None, "float32"):
            raise PrecisionConfigError(
                f"rollout: lm_head_fp32=True contradicts lm_head_dtype={self.lm_head_dtype!r}; "
                f"pass one of them."
            )

    def sampling(self) -> SamplingSettings:
        """The sampling part as the rollout engine's [`SamplingSettings`][precision_plugin._core.sampling.SamplingSettings]."""  # noqa: E501
        return SamplingSettings(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            logprobs_mode=self.logprobs_mode,  # type: ignore[arg-type]
        )

    @property
    def head_dtype(self) -> str | None:
        """The dtype the rollout computes its LM head in (``None``: the model's own)."""
        return "float32" if self.lm_head_fp32 else self.lm_head_dtype

    @property
    def kv_format(self) -> str | None:
        """The torch float8 format the KV cache is rounded to (``None``: not rounded)."""
        return KV_CACHE_DTYPES[self.kv_cache_dtype]

    @property
    def truncates(self) -> bool:
        """Whether the rollout samples from a truncated distribution (``top_p`` below 1 or
        ``top_k`` on): with ``raw_logprobs`` the log-probs it records are then not those of the
        distribution it sampled from."""
        return self.top_p != 1.0 or self.top_k not in (0, -1)

    @property
    def samples_differently(self) -> bool:
        """Whether sampling differs from the full distribution at temperature 1."""
        return self.temperature != 1.0 or self.top_p != 1.0 or self.top_k not in (0, -1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return asdict(self)


def changed_settings(rollout: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a rollout-settings dict (``RolloutSettings.to_dict()``, or a results
    file's ``attribution.rollout``) that differ from :class:`RolloutSettings`' defaults, in
    order: ``True`` is not the default ``1.0`` or ``0`` here, though Python finds them equal."""
    defaults = {f.name: f.default for f in fields(RolloutSettings)}
    return {
        key: value
        for key, value in rollout.items()
        if key not in defaults
        or not (
            isinstance(value, bool) == isinstance(defaults[key], bool) and value == defaults[key]
        )
    }


@checked
def parse_rollout(text: str) -> RolloutSettings:
    """``"top_p=0.9,logprobs_mode=processed_logprobs"`` -> :class:`RolloutSettings`.

    Raises [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError] naming the key
    and the fix for an unknown key, a repeated key or a value of the wrong kind.
    """
    values: dict[str, Any] = {}
    if not text.replace(",", "").strip():
        raise PrecisionConfigError(
            f"--rollout: {text!r} names no setting; pass KEY=VALUE pairs, e.g. "
            f"--rollout top_p=0.9,logprobs_mode=processed_logprobs (or leave --rollout out for "
            f"the defaults)."
        )
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, raw = (s.strip() for s in item.partition("="))
        if not sep or not key or not raw:
            raise PrecisionConfigError(
                f"--rollout: {item!r} is not KEY=VALUE; pass e.g. "
                f"--rollout top_p=0.9,logprobs_mode=processed_logprobs."
            )
        if key not in ROLLOUT_KEYS:
            known = "; ".join(f"{k}: {v}" for k, v in ROLLOUT_KEYS.items())
            raise PrecisionConfigError(
                f"--rollout: unknown key {key!r}; the keys are vLLM's names plus lm_head_fp32: "
                f"{known}; e.g. --rollout top_p=0.9,kv_cache_dtype=fp8."
            )
        if key in values:
            raise PrecisionConfigError(f"--rollout: {key!r} is given twice; pass it once.")
        values[key] = _value(key, raw)
    try:
        return RolloutSettings(**values)
    except PrecisionConfigError as exc:
        raise PrecisionConfigError(f"--rollout: {str(exc).removeprefix('rollout: ')}") from None


def _value(key: str, raw: str) -> Any:
    kind = {f.name: f.type for f in fields(RolloutSettings)}[key]
    if kind == "bool":
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
    elif kind == "int":
        # Exactly as written, however large: 1e30 is 10**30 and 1e-400 is not a whole number
        # (float() would round the one and flush the other to 0, which means "off").
        with contextlib.suppress(ValueError):
            return int(raw)
        with contextlib.suppress(ArithmeticError, ValueError):
            float(raw)  # int()'s spelling rules, which Decimal relaxes ('_1', '1__0')
            number = decimal.Decimal(raw)
            whole = number.is_finite() and number == number.to_integral_value()
            if whole and number.adjusted() < 100:  # not 1e999999999, a billion digits
                return int(number)
    elif kind == "float":
        with contextlib.suppress(ValueError):
            number = float(raw)
            if math.isfinite(number):
                return number
    else:
        return raw
    raise PrecisionConfigError(f"--rollout: {key}={raw!r} is not {ROLLOUT_KEYS[key]}.")


@checked
@dataclass(frozen=True)
class AttributionSettings:
    """``probe --attribute``: the rollout's settings and the stale-weights learning rate."""

    rollout: RolloutSettings = RolloutSettings()
    learning_rate: float = DEFAULT_LEARNING_RATE

    def __post_init__(self) -> None:
        lr = self.learning_rate
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and 0 < lr <= 1):
            raise PrecisionConfigError(
                f"learning-rate: {lr!r} is not a number in (0, 1]; pass the rate you train at, "
                f"e.g. --learning-rate 1e-6 (the default)."
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"rollout": self.rollout.to_dict(), "learning_rate": self.learning_rate}
