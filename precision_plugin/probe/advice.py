"""What the measured mismatch does to RL at the user's length, and what to do about it.

For each dtype the probe's sampled tokens give the consequence metrics
([`precision_plugin.consequence`][precision_plugin.metrics.consequence]: the effective sample
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
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from precision_plugin.boundary import at_least, checked
from precision_plugin.consequence import (
    COUNT_FIELDS,
    SEQUENCE_MASKS,
    TIS_CLIP,
    Consequence,
    GrowthFit,
    Interval,
    Projection,
    SequenceMask,
    consequence_from_sums,
    consequence_sums,
    fit_growth,
    project,
)
from precision_plugin.probe.length import bucket_slices
from precision_plugin.probe.scoring import padded

#: verl docs/algo/rollout_corr.md: ESS below 0.3 is "too low" (its health check warns).
ESS_WARNING = 0.3
#: verl docs/algo/rollout_corr.md: its ESS plot marks 0.5 "Good".
ESS_GOOD = 0.5
#: The probe's own line: a consequence under 1 % of the batch is negligible.
NEGLIGIBLE = 0.01

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

    @property
    def kept(self) -> float:
        """Share of the batch that still counts at the target length: the smallest of the ESS
        and each mask's kept share (central estimates)."""
        p = self.projection
        return min(p.ess.value, *(1.0 - _share(p, m).value for m in SEQUENCE_MASKS))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "measured": self.measured.to_dict(),
            "buckets": [b.to_dict() for b in self.buckets],
            "fit": self.fit.to_dict(),
            "at_target": self.projection.to_dict(),
            "kept_at_target": self.kept,
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``dtypes`` by name)."""
        return {
            "target_length": self.target_length,
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
            k3 = math.fsum(math.expm1(min(x, 700.0)) - x for x in d)  # 700: expm1's range
            out.append((i, len(d), math.fsum(d), k3))
    return out


def dtype_consequence(
    dtype: str, train: list[list[float]], rollout: list[list[float]], target_length: int
) -> DtypeConsequence:
    """Measure, bucket, fit and project one dtype's sequences (the verdict comes later, from
    ``assess``, which compares the dtypes)."""
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
    fit = fit_growth(
        [s[2] for s in seqs], [s[1] for s in seqs], clipped, seq_kl=[s[3] for s in seqs]
    )
    return DtypeConsequence(
        dtype,
        consequence_from_sums(counts, moments),
        buckets,
        fit,
        project(fit, target_length),
        verdict="",
        line="",
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


def percent(value: Any) -> str:
    """A share as the table and the lines show it: ``0%``, ``<0.1%``, ``4.2%``, ``37%``,
    ``>99.9%``; ``n/a`` for a missing or non-finite value."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0%"
    if value < 0.001:
        return "<0.1%"
    if 0.999 < value < 1:
        return ">99.9%"
    return f"{value:.1%}" if value < 0.1 else f"{value:.0%}"


def ess_text(value: float) -> str:
    """An ESS as the lines show it: two decimals, ``<0.01`` and ``>0.99`` where those would
    round to a bound the value does not reach."""
    if 0 < value < 0.005:
        return "<0.01"
    if 0.995 <= value < 1:
        return ">0.99"
    return f"{value:.2f}"


def _range(iv: Interval) -> str:
    return f"{percent(iv.value)} ({percent(iv.low)}–{percent(iv.high)})"


def _share(p: Projection, mask: SequenceMask) -> Interval:
    return getattr(p, f"seq_mask_fraction_{mask.key}")


def dtype_line(c: DtypeConsequence) -> str:
    """The verdict line: what a correction would do to this dtype's batch at the target
    length, each figure with its 90 % interval."""
    p = c.projection
    masks = ", ".join(
        f"{m.label} ({m.bounds}) drops {_range(_share(p, m))}"
        for m in sorted(SEQUENCE_MASKS, key=lambda m: -_share(p, m).value)
    )
    ess = f"{ess_text(p.ess.value)} ({ess_text(p.ess.low)}–{ess_text(p.ess.high)})"
    return (
        f"{c.dtype} at {p.length:,} tokens: keeps {percent(c.kept)} of the batch ({c.verdict}): "
        f"{masks} of the sequences; ESS {ess}; "
        f"a TIS clip at {TIS_CLIP:g} clips {percent(p.tis_clip_fraction.value)} of the tokens."
    )


def _how(dtype: str) -> str:
    if dtype == "float16":
        return " (precision_plugin.enable())"
    return f" (precision_plugin.enable(dtype={dtype!r}))"


def advice(
    report: Mapping[str, DtypeConsequence],
    target: int,
    k3: Mapping[str, float],
    float16_refused: str | None = None,
) -> str:
    """The what-to-do line over the low-precision dtypes (``k3``: each dtype's k3 KL).

    ``float16_refused`` says why a rollout engine will not run this model in float16 (e.g.
    "vLLM refuses float16 for model type 'gemma3_text'"): a float16 that keeps the most is
    then advised only for a rollout engine that runs it, and the next dtype for the one that
    refuses it."""
    ran = {n: c for n, c in report.items() if c.verdict in VERDICTS}
    if not ran:
        return "do: nothing to compare: no low-precision dtype was measured."
    missing = [n for n, c in report.items() if n not in ran]
    lead = f"{', '.join(missing)} did not run (see its line). " if missing else ""
    ranked = sorted(ran.values(), key=lambda c: (-c.kept, k3.get(c.dtype, math.inf)))
    best, worst = ranked[0], ranked[-1]
    refused = float16_refused if "float16" in ran else None
    if all(c.verdict == "negligible" for c in ranked):
        text = f"do: either dtype works at {target:,} tokens (every consequence under 1 %)"
        low = min(ranked, key=lambda c: k3.get(c.dtype, math.inf))
        others = [c for c in ranked if c is not low]
        if others and k3.get(low.dtype, 0) > 0:
            factor = k3[others[0].dtype] / k3[low.dtype]
            text += f"; {low.dtype}'s k3 is {factor:.0f}x lower than {others[0].dtype}'s"
        other = next((c for c in ranked if c.dtype != "float16"), None)
        if refused and other is not None:
            text += f"; but {refused}: with that engine, {other.dtype}{_how(other.dtype)}"
        return lead + text + "."
    chosen = best
    if len(ranked) == 1:
        text = f"do: {best.dtype} keeps {percent(best.kept)} of the batch at {target:,} tokens"
        if refused:
            text += f", but {refused}"
    elif refused and best.dtype == "float16":
        chosen = ranked[1]
        text = (
            f"do: float16 keeps {percent(best.kept)} of the batch at {target:,} tokens, "
            f"{chosen.dtype} {percent(chosen.kept)}, but {refused}: with that engine train in "
            f"{chosen.dtype}{_how(chosen.dtype)}; float16{_how('float16')} only with a rollout "
            f"engine that runs it"
        )
    else:
        text = (
            f"do: train in {best.dtype}{_how(best.dtype)}: at {target:,} tokens it keeps "
            f"{percent(best.kept)} of the batch, {worst.dtype} {percent(worst.kept)}"
        )
    if chosen.verdict in ("costly", "severe"):
        even = "even " if chosen is best else ""
        text += (
            f"; {even}{chosen.dtype} loses more than half: generate shorter, or train with a "
            f"correction (verl's Seq-MIS, TRL's sequence_mask) and watch its masked share"
        )
    return lead + text + "."


@checked(target_length=at_least(1))
def assess(
    results: Mapping[str, Any],
    target_length: int,
    *,
    valid: bool = True,
    float16_refused: str | None = None,
) -> ConsequenceReport:
    """The ``consequence`` section for a probe's per-dtype results (``DtypeResult`` by name).

    ``valid`` is the float32 self-check: when it failed, every verdict is ``invalid``.
    ``float16_refused``: why a rollout engine refuses this model in float16, for the
    what-to-do line (see ``advice``).
    """
    started = time.perf_counter()
    report = ConsequenceReport(target_length)
    k3: dict[str, float] = {}
    for name, r in results.items():
        c = dtype_consequence(name, r.train_logprobs, r.rollout_logprobs, target_length)
        k3[name] = r.metrics.k3_kl
        if not valid:
            c.verdict, c.line = "invalid", f"{name}: invalid (the float32 self-check failed)."
        elif name == "float32":
            c.verdict = "floor"
            c.line = f"float32 (the self-check): {r.reason} The floor the other dtypes stand on."
        elif r.metrics.tokens == 0:
            c.verdict, c.line = "invalid", f"{name}: {r.reason}."
        else:
            c.verdict = classify(c)
            c.line = dtype_line(c)
        report.dtypes[name] = c
    if valid:
        low = {n: c for n, c in report.dtypes.items() if n != "float32"}
        report.advice = advice(low, target_length, k3, float16_refused)
    else:
        report.advice = (
            "do: fix the set-up first: the float32 self-check failed, so no dtype's figures are "
            "a precision measurement."
        )
    report.seconds = time.perf_counter() - started
    return report
