"""The sanity benchmark's configuration, presets and results, and their JSON form."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from precision_plugin._base.boundary import checked, non_empty, positive
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import normalize_dtype
from precision_plugin.sanity.fields import (  # noqa: F401 (the schema's public names)
    COLLAPSE_DROP,
    CONSEQUENCE_FIELDS,
    DEFAULT_DTYPES,
    ENGINES,
    PRESETS,
    SCHEMA_VERSION,
    STEP_FIELDS,
    SUMMARY_FIELDS,
)
from precision_plugin.sanity.model import MODEL_SIZES
from precision_plugin.sanity.task import REVERSE, SHIFT, Task

#: What ``--smoke`` changes on top of each preset: a CI-sized run of the same code path.
SMOKE: dict[str, dict[str, Any]] = {
    "default": {"steps": 6, "model_size": "tiny", "pretrain_target": 0.2,
                "pretrain_max_steps": 400},
    "long": {"steps": 3, "seeds": (0,), "model_size": "tiny", "pretrain_target": 0.2,
             "pretrain_max_steps": 400, "num_problems": 16},
}  # fmt: skip
#: The largest seed: transformers' ``set_seed`` (GRPOTrainer's) seeds numpy, which takes 32 bits.
MAX_SEED = 2**32 - 1
#: Largest step, problem or batch count: a million GRPO steps on CPU is months; 10**23 steps
#: were accepted and ran until stopped.
MAX_COUNT = 1_000_000
#: The task of each preset.
TASKS: dict[str, Task] = {"default": REVERSE, "long": SHIFT}


@checked(
    learning_rate=positive("the optimizer's step size"),
    pretrain_learning_rate=positive("the optimizer's step size"),
    temperature=positive("GRPO divides the logits by it"),
)
@dataclass(frozen=True)
class SanityConfig:
    """What to run: the preset (its task), GRPO steps per dtype, seeds, dtypes, model size,
    engine, batch shape, learning rates, pretraining target and the gradient-cosine readout.

    Every seed pretrains its own model; within a seed every dtype starts from those weights and
    samples with the same seeds (paired). ``smoke`` marks a CI-sized run.
    """

    preset: str = "default"
    steps: int = 60
    seeds: tuple[int, ...] = (0,)
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    model_size: str = "small"
    engine: str = "hf"
    smoke: bool = False
    num_problems: int = 64
    prompts_per_step: int = 4
    num_generations: int = 8
    learning_rate: float = 2e-4
    temperature: float = 1.0
    loss_type: str = "dapo"
    grad_cosine: bool = False
    pretrain_target: float = 0.4
    pretrain_max_steps: int = 1500
    pretrain_learning_rate: float = 3e-3
    pretrain_batch_size: int = 64

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise PrecisionConfigError(
                f"preset: {self.preset!r} is not a sanity preset; use one of {', '.join(PRESETS)}."
            )
        for name in ("dtypes", "seeds"):
            if isinstance(getattr(self, name), str):
                raise PrecisionConfigError(
                    f"{name}: expected a sequence, got the string {getattr(self, name)!r}; pass "
                    f"e.g. {('float16', 'bfloat16') if name == 'dtypes' else (0, 1, 2)}."
                )
        names = tuple(dict.fromkeys(normalize_dtype(d, field_name="dtypes") for d in self.dtypes))
        if not names:
            raise PrecisionConfigError("dtypes: empty; pass at least one of float16, bfloat16.")
        object.__setattr__(self, "dtypes", names)
        seeds = tuple(self.seeds)
        if (
            not seeds
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
            or len(set(seeds)) != len(seeds)
        ):
            raise PrecisionConfigError(
                f"seeds: {self.seeds!r}; pass distinct integers >= 0, e.g. (0, 1, 2)."
            )
        if max(seeds) > MAX_SEED:
            raise PrecisionConfigError(
                f"seeds: {max(seeds)} is out of range; pass seeds 0 .. {MAX_SEED} (the trainer's "
                f"set_seed also seeds numpy, which takes 32 bits)."
            )
        object.__setattr__(self, "seeds", seeds)
        for name in ("steps", "num_problems", "prompts_per_step", "num_generations",
                     "pretrain_max_steps", "pretrain_batch_size"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PrecisionConfigError(
                    f"{name.replace('_', '-')}: {value!r} is not a positive integer; pass >= 1."
                )
            if value > MAX_COUNT:
                raise PrecisionConfigError(
                    f"{name.replace('_', '-')}: {value} is out of range; pass 1 .. {MAX_COUNT} "
                    f"(default {getattr(SanityConfig, name)})."
                )
        if self.num_generations < 2:
            raise PrecisionConfigError(
                f"num-generations: {self.num_generations}; GRPO needs at least 2 per prompt."
            )
        for name in ("learning_rate", "pretrain_learning_rate", "temperature"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise PrecisionConfigError(
                    f"{name.replace('_', '-')}: {value!r} is not a number > 0."
                )
        if not 0 < self.pretrain_target <= 1:
            raise PrecisionConfigError(
                f"pretrain-target: {self.pretrain_target!r}; pass a sampled accuracy in (0, 1]."
            )
        if self.model_size not in MODEL_SIZES:
            raise PrecisionConfigError(
                f"model-size: {self.model_size!r} is not a sanity model size; use one of "
                f"{', '.join(MODEL_SIZES)}."
            )
        if self.engine not in ENGINES:
            raise PrecisionConfigError(
                f"engine: {self.engine!r} is not a sanity engine; use one of {', '.join(ENGINES)}."
            )
        from precision_plugin.sanity.mechanism import LOSS_TYPES

        if self.loss_type not in LOSS_TYPES:
            raise PrecisionConfigError(
                f"loss-type: {self.loss_type!r}; the sanity runs use one of "
                f"{', '.join(LOSS_TYPES)}."
            )

    @property
    def task(self) -> Task:
        """The preset's task."""
        return TASKS[self.preset]

    @property
    def window(self) -> int:
        """Steps in an accuracy window: a sixth of the run (50 of 300, 10 of 60), at least 1."""
        return max(1, self.steps // 6)


@checked(preset=non_empty("a preset name such as 'default'"))
def preset_config(preset: str = "default", smoke: bool = False, **overrides: Any) -> SanityConfig:
    """The configuration of ``preset`` (its smoke variant with ``smoke``), then ``overrides``.

    Overrides whose value is ``None`` are ignored (an option the user did not give).
    """
    if preset not in PRESETS:
        SanityConfig(preset=preset)  # raises the one clear error
    known = {f.name for f in fields(SanityConfig)}
    unknown = set(overrides) - known
    if unknown:
        raise PrecisionConfigError(
            f"sanity: unknown settings {sorted(unknown)}; known: {sorted(known)}."
        )
    settings = {**PRESETS[preset], **(SMOKE[preset] if smoke else {})}
    settings |= {k: v for k, v in overrides.items() if v is not None}
    return SanityConfig(preset=preset, smoke=smoke, **settings)


@checked
@dataclass
class StepRecord:
    """One GRPO step of one dtype, as the trainer logged it (``precision/*`` from the plugin,
    ``sanity/*`` from the gradient-cosine readout; None where nothing was logged).

    ``telemetry`` holds every other ``precision/*`` metric the telemetry logged that step
    (``k1_kl``, token counts and, where the telemetry has them, consequence metrics such as the
    effective sample size and masked fractions), keyed without the prefix.
    """

    step: int
    reward: float | None
    accuracy: float | None
    k3_kl: float | None
    prob_diff_max: float | None
    loss_scale: float | None
    skipped_steps: float | None
    grad_cosine: float | None = None
    seq_log_ratio_abs: float | None = None
    telemetry: dict[str, float | None] = field(default_factory=dict)


@checked
@dataclass
class DtypeRun:
    """Every step of one dtype (one seed) and a summary of them."""

    dtype: str
    steps: list[StepRecord]
    seconds: float
    cpu_seconds: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)
    #: What ran, from ``PrecisionCallback.audit()``: ``consistent``, ``learner_forward_dtype``,
    #: ``rollout_dtype``, ``rollout_engine``.
    ran: dict[str, Any] = field(default_factory=dict)

    def summarize(self, window: int) -> dict[str, Any]:
        """Fill and return ``summary``: accuracy over the first, best and last ``window`` steps,
        a collapse flag (final window ``COLLAPSE_DROP`` below the best), means over the logged
        steps (NaN/inf left out and counted) and the run's wall and CPU seconds."""
        acc = [s.accuracy for s in self.steps if _finite(s.accuracy)]
        k3 = [s.k3_kl for s in self.steps if _finite(s.k3_kl)]
        diff = [s.prob_diff_max for s in self.steps if _finite(s.prob_diff_max)]
        cos = [s.grad_cosine for s in self.steps if _finite(s.grad_cosine)]
        ratio = [s.seq_log_ratio_abs for s in self.steps if _finite(s.seq_log_ratio_abs)]
        values = [
            getattr(s, f) for s in self.steps for f in STEP_FIELDS if f not in ("step", "telemetry")
        ]
        last = self.steps[-1] if self.steps else None
        w = max(1, min(window, len(acc)))
        windows = [_mean(acc[i : i + w]) for i in range(len(acc) - w + 1)]
        first = windows[0] if windows else None
        peak = max(windows) if windows else None
        final = windows[-1] if windows else None
        self.summary = {
            "window": w,
            "first_accuracy": first,
            "peak_accuracy": peak,
            "final_accuracy": final,
            "collapsed": bool(windows) and final <= peak - COLLAPSE_DROP,  # type: ignore[operator]
            "mean_k3_kl": _mean(k3),
            "max_prob_diff_max": max(diff) if diff else None,
            "mean_grad_cosine": _mean(cos),
            "min_grad_cosine": min(cos) if cos else None,
            "mean_seq_log_ratio_abs": _mean(ratio),
            **consequence_summary(s.telemetry for s in self.steps),
            "final_loss_scale": last.loss_scale if last else None,
            "skipped_steps": last.skipped_steps if last else None,
            "nan_values": sum(v is not None and not math.isfinite(v) for v in values),
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
        }
        return self.summary

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form."""
        return {
            "dtype": self.dtype,
            "ran": self.ran,
            "summary": self.summary,
            "steps": [asdict(s) for s in self.steps],
        }


@checked
@dataclass
class SeedRun:
    """One seed: its pretraining and one run per dtype from the same pretrained weights."""

    seed: int
    pretrain: dict[str, Any]
    runs: dict[str, DtypeRun]

    @property
    def k3_ratio_bf16_over_fp16(self) -> float | None:
        """Mean k3 of bfloat16 over float16's in this seed (None unless both ran)."""
        bf16, fp16 = (self.runs.get(d) for d in ("bfloat16", "float16"))
        if bf16 is None or fp16 is None:
            return None
        a, b = bf16.summary.get("mean_k3_kl"), fp16.summary.get("mean_k3_kl")
        return a / b if a is not None and b else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form."""
        return {
            "seed": self.seed,
            "pretrain": self.pretrain,
            "runs": {d: r.to_dict() for d, r in self.runs.items()},
            "k3_ratio_bf16_over_fp16": self.k3_ratio_bf16_over_fp16,
        }


@checked
@dataclass
class SanityResult:
    """The whole benchmark: config, one [`SeedRun`][precision_plugin.sanity.SeedRun] per seed,
    and their aggregate over seeds (mean, spread, the pre-registered verdict)."""

    config: SanityConfig
    model: dict[str, Any]
    seeds: list[SeedRun]
    environment: dict[str, Any] = field(default_factory=dict)

    def aggregate(self) -> dict[str, Any]:
        """Mean and spread over seeds (see [`aggregate`][precision_plugin.sanity.aggregate])."""
        from precision_plugin.sanity.aggregate import aggregate

        return aggregate(self)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (see ``STEP_FIELDS``/``SUMMARY_FIELDS``)."""
        config = asdict(self.config)
        config["dtypes"] = list(self.config.dtypes)
        config["seeds"] = list(self.config.seeds)
        config["window"] = self.config.window
        return {
            "schema_version": SCHEMA_VERSION,
            "benchmark": "sanity",
            "config": config,
            "task": task_description(self.config.task),
            "model": self.model,
            "environment": self.environment,
            "seeds": [s.to_dict() for s in self.seeds],
            **self.aggregate(),
        }

    def to_json(self) -> str:
        """JSON text; NaN/inf become ``null`` so any JSON reader accepts it."""
        return json.dumps(_json_safe(self.to_dict()), indent=2)


def task_description(task: Task) -> dict[str, Any]:
    """The task as JSON: its class, settings and token budgets."""
    return {
        "name": type(task).__name__,
        **asdict(task),
        "max_prompt_tokens": task.max_prompt_tokens,
        "max_completion_tokens": task.max_completion_tokens,
        "ends_with_eos": task.ends_with_eos,
    }


@checked
def missing_fields(data: dict[str, Any]) -> list[str]:
    """Names of the fields a sanity JSON document lacks (empty when complete)."""
    top = ("schema_version", "config", "task", "model", "seeds", "aggregate",
           "k3_ratio_bf16_over_fp16", "verdict", "timing")  # fmt: skip
    missing = [k for k in top if k not in data]
    for i, seed in enumerate(data.get("seeds", [])):
        where = f"seeds[{i}]"
        missing += [f"{where}.{k}" for k in ("seed", "pretrain", "runs") if k not in seed]
        for dtype, run in seed.get("runs", {}).items():
            missing += [] if "ran" in run else [f"{where}.runs.{dtype}.ran"]
            summary = run.get("summary", {})
            missing += [f"{where}.runs.{dtype}.summary.{f}" for f in SUMMARY_FIELDS
                        if f not in summary]  # fmt: skip
            if not run.get("steps"):
                missing.append(f"{where}.runs.{dtype}.steps")
            for j, step in enumerate(run.get("steps", [])):
                missing += [f"{where}.runs.{dtype}.steps[{j}].{f}" for f in STEP_FIELDS
                            if f not in step]  # fmt: skip
    return missing


def consequence_summary(telemetry: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """``CONSEQUENCE_FIELDS`` of a run from its steps' ``telemetry`` (a ``StepRecord``'s or a
    results file's): the mean of each consequence metric over the steps that logged it (NaN,
    inf and missing left out), and the smallest effective sample size; None where no step
    logged it (a results file written before the telemetry had them)."""
    rows = [t for t in telemetry if t]

    def values(key: str) -> list[float]:
        return [float(t[key]) for t in rows if _finite(t.get(key))]

    ess = values("ess")
    return {
        "mean_ess": _mean(ess),
        "min_ess": min(ess) if ess else None,
        "mean_seq_mask_fraction_trl": _mean(values("seq_mask_fraction_trl")),
        "mean_seq_mask_fraction_verl": _mean(values("seq_mask_fraction_verl")),
        "mean_tis_clip_fraction": _mean(values("tis_clip_fraction")),
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


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
