"""``PrecisionPolicy``: the one frozen, documented description of what should run.

Every field carries its help text in ``metadata["help"]`` (as TRL's ``GRPOConfig`` does), so the
docs and the CLI read it from one place. Parsing is strict: an unknown key, a wrong type or an
unsupported value raises [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError]
naming the field, the value, the allowed values and, for a misspelled key, the closest known one.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from precision_plugin._base.boundary import Coercion, register_coercion, self_checked
from precision_plugin._base.boundary.fields import (  # noqa: F401 (INT64_MAX: kept importable here)
    INT64_MAX,
    check_field,
    require_field,
)
from precision_plugin._base.dtypes import (  # noqa: F401 (re-exported: the policy's public names)
    DTYPE_ALIASES as _DTYPE_ALIASES,
)
from precision_plugin._base.dtypes import (
    DTypeName,
    normalize_dtype,
    torch_dtype,
)
from precision_plugin._base.userfiles import MAX_DEPTH as MAX_JSON_DEPTH  # noqa: F401
from precision_plugin._base.userfiles import (  # noqa: F401 (the JSON reader's names, kept here)
    DuplicateKeyError,
    TooDeepError,
    UserJSONError,
    parse_json,
)
from precision_plugin.errors import PrecisionConfigError

#: Environment variable read by
#: [`PrecisionPolicy.from_env`][precision_plugin.policy.PrecisionPolicy.from_env] (and by vLLM
#: processes).
ENV_VAR = "PRECISION_PLUGIN"

#: Largest finite float32 (torch's GradScaler keeps the scale in a float32 tensor) and the
#: smallest positive normal one: a scale setting outside them becomes inf or 0 where it is used.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38

_ENV_OFF = {"", "0", "false", "off", "no", "none", "disable", "disabled"}
_ENV_DEFAULT = {"1", "true", "on", "yes", "enable", "enabled"}


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class LossScalerSettings:
    """Dynamic loss-scaler settings (used when the policy dtype is float16).

    Defaults follow the paper's code and verl: init 2**16, growth x2, backoff x0.5, growth
    every 400 clean steps (torch's own default of 2000 recovers too slowly for RL).
    """

    enabled: bool = field(
        default=True,
        metadata=_help("Use a dynamic loss scaler under float16. Ignored for bf16/fp32."),
    )
    init_scale: float = field(default=2.0**16, metadata=_help("Initial loss scale."))
    growth_factor: float = field(
        default=2.0,
        metadata=_help("Factor applied to the scale after growth_interval clean steps."),
    )
    backoff_factor: float = field(
        default=0.5, metadata=_help("Factor applied to the scale when a step overflows.")
    )
    growth_interval: int = field(
        default=400, metadata=_help("Consecutive overflow-free steps before the scale grows.")
    )
    hysteresis: int = field(
        default=2,
        metadata=_help("DeepSpeed only: overflows tolerated before the scale is reduced."),
    )
    min_scale: float = field(
        default=1.0, metadata=_help("Floor of the loss scale (DeepSpeed min_loss_scale).")
    )
    max_skips_at_min: int = field(
        default=20,
        metadata=_help(
            "on_min_scale acts when the scale is at min_scale and the current run of "
            "consecutive skipped steps (counted from its first skip) reaches this many, and "
            "again at every further multiple: the run is no longer learning, only skipping."
        ),
    )
    on_min_scale: Literal["error", "warn"] = field(
        default="error",
        metadata=_help(
            "What to do when the scale is stuck at its floor: 'error' stops the run with an "
            "actionable message, 'warn' logs it and keeps going."
        ),
    )

    def __post_init__(self) -> None:
        _validate_fields(self, "loss_scaler.")
        for name in ("init_scale", "growth_factor", "backoff_factor", "min_scale"):
            value = getattr(self, name)
            require_field(
                value == 0 or FLOAT32_TINY <= abs(value) <= FLOAT32_MAX,
                f"loss_scaler.{name}",
                value,
                f"a number float32 represents, {FLOAT32_TINY:.4g} .. {FLOAT32_MAX:.4g} (the scaler "
                f"keeps it in float32, where this value becomes "
                f"{'inf' if abs(value) > FLOAT32_MAX else '0'})",
            )
        require_field(
            self.init_scale > 0, "loss_scaler.init_scale", self.init_scale, "a number > 0"
        )
        require_field(
            self.growth_factor > 1, "loss_scaler.growth_factor", self.growth_factor, "> 1"
        )
        require_field(
            0 < self.backoff_factor < 1,
            "loss_scaler.backoff_factor",
            self.backoff_factor,
            "a number in (0, 1)",
        )
        require_field(
            self.growth_interval >= 1,
            "loss_scaler.growth_interval",
            self.growth_interval,
            "an integer >= 1",
        )
        require_field(
            self.hysteresis >= 1, "loss_scaler.hysteresis", self.hysteresis, "an integer >= 1"
        )
        require_field(
            0 < self.min_scale <= self.init_scale,
            "loss_scaler.min_scale",
            self.min_scale,
            f"a number in (0, init_scale={self.init_scale}]",
        )
        require_field(
            self.max_skips_at_min >= 1,
            "loss_scaler.max_skips_at_min",
            self.max_skips_at_min,
            "an integer >= 1",
        )


@dataclass(frozen=True)
class VLLMSettings:
    """Rollout-side (vLLM) settings."""

    enforce_dtype: bool = field(
        default=True,
        metadata=_help(
            "Force vLLM engines to the policy dtype (TRL's colocated engine ignores it)."
        ),
    )
    cascade_guard: Literal["auto", "force", "off"] = field(
        default="auto",
        metadata=_help(
            "Cascade-attention guard: 'auto' disables cascade attention where the installed vLLM "
            "and GPU are known to be affected, 'force' disables it wherever the flag exists, "
            "'off' leaves vLLM alone."
        ),
    )
    verify_server: bool = field(
        default=True,
        metadata=_help(
            "At train start, ask a vLLM server for its dtype and compare with the learner."
        ),
    )
    cpu_keep_weights: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata=_help(
            "vLLM's CPU build prepacks Linear weights, which a colocated weight sync cannot "
            "update (a crash, or a stale LM head): 'auto' keeps the weights (vLLM's own F.linear "
            "path, slower) when TRL's colocate mode builds the engine, 'on' in every engine of "
            "a CPU build, 'off' leaves vLLM's prepacking."
        ),
    )
    sync_check: bool = field(
        default=True,
        metadata=_help(
            "After each colocated weight sync, both sides score a few fixed tokens; a gap far "
            "beyond the dtype's own rounding stops the run as a weight-sync fault (warned under "
            "strictness='warn')."
        ),
    )

    def __post_init__(self) -> None:
        _validate_fields(self, "vllm.")


@dataclass(frozen=True)
class MetricSettings:
    """Mismatch-measurement settings and the thresholds behind verdicts."""

    enabled: bool = field(
        default=True, metadata=_help("Measure the train/rollout mismatch during training.")
    )
    log_every: int = field(default=1, metadata=_help("Log mismatch metrics every N logging steps."))
    prob_diff_ok: float = field(
        default=0.005,
        metadata=_help("prob_diff_mean below this is healthy (verl's 'normal' threshold)."),
    )
    prob_diff_bad: float = field(
        default=0.01,
        metadata=_help("prob_diff_mean above this is a precision problem (verl's threshold)."),
    )
    canary_every: int = field(
        default=100,
        metadata=_help(
            "Drift canary: every N optimizer steps both sides rescore a fixed canary set (the "
            "first rollout batch) and its k3 is checked against its step-0 band; 0 turns it off."
        ),
    )
    self_check_k3_max: float = field(
        default=1e-6,
        metadata=_help(
            "Probe self-check: in float32 both paths must agree below this k3; above it the "
            "paths differ for a reason other than precision and the measurement is invalid."
        ),
    )

    def __post_init__(self) -> None:
        _validate_fields(self, "metrics.")
        require_field(self.log_every >= 1, "metrics.log_every", self.log_every, "an integer >= 1")
        require_field(
            self.canary_every >= 0, "metrics.canary_every", self.canary_every, "an integer >= 0"
        )
        require_field(
            0 < self.prob_diff_bad <= 1,
            "metrics.prob_diff_bad",
            self.prob_diff_bad,
            "a number in (0, 1] (a mean gap between two probabilities is at most 1, so a "
            "larger threshold is never reached)",
        )
        require_field(
            0 < self.prob_diff_ok <= self.prob_diff_bad,
            "metrics.prob_diff_ok",
            self.prob_diff_ok,
            f"a number in (0, prob_diff_bad={self.prob_diff_bad}]",
        )
        require_field(
            self.self_check_k3_max > 0,
            "metrics.self_check_k3_max",
            self.self_check_k3_max,
            "a number > 0",
        )


@dataclass(frozen=True)
class OverflowSettings:
    """FP16 overflow safety: headroom margin, runtime detection, and the fp32 fallback."""

    keep_fp32_modules: tuple[str, ...] = field(
        default=(),
        metadata=_help(
            "Module name patterns (fnmatch, as model.named_modules() names them, e.g. "
            "'model.layers.*.mlp.down_proj') that the learner runs in float32 outside fp16 "
            "autocast. The rollout engine cannot follow, so their mismatch remains."
        ),
    )
    detect: Literal["off", "sampled", "always"] = field(
        default="off",
        metadata=_help(
            "Runtime overflow detection in training: 'sampled' checks every detect_every-th "
            "step for the first module whose forward output is inf/NaN, 'always' every step, "
            "'off' only when the loss scaler keeps skipping steps (diagnose_after_skips)."
        ),
    )
    detect_every: int = field(
        default=10, metadata=_help("With detect='sampled': check every N-th optimizer step.")
    )
    diagnose_after_skips: int = field(
        default=3,
        metadata=_help(
            "After this many consecutive skipped steps, check the next step's forward once to "
            "tell a forward overflow (named module) from a gradient overflow; 0 never checks."
        ),
    )
    margin_bits: float = field(
        default=3.0,
        metadata=_help(
            "Headroom analysis flags a module whose largest activation is within 2**margin_bits "
            "of float16's maximum (65504)."
        ),
    )

    def __post_init__(self) -> None:
        _validate_fields(self, "overflow.")
        require_field(
            self.detect_every >= 1, "overflow.detect_every", self.detect_every, "an integer >= 1"
        )
        require_field(
            self.diagnose_after_skips >= 0,
            "overflow.diagnose_after_skips",
            self.diagnose_after_skips,
            "an integer >= 0 (0 turns it off)",
        )
        require_field(
            math.isfinite(self.margin_bits) and 0 <= self.margin_bits <= 16,
            "overflow.margin_bits",
            self.margin_bits,
            "a number in [0, 16] (powers of two below 65504)",
        )


@self_checked
@dataclass(frozen=True)
class PrecisionPolicy:
    """What should run: one dtype on both sides, and how the plugin enforces and checks it.

    Build one directly, with [`from_dict`][precision_plugin.policy.PrecisionPolicy.from_dict], or
    from the ``PRECISION_PLUGIN`` environment variable with
    [`from_env`][precision_plugin.policy.PrecisionPolicy.from_env]. Instances are frozen; use
    [`replace`][precision_plugin.policy.PrecisionPolicy.replace] to derive another.
    """

    dtype: DTypeName = field(
        default="float16",
        metadata=_help(
            "Precision for rollouts and learner alike: float16 (recommended for RL, needs the "
            "loss scaler), bfloat16 (consistent bf16, same checks), or float32."
        ),
    )
    strictness: Literal["warn", "error"] = field(
        default="warn",
        metadata=_help(
            "When a framework is asked for something that contradicts the policy: 'warn' "
            "coerces it to the policy and logs a warning, 'error' refuses with an error."
        ),
    )
    float32_buffers: bool = field(
        default=True,
        metadata=_help(
            "Learner side: where a learner was cast to float16/bfloat16 wholesale (a DeepSpeed "
            "fp16/bf16 engine's module, ZeRO-3 zero.Init included, or the user's model.half() "
            "seen by prepare_model), keep in float32 the buffers vLLM keeps in float32 (RoPE "
            "inverse frequencies, the MoE routing bias e_score_correction_bias), so learner and "
            "rollout compute positions alike. The rollout copies (HFRollout, the probe's HF "
            "engine) always keep them."
        ),
    )
    batch_invariant: Literal["off", "auto", "on"] = field(
        default="off",
        metadata=_help(
            "Rollout engines' batch-invariant mode (precision level 2): 'off' leaves them alone, "
            "'auto' reports what the installed engines could enable and its reported cost "
            "(1.3-2.4x for vLLM), 'on' enables it where the installed version has it (vLLM "
            "VLLM_BATCH_INVARIANT=1 from 0.11.1, SGLang --enable-deterministic-inference) and "
            "reports what it could not enable and why."
        ),
    )
    loss_scaler: LossScalerSettings = field(
        default_factory=LossScalerSettings, metadata=_help("Dynamic loss-scaler settings.")
    )
    vllm: VLLMSettings = field(
        default_factory=VLLMSettings, metadata=_help("Rollout-side (vLLM) settings.")
    )
    metrics: MetricSettings = field(
        default_factory=MetricSettings, metadata=_help("Mismatch metrics and thresholds.")
    )
    overflow: OverflowSettings = field(
        default_factory=OverflowSettings,
        metadata=_help("FP16 overflow safety: headroom, runtime detection, fp32 fallback."),
    )

    def __post_init__(self) -> None:
        _validate_fields(self, "")
        for name, cls in _SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, Mapping):
                object.__setattr__(self, name, _build(cls, value, prefix=f"{name}."))
            elif not isinstance(value, cls):
                raise PrecisionConfigError(
                    f"{name}: expected a {cls.__name__} or a dict, got {type(value).__name__}."
                )

    # -- derived facts ---------------------------------------------------------------------
    @property
    def torch_dtype(self) -> Any:
        """The ``torch.dtype`` of ``dtype``."""
        return torch_dtype(self.dtype)

    @property
    def is_fp16(self) -> bool:
        """True when the policy runs float16."""
        return self.dtype == "float16"

    @property
    def uses_loss_scaler(self) -> bool:
        """True when a dynamic loss scaler belongs in the training step."""
        return self.is_fp16 and self.loss_scaler.enabled

    # -- conversion ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PrecisionPolicy:
        """Build a policy from a (possibly nested) dict; unknown keys are errors."""
        if data is None:
            return cls()
        return _build(cls, data, prefix="")

    def to_dict(self) -> dict[str, Any]:
        """Return the policy as a plain nested dict that
        [`from_dict`][precision_plugin.policy.PrecisionPolicy.from_dict] reads back."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Return the policy as compact JSON (the form ``PRECISION_PLUGIN`` accepts)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def replace(self, **changes: Any) -> PrecisionPolicy:
        """Return a copy with ``changes`` applied (sections may be given as dicts)."""
        merged = self.to_dict()
        for key, value in changes.items():
            if key in _SECTIONS and isinstance(value, Mapping):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        return PrecisionPolicy.from_dict(merged)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PrecisionPolicy | None:
        """Read ``PRECISION_PLUGIN``: a dtype name, ``1``/``true`` (defaults), or a JSON object.

        Returns ``None`` when the variable is unset or says off (``0``, ``false``, ``off``).
        """
        env = os.environ if environ is None else environ
        raw = env.get(ENV_VAR)
        if raw is None or raw.strip().lower() in _ENV_OFF:
            return None
        text = raw.strip()
        if text.lower() in _ENV_DEFAULT:
            return cls()
        data: Any = {"dtype": text}
        if text.startswith("{"):
            try:
                data = parse_json(text)
            except UserJSONError as exc:
                shown = raw if len(raw) <= 60 else raw[:57] + "..."
                raise PrecisionConfigError(f"{ENV_VAR}={shown!r}: {exc}.") from None
            except json.JSONDecodeError as exc:
                raise PrecisionConfigError(
                    f"{ENV_VAR}: {raw!r} looks like JSON but does not parse ({exc.msg} at "
                    f"position {exc.pos}). Use a dtype name such as float16, or a JSON object "
                    f'such as {{"dtype": "float16"}}.'
                ) from None
        try:
            return cls.from_dict(data)
        except PrecisionConfigError as exc:
            raise PrecisionConfigError(f"{ENV_VAR}={raw!r}: {exc}") from None


_SECTIONS: dict[str, type] = {
    "loss_scaler": LossScalerSettings,
    "vllm": VLLMSettings,
    "metrics": MetricSettings,
    "overflow": OverflowSettings,
}

_T = TypeVar("_T")


def _build(cls: type[_T], data: Mapping[str, Any], prefix: str) -> _T:
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f" Did you mean {prefix + close[0]!r}?" if close else ""
            raise PrecisionConfigError(
                f"{prefix}{key}: unknown key in the precision policy.{hint} Known keys: "
                f"{', '.join(prefix + k for k in known)}."
            )
        if key in _SECTIONS and cls is PrecisionPolicy:
            if isinstance(value, _SECTIONS[key]):
                kwargs[key] = value
                continue
            if not isinstance(value, Mapping):
                raise PrecisionConfigError(
                    f"{key}: expected a section (a dict of settings), got {value!r}."
                )
            kwargs[key] = _build(_SECTIONS[key], value, prefix=f"{key}.")
        else:
            kwargs[key] = value
    return cls(**kwargs)


def _validate_fields(obj: Any, prefix: str) -> None:
    """Type-check every scalar field of a frozen settings object in place."""
    for f in dataclasses.fields(obj):
        if f.name in _SECTIONS and isinstance(obj, PrecisionPolicy):
            continue
        value, where = getattr(obj, f.name), f"{prefix}{f.name}"
        if f.name == "dtype":  # the one dtype vocabulary: aliases, and its own message
            checked = normalize_dtype(value, field_name=where)
        else:
            checked = check_field(value, typing.get_type_hints(type(obj))[f.name], where)
        object.__setattr__(obj, f.name, checked)


def field_help(cls: type = PrecisionPolicy, prefix: str = "") -> list[tuple[str, Any, str]]:
    """Return ``(dotted name, default, help)`` for every field, sections expanded (for docs/CLI)."""
    rows: list[tuple[str, Any, str]] = []
    for f in dataclasses.fields(cls):
        if f.name in _SECTIONS and cls is PrecisionPolicy:
            rows.extend(field_help(_SECTIONS[f.name], prefix=f"{f.name}."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        rows.append((prefix + f.name, default, f.metadata.get("help", "")))
    return rows


def _build_policy(value: Any) -> PrecisionPolicy:
    if isinstance(value, PrecisionPolicy):
        return value
    if isinstance(value, Mapping):
        return PrecisionPolicy.from_dict(value)
    return PrecisionPolicy(dtype=value)


def _field_value(path: str, value: Any) -> Any:
    section, _, name = path.rpartition(".")
    data: dict[str, Any] = {name: value}
    policy = PrecisionPolicy.from_dict({section: data} if section else data)
    return getattr(getattr(policy, section) if section else policy, name)


# The checker builds every parameter typed ``PrecisionPolicy`` (and checks ``policy_field``s)
# through these: registered here so the checker never imports the policy.
register_coercion("policy", Coercion(PrecisionPolicy, _build_policy, _field_value))
