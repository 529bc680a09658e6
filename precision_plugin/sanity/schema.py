"""The sanity benchmark's configuration and results, and their JSON form."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import normalize_dtype
from precision_plugin.sanity.model import MODEL_SIZES

#: Version of the JSON layout; bump when a field changes meaning.
SCHEMA_VERSION = 1
DEFAULT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
ENGINES: tuple[str, ...] = ("hf", "vllm")
#: Per-step fields, each read from the trainer's log history (None when it did not log it).
STEP_FIELDS: tuple[str, ...] = (
    "step", "reward", "accuracy", "k3_kl", "prob_diff_max", "loss_scale", "skipped_steps",
)  # fmt: skip
#: Per-dtype summary fields.
SUMMARY_FIELDS: tuple[str, ...] = (
    "mean_k3_kl", "max_prob_diff_max", "first_accuracy", "peak_accuracy", "final_accuracy",
    "final_loss_scale", "skipped_steps", "nan_values", "seconds",
)  # fmt: skip


@dataclass(frozen=True)
class SanityConfig:
    """What to run: GRPO steps per dtype, seed, dtypes, model size, engine and batch shape.

    ``smoke`` shrinks the run to a CI-sized check (tiny model, few steps).
    """

    steps: int = 60
    seed: int = 0
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    model_size: str = "small"
    engine: str = "hf"
    smoke: bool = False
    num_problems: int = 64
    prompts_per_step: int = 4
    num_generations: int = 8
    learning_rate: float = 2e-4
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.dtypes, str):
            raise PrecisionConfigError(
                f"dtypes: expected a sequence of dtype names, got the string {self.dtypes!r}; "
                f"pass e.g. ('float16', 'bfloat16')."
            )
        names = tuple(dict.fromkeys(normalize_dtype(d, field_name="dtypes") for d in self.dtypes))
        if not names:
            raise PrecisionConfigError("dtypes: empty; pass at least one of float16, bfloat16.")
        object.__setattr__(self, "dtypes", names)
        for name in ("steps", "num_problems", "prompts_per_step", "num_generations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PrecisionConfigError(
                    f"{name.replace('_', '-')}: {value!r} is not a positive integer; pass >= 1."
                )
        if self.num_generations < 2:
            raise PrecisionConfigError(
                f"num-generations: {self.num_generations}; GRPO needs at least 2 per prompt."
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise PrecisionConfigError(f"seed: {self.seed!r} is not an integer >= 0; pass e.g. 0.")
        if self.model_size not in MODEL_SIZES:
            raise PrecisionConfigError(
                f"model-size: {self.model_size!r} is not a sanity model size; use one of "
                f"{', '.join(MODEL_SIZES)}."
            )
        if self.engine not in ENGINES:
            raise PrecisionConfigError(
                f"engine: {self.engine!r} is not a sanity engine; use one of {', '.join(ENGINES)}."
            )


@dataclass
class StepRecord:
    """One GRPO step of one dtype, as the trainer logged it (``precision/*`` from the plugin)."""

    step: int
    reward: float | None
    accuracy: float | None
    k3_kl: float | None
    prob_diff_max: float | None
    loss_scale: float | None
    skipped_steps: float | None


@dataclass
class DtypeRun:
    """Every step of one dtype and a summary of them."""

    dtype: str
    steps: list[StepRecord]
    seconds: float
    summary: dict[str, Any] = field(default_factory=dict)
    #: What ran, from ``PrecisionCallback.audit()``: ``consistent``, ``learner_forward_dtype``,
    #: ``rollout_dtype``, ``rollout_engine``.
    ran: dict[str, Any] = field(default_factory=dict)

    def summarize(self) -> dict[str, Any]:
        """Fill and return ``summary`` (means over logged steps; NaN/inf values counted)."""
        k3 = [s.k3_kl for s in self.steps if _finite(s.k3_kl)]
        diff = [s.prob_diff_max for s in self.steps if _finite(s.prob_diff_max)]
        acc = [s.accuracy for s in self.steps if _finite(s.accuracy)]
        values = [getattr(s, f) for s in self.steps for f in STEP_FIELDS if f != "step"]
        last = self.steps[-1] if self.steps else None
        self.summary = {
            "mean_k3_kl": sum(k3) / len(k3) if k3 else None,
            "max_prob_diff_max": max(diff) if diff else None,
            "first_accuracy": acc[0] if acc else None,
            "peak_accuracy": max(acc) if acc else None,
            "final_accuracy": sum(acc[-5:]) / len(acc[-5:]) if acc else None,
            "final_loss_scale": last.loss_scale if last else None,
            "skipped_steps": last.skipped_steps if last else None,
            "nan_values": sum(v is not None and not math.isfinite(v) for v in values),
            "seconds": self.seconds,
        }
        return self.summary


@dataclass
class SanityResult:
    """The whole benchmark: config, pretraining, one run per dtype, and the headline ratio."""

    config: SanityConfig
    pretrain: dict[str, Any]
    model: dict[str, Any]
    runs: dict[str, DtypeRun]
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def k3_ratio_bf16_over_fp16(self) -> float | None:
        """Mean k3 of bfloat16 over float16's: the headline (None unless both ran)."""
        bf16, fp16 = (self.runs.get(d) for d in ("bfloat16", "float16"))
        if bf16 is None or fp16 is None:
            return None
        a, b = bf16.summary.get("mean_k3_kl"), fp16.summary.get("mean_k3_kl")
        return a / b if a is not None and b else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (see ``STEP_FIELDS``/``SUMMARY_FIELDS``)."""
        config = asdict(self.config)
        config["dtypes"] = list(self.config.dtypes)
        return {
            "schema_version": SCHEMA_VERSION,
            "benchmark": "sanity",
            "config": config,
            "model": self.model,
            "pretrain": self.pretrain,
            "environment": self.environment,
            "runs": {
                d: {
                    "dtype": r.dtype,
                    "ran": r.ran,
                    "summary": r.summary or r.summarize(),
                    "steps": [asdict(s) for s in r.steps],
                }
                for d, r in self.runs.items()
            },
            "k3_ratio_bf16_over_fp16": self.k3_ratio_bf16_over_fp16,
        }

    def to_json(self) -> str:
        """JSON text; NaN/inf become ``null`` so any JSON reader accepts it."""
        return json.dumps(_json_safe(self.to_dict()), indent=2)


def missing_fields(data: dict[str, Any]) -> list[str]:
    """Names of the fields a sanity JSON document lacks (empty when complete)."""
    missing = [
        k for k in ("schema_version", "config", "model", "pretrain", "runs") if k not in data
    ]
    missing += [] if "k3_ratio_bf16_over_fp16" in data else ["k3_ratio_bf16_over_fp16"]
    for dtype, run in data.get("runs", {}).items():
        missing += [] if "ran" in run else [f"runs.{dtype}.ran"]
        missing += [f"runs.{dtype}.summary.{f}" for f in SUMMARY_FIELDS if f not in run["summary"]]
        if not run.get("steps"):
            missing.append(f"runs.{dtype}.steps")
        for i, step in enumerate(run.get("steps", [])):
            missing += [f"runs.{dtype}.steps[{i}].{f}" for f in STEP_FIELDS if f not in step]
    return missing


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
