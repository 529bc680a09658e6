"""The decomposition arithmetic: each token's log-ratio as a sum of per-cause parts.

For one token let ``d = log mu - log pi`` (rollout against trainer) and, for each cause ``c``
switched on alone against a common base, ``d_c = log(base with c) - log(base)`` (the ``dtype``
cause's base is the trainer). With ``S = sum_c d_c``, per token

    d^2 / 2 = sum_c d_c^2 / 2  +  sum_{c < c'} d_c d_c'  +  (d^2 - S^2) / 2

so over the tokens (means) the total ``E[d^2]/2`` (about k3 for small ``d``: k3 per token is
``e^-d - 1 + d = d^2/2 + O(d^3)``) splits **exactly** into each cause's part ``E[d_c^2]/2``, an
``interaction`` term (the causes' covariances, ``(E[S^2] - sum_c E[d_c^2]) / 2``) and a
``residual`` (what the causes do together beyond their sum, ``(E[d^2] - E[S^2]) / 2``). A cause's
share is its part over the total; the interaction and residual shares complete them to 1 (either
may be negative).

Each row's ``k3`` is the exact k3 estimator of its own pair (``mean(e^-d - 1 + d)``) with a
``COVERAGE`` (90 %, the project's one level: [`intervals`][precision_plugin.intervals])
percentile bootstrap interval over sequences (tokens of one sequence move together).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from precision_plugin.boundary import at_least, checked
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.intervals import COVERAGE
from precision_plugin.metrics.k3 import k3_term

#: Bootstrap resamples for the k3 intervals, and their seed.
BOOTSTRAP = 2000
BOOTSTRAP_SEED = 0


@checked
@dataclass(frozen=True)
class K3:
    """A k3 estimate (nats/token) with its ``COVERAGE`` (90 %) bootstrap interval over
    sequences."""

    value: float
    low: float
    high: float


@checked
@dataclass(frozen=True)
class Decomposition:
    """``total`` (``E[d^2]/2``) = sum of ``parts`` + ``interaction`` + ``residual``, exactly."""

    total: float
    parts: dict[str, float]
    interaction: float
    residual: float
    tokens: int

    def share(self, part: float) -> float:
        """``part / total`` (NaN when the total is 0)."""
        return part / self.total if self.total > 0 else math.nan


def _flat(rows: Sequence[Sequence[float]]) -> list[float]:
    return [float(x) for row in rows for x in row]


#: How to mend a non-finite log-ratio, in every refusal of one.
_FINITE_FIX = (
    "leave out the tokens whose log-ratio is not finite (a token one side gives probability 0, "
    "or a log-prob the engine did not return), as the probe does"
)


def _refuse_bad_tokens(what: str, rows: Sequence[Sequence[float]]) -> None:
    """Refuse per-sequence log-ratios (``what``: ``"k3_interval(): argument 'log_ratios'"``)
    with no token at all (a mean over tokens of nothing) or a non-finite one (NaN or +-inf:
    every figure over them would be NaN or infinite)."""
    if not any(len(row) for row in rows):
        n = len(rows)
        found = f"{n} empty sequence{'s' if n > 1 else ''}" if n else "no sequence"
        raise PrecisionConfigError(
            f"{what} holds no token ({found}), expected the log-ratios of at least one token "
            f"(fix: pass the per-sequence log-ratios of the tokens measured)."
        )
    for i, row in enumerate(rows):
        for j, x in enumerate(row):
            if not math.isfinite(x):
                raise PrecisionConfigError(
                    f"{what} item [{i}][{j}] is {float(x)!r}, expected a finite log-ratio "
                    f"(fix: {_FINITE_FIX})."
                )


@checked
def decompose(
    total: Sequence[Sequence[float]], parts: Mapping[str, Sequence[Sequence[float]]]
) -> Decomposition:
    """Split ``E[d^2]/2`` of the per-token ``total`` log-ratios into the ``parts``' own terms,
    their interaction and the residual (module docstring); all per sequence, the same tokens.
    Refuses a ``total`` of no token and a non-finite log-ratio in any of them."""
    _refuse_bad_tokens("decompose(): argument 'total'", total)
    d = _flat(total)
    flat = {c: _flat(rows) for c, rows in parts.items()}
    for cause, values in flat.items():
        if len(values) != len(d):
            raise PrecisionConfigError(
                f"decompose(): cause {cause!r} has {len(values)} tokens, the total {len(d)}; "
                f"pass the log-ratios of the same tokens."
            )
        _refuse_bad_tokens(f"decompose(): cause {cause!r}", parts[cause])
    n = len(d)
    sums = [math.fsum(vals[i] for vals in flat.values()) for i in range(n)]
    total_sq = math.fsum(x * x for x in d) / n
    sum_sq = math.fsum(x * x for x in sums) / n
    own = {c: math.fsum(x * x for x in vals) / n for c, vals in flat.items()}
    return Decomposition(
        total=total_sq / 2,
        parts={c: v / 2 for c, v in own.items()},
        interaction=(sum_sq - math.fsum(own.values())) / 2,
        residual=(total_sq - sum_sq) / 2,
        tokens=n,
    )


@checked(resamples=at_least(1))
def k3_interval(
    log_ratios: Sequence[Sequence[float]],
    *,
    resamples: int = BOOTSTRAP,
    seed: int = BOOTSTRAP_SEED,
    coverage: float = COVERAGE,
) -> K3:
    """k3 (``mean(e^-d - 1 + d)`` over tokens) of per-sequence log-ratios ``d``, with a
    ``coverage`` (``COVERAGE``, 90 %) percentile bootstrap interval that resamples whole
    sequences (empty ones left out); a NaN interval from one sequence (resampling one sequence
    only repeats it). Refuses no token at all (no estimate) and a non-finite log-ratio."""
    import torch

    _refuse_bad_tokens("k3_interval(): argument 'log_ratios'", log_ratios)
    rows = [r for r in log_ratios if len(r)]
    sums = torch.tensor([math.fsum(k3_term(-x) for x in r) for r in rows], dtype=torch.float64)
    counts = torch.tensor([len(r) for r in rows], dtype=torch.float64)
    value = float(sums.sum() / counts.sum())
    if len(rows) < 2:
        return K3(value, math.nan, math.nan)
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(rows), (resamples, len(rows)), generator=generator)
    estimates = sums[picks].sum(1) / counts[picks].sum(1)
    tail = (1.0 - coverage) / 2.0
    low, high = torch.quantile(estimates, torch.tensor([tail, 1.0 - tail], dtype=torch.float64))
    return K3(value, float(low), float(high))


@checked
def log_ratio(
    side: Sequence[Sequence[float]], reference: Sequence[Sequence[float]]
) -> list[list[float]]:
    """Per token ``side - reference`` (``-inf`` against ``-inf`` is 0: both give probability 0)."""
    out = []
    for a, b in zip(side, reference, strict=True):
        out.append([0.0 if x == y else x - y for x, y in zip(a, b, strict=True)])
    return out
