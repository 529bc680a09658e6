"""The probe's configuration and results: what was asked, what each dtype measured, the
self-check, and the JSON form of it all."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._core.decision import MAX_NUM_PROMPTS  # one limit: the decision quotes it
from precision_plugin._core.hf_engine import RolloutEngine
from precision_plugin._core.metrics.mismatch import MismatchMetrics
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import MetricSettings, OverflowSettings, normalize_dtype
from precision_plugin.probe.attribution.settings import AttributionSettings
from precision_plugin.probe.inputs import Prompt
from precision_plugin.probe.length import LengthEffect, length_effect

log = logging.getLogger("precision_plugin")

DEFAULT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
DEFAULT_NUM_PROMPTS = 16
DEFAULT_MAX_NEW_TOKENS = 256
DEFAULT_SEED = 0
#: Completion length the consequence section projects to unless --target-length says otherwise.
DEFAULT_TARGET_LENGTH = 4096
#: Sequences per batch the consequence section gives the ESS for unless --batch-size says so:
#: of the order of a TRL generation batch (per-device batch × processes × num_generations) or a
#: verl mini-batch; the JSON also reports 64, 256 and 1,024 (advice.REPORTED_BATCHES).
DEFAULT_BATCH_SIZE = 256
#: The dtype whose run is the self-check (always run, first).
SELF_CHECK_DTYPE = "float32"

EngineFactory = Callable[[str, str, str, int], RolloutEngine]


#: Largest seed every rollout engine accepts (vLLM seeds numpy: 32 bits).
MAX_SEED = 2**32 - 1
#: Largest --target-length: beyond any model's context (a projection there means nothing).
MAX_TARGET_LENGTH = 10_000_000
#: Largest --batch-size: beyond any RL batch (the ESS is computed over a batch this long).
MAX_BATCH_SIZE = 1_000_000


@checked
@dataclass(frozen=True)
class ProbeConfig:
    """What to probe: model, engine, dtypes, and how many tokens to sample.

    ``model`` is a local HF checkpoint folder, or ``None`` for the embedded default model.
    ``device`` is a torch device string or ``"auto"`` (CUDA when available, else CPU).
    ``prompts`` are the user's prompts (text, or chat message lists rendered with the
    tokenizer's chat template), each used at its own length; ``None`` uses the built-in prompts,
    cut to one common length. Either way they are cycled to ``num_prompts`` completions.
    ``min_new_tokens`` suppresses EOS until a completion has that many tokens, so random or weak
    models still produce long sequences for the length fit. ``target_length`` is the completion
    length the consequence section projects to (the length you train at); ``layerwise`` adds
    the layer-by-layer replay of the longest sample per dtype; ``batch_size`` is the number of
    sequences per batch the effective sample size is given for (a TRL generation batch or GRPO
    group, a verl mini-batch).
    """

    model: str | os.PathLike[str] | None = None
    engine: str = "hf"
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    num_prompts: int = DEFAULT_NUM_PROMPTS
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int = DEFAULT_SEED
    device: str = "auto"
    metrics: MetricSettings = field(default_factory=MetricSettings)
    overflow: OverflowSettings = field(default_factory=OverflowSettings)
    prompts: tuple[Prompt, ...] | None = None
    min_new_tokens: int = 0
    target_length: int = DEFAULT_TARGET_LENGTH
    layerwise: bool = False
    batch_size: int = DEFAULT_BATCH_SIZE
    #: ``probe --attribute``: the rollout settings to attribute (``None``: no attribution).
    attribution: AttributionSettings | None = None

    def __post_init__(self) -> None:
        names = [normalize_dtype(d, field_name="dtypes") for d in self.dtypes]
        if not names:
            raise PrecisionConfigError(
                "dtypes: empty; pass at least one of float32, float16, bfloat16."
            )
        ordered = [SELF_CHECK_DTYPE] + [d for d in dict.fromkeys(names) if d != SELF_CHECK_DTYPE]
        object.__setattr__(self, "dtypes", tuple(ordered))
        if self.layerwise and len(ordered) == 1:
            raise PrecisionConfigError(
                "layerwise: replays each low-precision dtype against float32, and dtypes holds "
                "float32 alone, so there is nothing to replay; add float16 or bfloat16 to "
                "--dtypes, or leave out --layerwise."
            )
        for name in ("num_prompts", "max_new_tokens", "target_length", "batch_size"):
            value = getattr(self, name)
            if value < 1:
                raise PrecisionConfigError(
                    f"{name.replace('_', '-')}: {value!r} is not a positive integer; "
                    f"pass a whole number >= 1 (default {globals()['DEFAULT_' + name.upper()]})."
                )
        if self.seed < 0:
            raise PrecisionConfigError(
                f"seed: {self.seed!r} is not a non-negative integer; pass e.g. 0."
            )
        if self.seed > MAX_SEED:
            raise PrecisionConfigError(
                f"seed: {self.seed} is out of range; pass 0 .. {MAX_SEED} (torch takes 64-bit "
                f"seeds, but vLLM also seeds numpy, which takes 32 bits)."
            )
        if self.num_prompts > MAX_NUM_PROMPTS:
            raise PrecisionConfigError(
                f"num-prompts: {self.num_prompts} is out of range; pass 1 .. {MAX_NUM_PROMPTS} "
                f"(each prompt is a full rollout and trainer forward per dtype)."
            )
        if self.target_length > MAX_TARGET_LENGTH:
            raise PrecisionConfigError(
                f"target-length: {self.target_length} is out of range; pass 1 .. "
                f"{MAX_TARGET_LENGTH}, the completion length you train at (default "
                f"{DEFAULT_TARGET_LENGTH})."
            )
        if self.batch_size > MAX_BATCH_SIZE:
            raise PrecisionConfigError(
                f"batch-size: {self.batch_size} is out of range; pass 1 .. {MAX_BATCH_SIZE}, the "
                f"sequences per batch you train with (default {DEFAULT_BATCH_SIZE})."
            )
        low = self.min_new_tokens
        if not 0 <= low <= self.max_new_tokens:
            raise PrecisionConfigError(
                f"min-new-tokens: {low!r} is not a whole number between 0 and max-new-tokens "
                f"({self.max_new_tokens}); pass e.g. {self.max_new_tokens} to suppress EOS for the "
                f"whole generation, or 0 (default) to let completions end at EOS."
            )
        if not isinstance(self.layerwise, bool):
            raise PrecisionConfigError(
                f"layerwise: expected True or False, got {self.layerwise!r}."
            )
        if self.prompts is not None:
            if not self.prompts:
                raise PrecisionConfigError(
                    f"prompts: expected a non-empty sequence of prompts, got {self.prompts!r}; "
                    f"pass e.g. ('Hello',) or None for the built-in prompts."
                )
            object.__setattr__(self, "prompts", tuple(self.prompts))


@checked
@dataclass
class DtypeResult:
    """The measurement for one dtype: metrics, verdict and the raw token log-probs."""

    dtype: str
    metrics: MismatchMetrics
    verdict: str
    reason: str
    train_logprobs: list[list[float]]
    rollout_logprobs: list[list[float]]
    seconds: float
    #: The sampled completions (token ids and the engine's log-probs): not in the JSON.
    samples: list[Any] = field(default_factory=list, repr=False)

    def length_effect(self) -> LengthEffect:
        """The sequence log-ratio against completion length: buckets, the drift per 1K tokens."""
        return length_effect(self.train_logprobs, self.rollout_logprobs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: every scalar metric, the verdict, the per-sequence sums and the
        length effect (``length_effect``: buckets, the drift per 1K tokens and the slope)."""
        out: dict[str, Any] = dict(self.metrics.to_dict())
        out["seq_kl"] = self.metrics.seq_kl
        out["seq_log_ratio"] = list(self.metrics.seq_log_ratio)
        out["seq_lengths"] = list(self.metrics.seq_lengths)
        out["seq_k3"] = sequence_k3(self.train_logprobs, self.rollout_logprobs)
        interval = k3_interval(out["seq_k3"], out["seq_lengths"])
        out["k3_interval"] = list(interval) if interval is not None else None
        out["length_effect"] = self.length_effect().to_dict()
        out["verdict"] = self.verdict
        out["verdict_reason"] = self.reason
        out["seconds"] = round(self.seconds, 3)
        return out


def sequence_k3(train: list[list[float]], rollout: list[list[float]]) -> list[float]:
    """Each sequence's sum of k3 terms (``e^d - 1 - d``, ``d`` = train - rollout log-prob) over
    its finite tokens: the per-sequence parts of ``k3_kl``, for intervals over sequences."""
    from precision_plugin._core.metrics.k3 import k3_term

    out = []
    for t_row, r_row in zip(train, rollout, strict=True):
        pairs = zip(t_row, r_row, strict=True)
        out.append(sum(k3_term(t - r) for t, r in pairs if math.isfinite(t - r)))
    return out


#: Resamples and seed of the k3 interval's bootstrap (fixed: the same file gives the same one).
K3_RESAMPLES, K3_SEED = 2000, 0


def k3_interval(seq_k3: list[float], lengths: list[int]) -> tuple[float, float] | None:
    """The ``COVERAGE`` (90 %) percentile-bootstrap interval of the per-token k3, resampling whole
    sequences (a sequence's tokens are not independent); ``None`` from fewer than 2 sequences
    with tokens or a non-finite part."""
    import random

    from precision_plugin._core.intervals import COVERAGE

    kept = [(k, n) for k, n in zip(seq_k3, lengths, strict=True) if n > 0]
    if len(kept) < 2 or not all(math.isfinite(k) for k, _ in kept):
        return None
    rng = random.Random(K3_SEED)
    draws = []
    for _ in range(K3_RESAMPLES):
        sample = [kept[rng.randrange(len(kept))] for _ in kept]
        draws.append(sum(k for k, _ in sample) / sum(n for _, n in sample))
    draws.sort()
    tail = (1 - COVERAGE) / 2
    return (draws[int(tail * (K3_RESAMPLES - 1))], draws[int((1 - tail) * (K3_RESAMPLES - 1))])


@checked
@dataclass
class SelfCheck:
    """Whether the float32 run agrees to the floor, i.e. whether the measurement is valid."""

    passed: bool
    k3_kl: float
    threshold: float
    message: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "dtype": SELF_CHECK_DTYPE,
            "passed": self.passed,
            "k3_kl": self.k3_kl,
            "threshold": self.threshold,
            "message": self.message,
        }


@checked
@dataclass
class ProbeResult:
    """Everything the probe measured; [`to_dict`][precision_plugin.probe.ProbeResult.to_dict] is the
    stable JSON schema."""

    model: str
    engine: str
    device: str
    config: ProbeConfig
    results: dict[str, DtypeResult]
    self_check: SelfCheck
    seconds: float = 0.0
    #: float16 headroom on the probe prompts and the model_type findings
    #: (:class:`precision_plugin.probe.overflow.OverflowCheck`); ``None`` when not measured.
    overflow: Any = None
    #: Facts about the model worth knowing next to the numbers (e.g. vLLM refuses its float16).
    notes: list[str] = field(default_factory=list)
    #: What the mismatch does at the target length and what to do
    #: (:class:`precision_plugin.probe.advice.ConsequenceReport`); ``None`` when not assessed.
    consequence: Any = None
    #: Where the two sides part (:class:`precision_plugin.probe.layerwise.LayerwiseReport`);
    #: ``None`` without ``layerwise``.
    layerwise: Any = None
    #: Each cause's share (:class:`precision_plugin.probe.attribution.AttributionReport`);
    #: ``None`` without ``attribution``.
    attribution: Any = None
    #: The process's peak resident memory at the end of the run, in MiB (``None`` where the
    #: platform does not say).
    peak_rss_mb: float | None = None
    #: The rollout as configured (``--rollout``), per dtype, and its settings in words; empty
    #: with the default rollout (``results`` is that one).
    configured: dict[str, DtypeResult] = field(default_factory=dict)
    configured_settings: str = ""

    @property
    def valid(self) -> bool:
        """True when the float32 self-check passed."""
        return self.self_check.passed

    def k3_ratio(self, dtype: str, reference: str = "float16") -> float:
        """``k3_kl`` of ``dtype`` divided by that of ``reference`` (NaN when either is missing)."""
        a, b = self.results.get(dtype), self.results.get(reference)
        if a is None or b is None or not b.metrics.k3_kl > 0:
            return math.nan
        return a.metrics.k3_kl / b.metrics.k3_kl

    def to_dict(self) -> dict[str, Any]:
        """``{"model", "engine", "device", "results": {dtype: {...}}, ...}`` (JSON-safe)."""
        data: dict[str, Any] = {
            "model": self.model,
            "engine": self.engine,
            "device": self.device,
            "results": {name: r.to_dict() for name, r in self.results.items()},
            "self_check": self.self_check.to_dict(),
            "bf16_over_fp16_k3": self.k3_ratio("bfloat16", "float16"),
            "settings": {
                "dtypes": list(self.config.dtypes),
                "num_prompts": self.config.num_prompts,
                "max_new_tokens": self.config.max_new_tokens,
                "min_new_tokens": self.config.min_new_tokens,
                "prompts": "built-in" if self.config.prompts is None else "user",
                "seed": self.config.seed,
                "target_length": self.config.target_length,
                "batch_size": self.config.batch_size,
                "layerwise": self.config.layerwise,
                "attribute": self.config.attribution is not None,
            },
            "seconds": round(self.seconds, 3),
            "peak_rss_mb": self.peak_rss_mb,
            "notes": list(self.notes),
        }
        if self.overflow is not None:
            data["headroom"] = self.overflow.to_dict()
        if self.consequence is not None:
            data["consequence"] = self.consequence.to_dict()
        if self.layerwise is not None:
            data["layerwise"] = self.layerwise.to_dict()
        if self.attribution is not None:
            data["attribution"] = self.attribution.to_dict()
        if self.configured:
            data["configured"] = {
                "settings": self.configured_settings,
                "results": {name: r.to_dict() for name, r in self.configured.items()},
            }
        return _json_safe(data)

    def to_json(self, indent: int | None = 2) -> str:
        """The JSON text of [`to_dict`][precision_plugin.probe.ProbeResult.to_dict] (NaN/inf written
        as ``null``)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# -- engines and inputs -----------------------------------------------------------------------
