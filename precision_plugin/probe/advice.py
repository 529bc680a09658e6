"""What the measured mismatch does to RL at the user's length, and what to do about it.

For each dtype the probe's sampled tokens give the consequence metrics
([`precision_plugin._core.metrics.consequence`][precision_plugin._core.metrics.consequence]: the
effective sample
size, the share of sequences TRL's and verl's default sequence masks drop, the share of tokens a TIS
clip at 2.0 clips), over all sequences and per length bucket. A random walk with drift fitted
to the sequence log-ratios carries them to ``target_length`` with a 90 % interval, and a
verdict per dtype and one what-to-do line follow from documented thresholds:

- ``ESS_WARNING`` 0.3 and ``ESS_GOOD`` 0.5: verl's rollout-correction guide
  (volcengine/verl docs/algo/rollout_corr.md) warns below an ESS of 0.3 ("Low effective
  sample size, high weight concentration") and marks 0.5 "Good". A mask that drops a share
  ``f`` of the sequences leaves ``1 − f`` of the batch, so the same lines apply to it.
- ``NEGLIGIBLE`` 1 %: below it (ESS ≥ 0.99, ≤ 1 % of sequences masked, ≤ 1 % of tokens
  clipped) the correction would change less than one sequence in a hundred. This line is the
  probe's own, not a framework's.

Every figure carries its 90 % interval and the number of sequences behind it
([`precision_plugin._core.intervals`][precision_plugin._core.intervals] names the method per
figure). The
masks' shares do not depend on the batch size; the self-normalised ESS does, so it is given for
a batch of ``batch_size`` sequences (``--batch-size``; the infinite-batch value ``exp(−σ²L)``
only labelled as such), and the share of the batch that still counts uses the batch's ESS. A
misfit check ([`precision_plugin._core.misfit`][precision_plugin._core.misfit]) widens the
projection when
the longest sequences spread more than the fit predicts. The what-to-do line is one
[`decision`][precision_plugin._core.decision.decide] over overflow, headroom, consequence, mismatch
and, with ``--attribute``, the setting to change first.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from precision_plugin._base.boundary import at_least, checked, in_range
from precision_plugin._core.decision import (
    Attribution,
    Configured,
    Decision,
    Evidence,
    Headroom,
    decide,
    percent,
)
from precision_plugin._core.intervals import HEAVY_TAIL_KURTOSIS, clopper_pearson, ratio_interval
from precision_plugin._core.metrics.consequence import (
    COUNT_FIELDS,
    COVERAGE,
    SEQUENCE_MASKS,
    TIS_CLIP,
    Consequence,
    GrowthFit,
    Interval,
    Projection,
    SequenceMask,
    consequence_from_sums,
    consequence_sums,
    ess_interval,
    fit_growth,
    project,
)
from precision_plugin._core.metrics.k3 import capped_k3_term
from precision_plugin._core.misfit import GrowthCheck, check_growth
from precision_plugin._core.overflow import HeadroomReport
from precision_plugin.probe.length import bucket_slices
from precision_plugin.probe.overflow import OverflowCheck
from precision_plugin.probe.schema import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE, DtypeResult
from precision_plugin.probe.scoring import padded

#: verl docs/algo/rollout_corr.md: ESS below 0.3 is "too low" (its health check warns).
ESS_WARNING = 0.3
#: verl docs/algo/rollout_corr.md: its ESS plot marks 0.5 "Good".
ESS_GOOD = 0.5
#: The probe's own line: a consequence under 1 % of the batch is negligible.
NEGLIGIBLE = 0.01

#: Batch sizes the JSON always reports the projected ESS for.
REPORTED_BATCHES: tuple[int, ...] = (64, 256, 1024)

#: Verdicts from best to worst (plus "floor" for the float32 self-check and "invalid").
VERDICTS: tuple[str, ...] = ("negligible", "noticeable", "costly", "severe")

_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class BucketConsequence:
    """The consequence metrics of one length bucket (the buckets of ``length_effect``) and the
    growth model's per-token variance fitted to that bucket alone (stable across buckets when
    the random-walk model holds)."""

    min_length: int
    max_length: int
    mean_length: float
    consequence: Consequence
    variance_per_token: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "min_length": self.min_length,
            "max_length": self.max_length,
            "mean_length": self.mean_length,
            **self.consequence.to_dict(),
            "variance_per_token": self.variance_per_token,
            "intervals": _share_intervals(self.consequence),
        }


@checked
@dataclass
class DtypeConsequence:
    """One dtype's consequence: measured, per bucket, the fit, the projection to the target
    length, the verdict and its line."""

    dtype: str
    measured: Consequence
    buckets: list[BucketConsequence]
    fit: GrowthFit
    projection: Projection
    verdict: str
    line: str
    batch_size: int = DEFAULT_BATCH_SIZE
    batch_ess: dict[int, Interval] = field(default_factory=dict)
    measured_intervals: dict[str, Interval] = field(default_factory=dict)
    growth: GrowthCheck | None = None
    k3: Interval = field(default_factory=lambda: Interval(math.nan, math.nan, math.nan))

    @property
    def ess(self) -> Interval:
        """The projected ESS of a batch of ``batch_size`` (the infinite-batch value when the
        batch's was not computed)."""
        return self.batch_ess.get(self.batch_size, self.projection.ess)

    @property
    def kept_interval(self) -> Interval:
        """Share of a batch of ``batch_size`` that still counts at the target length: the
        smallest of its ESS and each mask's kept share, with the interval of that minimum."""
        p, e = self.projection, self.ess
        masks = [_share(p, m) for m in SEQUENCE_MASKS]
        return Interval(
            min(e.value, *(1.0 - s.value for s in masks)),
            min(e.low, *(1.0 - s.high for s in masks)),
            min(e.high, *(1.0 - s.low for s in masks)),
        )

    @property
    def kept(self) -> float:
        """The central value of ``kept_interval``."""
        return self.kept_interval.value

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "measured": self.measured.to_dict(),
            "buckets": [b.to_dict() for b in self.buckets],
            "fit": self.fit.to_dict(),
            "measured_intervals": {k: v.to_dict() for k, v in self.measured_intervals.items()},
            "at_target": {
                **self.projection.to_dict(),
                "ess_infinite_batch": self.projection.ess.to_dict(),
                "batch_size": self.batch_size,
                "ess_batch": {str(n): v.to_dict() for n, v in sorted(self.batch_ess.items())},
                "sequences": self.fit.sequences,
            },
            "growth_check": self.growth.to_dict() if self.growth else None,
            "k3": self.k3.to_dict(),
            "kept_at_target": self.kept,
            "kept_interval": self.kept_interval.to_dict(),
            "verdict": self.verdict,
            "line": self.line,
        }


@checked
@dataclass
class ConsequenceReport:
    """The probe's ``consequence`` section: per dtype, the advice, and what it cost."""

    target_length: int
    dtypes: dict[str, DtypeConsequence] = field(default_factory=dict)
    advice: str = ""
    seconds: float = 0.0
    batch_size: int = DEFAULT_BATCH_SIZE
    decision: Decision | None = None
    #: The rollout as configured (``probe --rollout``): its settings in words and each dtype's
    #: consequence under them (empty with the default rollout).
    configured_settings: str = ""
    configured: dict[str, DtypeConsequence] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``dtypes`` by name; ``configured`` with ``--rollout``)."""
        out = self._to_dict()
        if self.configured:
            out["configured"] = {
                "settings": self.configured_settings,
                "dtypes": {name: d.to_dict() for name, d in self.configured.items()},
            }
        return out

    def _to_dict(self) -> dict[str, Any]:
        return {
            "target_length": self.target_length,
            "batch_size": self.batch_size,
            "coverage": COVERAGE,
            "bounds": {
                **{
                    f"seq_mask_fraction_{m.key}": {
                        "system": m.system,
                        "kept": m.bounds,
                        "low": m.low,
                        "high": m.high,
                        "label": m.label,
                        "setting": m.setting,
                    }
                    for m in SEQUENCE_MASKS
                },
                "tis_clip_fraction": {"clip": TIS_CLIP},
            },
            "thresholds": {
                "ess_warning": ESS_WARNING,
                "ess_good": ESS_GOOD,
                "negligible": NEGLIGIBLE,
            },
            "dtypes": {name: d.to_dict() for name, d in self.dtypes.items()},
            "advice": self.advice,
            "decision": self.decision.to_dict() if self.decision else None,
            "seconds": round(self.seconds, 3),
        }


def _batch_sums(train: list[list[float]], rollout: list[list[float]]) -> tuple[Any, Any]:
    train_t, mask = padded(train)
    roll_t, _ = padded(rollout)
    return consequence_sums(train_t, roll_t, mask)


def _sequences(
    train: list[list[float]], rollout: list[list[float]]
) -> list[tuple[int, int, float, float]]:
    """``(row, valid tokens, Σ log π − log μ, Σ k3)`` of each row with a valid token, in input
    order (valid: finite on both sides, as the metrics count them)."""
    out = []
    for i, (a, b) in enumerate(zip(train, rollout, strict=True)):
        d = [x - y for x, y in zip(a, b, strict=True) if math.isfinite(x - y)]
        if d:
            k3 = math.fsum(capped_k3_term(x) for x in d)  # finite: fit_growth takes it
            out.append((i, len(d), math.fsum(d), k3))
    return out


def _share_intervals(c: Consequence) -> dict[str, dict[str, float]]:
    """Clopper-Pearson intervals of a measured batch's mask and clip shares, with their counts
    (a mask counts sequences, the clip tokens)."""
    out: dict[str, dict[str, float]] = {}
    for m in SEQUENCE_MASKS:
        share = getattr(c, f"seq_mask_fraction_{m.key}")
        k = round(share * c.sequences) if math.isfinite(share) else 0
        low, high = clopper_pearson(k, c.sequences)
        out[f"seq_mask_fraction_{m.key}"] = {
            "value": share,
            "low": low,
            "high": high,
            "n": c.sequences,
        }
    clip = c.tis_clip_fraction
    k = round(clip * c.tokens) if math.isfinite(clip) else 0
    low, high = clopper_pearson(k, c.tokens)
    out["tis_clip_fraction"] = {"value": clip, "low": low, "high": high, "n": c.tokens}
    return out


def _robust(fit: GrowthFit) -> tuple[float, float]:
    if math.isfinite(fit.variance_robust_low) and math.isfinite(fit.variance_robust_high):
        return fit.variance_robust_low, fit.variance_robust_high
    return fit.variance_low, fit.variance_high


def _measured_intervals(
    measured: Consequence, fit: GrowthFit, lengths: list[int]
) -> dict[str, Interval]:
    """The measured figures with their intervals: each share Clopper-Pearson; the ESS the
    measured value with the interval of the expected ESS of a batch like the measured one (same
    lengths) that holds for heavy tails
    ([`ess_interval`][precision_plugin._core.metrics.consequence.ess_interval])."""
    expected = ess_interval(fit, lengths)
    out = {"ess": Interval(measured.ess, expected.low, expected.high)}
    for name, iv in _share_intervals(measured).items():
        out[name] = Interval(iv["value"], iv["low"], iv["high"])
    return out


def _batch_ess(fit: GrowthFit, length: int, batches: list[int]) -> dict[int, Interval]:
    """The projected ESS of a batch of each size at ``length`` tokens, with its interval that
    holds for heavy tails ([`ess_interval`][precision_plugin._core.metrics.consequence.ess_interval]
    of ``[length] * n``)."""
    return {n: ess_interval(fit, [length] * n) for n in batches}


def dtype_consequence(
    dtype: str,
    train: list[list[float]],
    rollout: list[list[float]],
    target_length: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> DtypeConsequence:
    """Measure, bucket, fit, check and project one dtype's sequences (the verdict comes later,
    from ``assess``, which compares the dtypes)."""
    counts, moments = _batch_sums(train, rollout)
    seqs = _sequences(train, rollout)
    ordered = sorted(seqs, key=lambda s: s[1])  # stable: the buckets of length_effect
    buckets = []
    for start, stop in bucket_slices(len(ordered)):
        group = ordered[start:stop]
        rows = [s[0] for s in group]
        spread = fit_growth([s[2] for s in group], [s[1] for s in group]).variance
        bucket = consequence_from_sums(
            *_batch_sums([train[i] for i in rows], [rollout[i] for i in rows])
        )
        buckets.append(
            BucketConsequence(
                min_length=group[0][1],
                max_length=group[-1][1],
                mean_length=bucket.tokens / bucket.sequences,
                consequence=bucket,
                variance_per_token=spread,
            )
        )
    clipped = int(counts[COUNT_FIELDS.index("tis_clipped")].item())
    lengths = [s[1] for s in seqs]
    fit = fit_growth([s[2] for s in seqs], lengths, clipped, seq_kl=[s[3] for s in seqs])
    growth = check_growth([s[2] for s in seqs], lengths)
    used = fit
    if growth.status == "misfit" and growth.widened_high > _robust(fit)[1]:
        low, _ = _robust(fit)
        used = dataclasses.replace(
            fit, variance_robust_low=low, variance_robust_high=growth.widened_high
        )
    measured = consequence_from_sums(counts, moments)
    batches = sorted({batch_size, *REPORTED_BATCHES})
    return DtypeConsequence(
        dtype,
        measured,
        buckets,
        fit,
        project(used, target_length, tails=True),
        verdict="",
        line="",
        batch_size=batch_size,
        batch_ess=_batch_ess(used, target_length, batches),
        measured_intervals=_measured_intervals(measured, fit, lengths),
        growth=growth,
        k3=Interval(*ratio_interval([s[3] for s in seqs], lengths)),
    )


def classify(c: DtypeConsequence) -> str:
    """The verdict at the target length from the thresholds above (central estimates)."""
    kept, clip = c.kept, c.projection.tis_clip_fraction.value
    if math.isnan(kept):
        return "invalid"
    if kept >= 1.0 - NEGLIGIBLE and not clip > NEGLIGIBLE:
        return "negligible"
    if kept >= ESS_GOOD:
        return "noticeable"
    if kept >= ESS_WARNING:
        return "costly"
    return "severe"


def ess_text(value: float) -> str:
    """An ESS as the lines show it: two decimals, ``<0.01`` and ``>0.99`` where those would
    round to a bound the value does not reach."""
    if 0 < value < 0.005:
        return "<0.01"
    if 0.995 <= value < 1:
        return ">0.99"
    return f"{value:.2f}"


def _share(p: Projection, mask: SequenceMask) -> Interval:
    return getattr(p, f"seq_mask_fraction_{mask.key}")


def _span(iv: Interval, fmt: Any = None) -> str:
    show = fmt or percent
    return f"{show(iv.value)} ({show(iv.low)}–{show(iv.high)})"


def dtype_line(c: DtypeConsequence) -> str:
    """The verdict line: what a correction would do to this dtype's batch at the target
    length and what was measured, each figure with its 90 % interval and the sequences behind
    it, the heavy-tail warning where the fit's tail statistic crosses its threshold
    (``GrowthFit.warning``), then the growth check."""
    p, n = c.projection, c.fit.sequences
    masks = ", ".join(
        f"{m.label} ({m.bounds}) drops {_span(_share(p, m))}"
        for m in sorted(SEQUENCE_MASKS, key=lambda m: -_share(p, m).value)
    )
    kept = c.kept_interval
    text = (
        f"{c.dtype} at {p.length:,} tokens: a batch of {c.batch_size:,} keeps "
        f"{percent(kept.value)} ({percent(kept.low)}–{percent(kept.high)}) ({c.verdict}): "
        f"{masks} of the sequences; ESS {_span(c.ess, ess_text)} (infinite batch: "
        f"{_span(p.ess, ess_text)}); a TIS clip at {TIS_CLIP:g} clips "
        f"{_span(p.tis_clip_fraction)} of the tokens; projected from {n} sequences."
    )
    if c.fit.warning:
        text += (
            f" {c.fit.warning[0].upper()}{c.fit.warning[1:]} (the sequence log-ratios' excess "
            f"kurtosis {c.fit.kurtosis:.1f} is above {HEAVY_TAIL_KURTOSIS:g})."
        )
    mi = c.measured_intervals
    if mi:
        measured = "; ".join(
            [f"ESS {_span(mi['ess'], ess_text)}"]
            + [f"{m.system} mask {_span(mi[f'seq_mask_fraction_{m.key}'])}" for m in SEQUENCE_MASKS]
            + [f"TIS clip {_span(mi['tis_clip_fraction'])} of {c.measured.tokens:,} tokens"]
        )
        text += f" Measured, {c.measured.sequences} sequences: {measured}."
    if c.growth is not None:
        text += f" {c.growth.message[0].upper()}{c.growth.message[1:]}."
    return text


def _headroom(overflow: OverflowCheck | HeadroomReport | None) -> Headroom | None:
    """The decision's view of a probe's headroom check (``OverflowCheck``, or its report)."""
    if overflow is None:
        return None
    report = getattr(overflow, "report", overflow)
    rec = report.recommendation()
    return Headroom(
        rec.action, tuple(rec.modules), len(report.flagged), report.margin_bits, rec.message
    )


def _evidence(c: DtypeConsequence, blocked: str) -> Evidence:
    return Evidence(c.dtype, c.kept_interval, c.k3, c.fit.sequences, c.verdict, blocked)


@checked(
    target_length=at_least(1),
    batch_size=in_range(1, MAX_BATCH_SIZE, integer=True, why="the probe's --batch-size"),
)
def assess(
    results: Mapping[str, DtypeResult],
    target_length: int,
    *,
    valid: bool = True,
    float16_refused: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    overflow: OverflowCheck | HeadroomReport | None = None,
    attribution: Attribution | None = None,
    configured: Mapping[str, DtypeResult] | None = None,
    configured_settings: str = "",
    deepspeed_runs: Mapping[str, bool] | None = None,
) -> ConsequenceReport:
    """The ``consequence`` section for a probe's per-dtype results (``DtypeResult`` by name).

    ``valid`` is the float32 self-check: when it failed, every verdict is ``invalid``.
    ``float16_refused``: why a rollout engine refuses this model in float16; ``overflow``: the
    probe's headroom check (``OverflowCheck``); ``attribution``: ``probe --attribute``'s
    change-first (``AttributionReport.evidence()``); all feed the one decision
    ([`decide`][precision_plugin._core.decision.decide]) whose line is ``advice``. ``batch_size``:
    the sequences per batch the ESS is given for. ``configured``: the rollout as configured
    (``probe --rollout``: ``DtypeResult`` by name, measured on the attribution's samples) and
    ``configured_settings`` its settings in words; ``deepspeed_runs``: the dtypes DeepSpeed's
    accelerator runs here (``apply:`` says where it refuses the decision's dtype).
    """
    started = time.perf_counter()
    report = ConsequenceReport(target_length, batch_size=batch_size)
    evidence: dict[str, Evidence] = {}
    for name, r in results.items():
        c = dtype_consequence(name, r.train_logprobs, r.rollout_logprobs, target_length, batch_size)
        blocked = ""
        if not valid:
            c.verdict, c.line = "invalid", f"{name}: invalid (the float32 self-check failed)."
        elif name == "float32":
            c.verdict = "floor"
            c.line = f"float32 (the self-check): {r.reason} The floor the other dtypes stand on."
        elif r.metrics.tokens == 0:
            c.verdict, c.line = "invalid", f"{name}: {r.reason}."
            blocked = r.reason or "not run"
        else:
            c.verdict = classify(c)
            c.line = dtype_line(c)
        report.dtypes[name] = c
        if name != "float32":
            evidence[name] = _evidence(c, blocked)
    report.configured_settings = configured_settings
    under: dict[str, Evidence] = {}
    for name, r in (configured or {}).items():
        c = dtype_consequence(name, r.train_logprobs, r.rollout_logprobs, target_length, batch_size)
        c.verdict = classify(c) if valid else "invalid"
        c.line = f"as configured ({configured_settings}): {dtype_line(c)}"
        report.configured[name] = c
        if name != "float32":
            under[name] = _evidence(c, "")
    report.decision = decide(
        evidence,
        target=target_length,
        batch=batch_size,
        valid=valid,
        headroom=_headroom(overflow),
        refused=float16_refused,
        attribution=attribution,
        configured=(
            Configured(configured_settings, under, target_length, batch_size) if under else None
        ),
        deepspeed_runs=deepspeed_runs,
    )
    report.advice = report.decision.line
    report.seconds = time.perf_counter() - started
    return report
