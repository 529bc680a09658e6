"""The length effect: how the sequence log-ratio drifts with the completion length (the paper's
Fig. 5), by length bucket: the drift per 1,000 tokens (−1000·k1, token-weighted) with its
standard error, per bucket and overall, and the least-squares slope of the log-ratio against
length as a cross-check."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from precision_plugin._base.boundary import at_least, checked
from precision_plugin._core.metrics.k3 import k3_term
from precision_plugin._core.metrics.mismatch import drift_per_1k
from precision_plugin.errors import PrecisionConfigError

#: Sequences per bucket the probe aims for: enough for a mean and a spread per bucket.
MIN_PER_BUCKET = 4
#: At most this many buckets, however many sequences there are.
MAX_BUCKETS = 8


@checked
@dataclass(frozen=True)
class LengthBucket:
    """The sequences whose completion length lies in ``[min_length, max_length]``.

    ``mean_log_ratio``/``std_log_ratio``: mean and sample spread of Σ(log π − log μ) per
    sequence; ``drift_per_1k``: 1000 × the token mean of log π − log μ over the bucket's tokens;
    ``k3_kl``: token-mean k3 over the bucket's tokens (the per-token mismatch at that length).
    """

    min_length: int
    max_length: int
    sequences: int
    tokens: int
    mean_length: float
    mean_log_ratio: float
    std_log_ratio: float
    drift_per_1k: float
    k3_kl: float


@checked
@dataclass(frozen=True)
class LengthEffect:
    """Sequence log-ratio against length: the buckets and the drift per 1,000 tokens.

    ``drift_per_1k`` is 1000 × the token mean of log π − log μ (−1000·k1; E_μ[Σ(log π − log μ)]
    = −L·KL(μ‖π)), ``drift_per_1k_se`` its standard error with sequences as the units (see
    [`drift_per_1k`][precision_plugin._core.metrics.mismatch.drift_per_1k]). ``slope_per_1k`` and
    ``slope_stderr_per_1k`` fit the sequence log-ratio against length by least squares: the
    same drift where the per-token mismatch does not change with position, estimated far less
    precisely (NaN below 3 sequences or 2 distinct lengths).
    """

    sequences: int
    buckets: list[LengthBucket] = field(default_factory=list)
    drift_per_1k: float = math.nan
    drift_per_1k_se: float = math.nan
    slope_per_1k: float = math.nan
    slope_stderr_per_1k: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (buckets as a list of dicts)."""
        out = asdict(self)
        out["buckets"] = [asdict(b) for b in self.buckets]
        return out


@checked
def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope of ``ys`` against ``xs`` and its standard error (NaN if undefined)."""
    n = len(xs)
    if n < 2:
        return math.nan, math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return math.nan, math.nan
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if n < 3:
        return slope, math.nan
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, math.sqrt(residual / (n - 2) / sxx)


def bucket_slices(n: int, num_buckets: int | None = None) -> list[tuple[int, int]]:
    """``[start, stop)`` of each bucket over ``n`` sequences sorted by length: equal shares,
    ``n // MIN_PER_BUCKET`` buckets up to ``MAX_BUCKETS`` unless ``num_buckets`` is given."""
    if n < 1:
        return []
    k = num_buckets or min(MAX_BUCKETS, max(1, n // MIN_PER_BUCKET))
    k = max(1, min(k, n))
    return [(b * n // k, (b + 1) * n // k) for b in range(k)]


@checked(num_buckets=at_least(1))
def length_effect(
    train: Sequence[Sequence[float]],
    rollout: Sequence[Sequence[float]],
    num_buckets: int | None = None,
) -> LengthEffect:
    """Bucket the sequences by completion length; the drift per 1,000 tokens and the slope.

    Lengths and sums count only tokens where both log-probs are finite (as the metrics do).
    Buckets hold equal numbers of sequences (sorted by length), ``len // MIN_PER_BUCKET`` of
    them up to ``MAX_BUCKETS`` unless ``num_buckets`` is given, so each has a mean and a spread
    even when a weak model ends most completions early.
    """
    if [len(r) for r in train] != [len(r) for r in rollout]:
        raise PrecisionConfigError(
            f"length_effect(): arguments 'train' and 'rollout' hold {len(train)} and "
            f"{len(rollout)} sequences of different lengths; pass the log-probs of the same "
            f"tokens on both sides."
        )
    seqs = []  # (length, Σ log-ratio, Σ k3)
    for train_row, roll_row in zip(train, rollout, strict=True):
        d = [a - b for a, b in zip(train_row, roll_row, strict=True) if math.isfinite(a - b)]
        if d:
            seqs.append((len(d), sum(d), sum(k3_term(v) for v in d)))
    if not seqs:
        return LengthEffect(sequences=0)
    seqs.sort(key=lambda s: s[0])
    n = len(seqs)
    buckets = []
    for start, stop in bucket_slices(n, num_buckets):
        group = seqs[start:stop]
        ratios = [s[1] for s in group]
        tokens = sum(s[0] for s in group)
        mean = sum(ratios) / len(ratios)
        spread = (
            math.sqrt(sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1))
            if len(ratios) > 1
            else math.nan
        )
        buckets.append(
            LengthBucket(
                min_length=group[0][0],
                max_length=group[-1][0],
                sequences=len(group),
                tokens=tokens,
                mean_length=tokens / len(group),
                mean_log_ratio=mean,
                std_log_ratio=spread,
                drift_per_1k=1000.0 * sum(ratios) / tokens,
                k3_kl=sum(s[2] for s in group) / tokens,
            )
        )
    lengths = [float(s[0]) for s in seqs]
    drift, drift_se = drift_per_1k(lengths, [s[1] for s in seqs])
    slope, slope_se = fit_slope(lengths, [s[1] for s in seqs])
    return LengthEffect(
        sequences=n,
        buckets=buckets,
        drift_per_1k=drift,
        drift_per_1k_se=drift_se,
        slope_per_1k=slope * 1000.0,
        slope_stderr_per_1k=slope_se * 1000.0,
    )
