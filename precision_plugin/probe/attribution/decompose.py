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

That split is what results files written before the Shapley shares carry (their ``interaction``
and ``residual`` rows); the probe now splits the k3 total itself with
[`cause_shares`][precision_plugin.probe.attribution.decompose.cause_shares]:

**Shapley shares of k3.** Let ``v(S)`` be the k3 (``mean(e^-d - 1 + d)`` over the same tokens)
of the trainer against the rollout rescored with the causes in ``S`` switched on together
(``v(empty) = 0``: nothing switched is the trainer itself). A cause's part is its Shapley value,
the average over the ``k!`` orders of switching the ``k`` causes on of what it adds when it comes:

    phi_c = sum over S not holding c of |S|! (k - |S| - 1)! / k! * (v(S + c) - v(S))

so the parts add up to ``v(all causes)`` exactly (efficiency), and ``residual = total -
v(all causes)`` is what the rescored rollout misses of the measured one (the engine's own
sampling pass against its rescoring). Above ``SHAPLEY_MAX_CAUSES`` causes (``2^k`` passes) the
parts are the **sequential** saving instead: the causes switched on one after the other in
``CAUSES`` order, each part ``v(first i causes) - v(first i - 1)``, ``k`` passes. Each part,
share and the residual has a ``COVERAGE`` percentile interval from one bootstrap over whole
sequences (the per-sequence k3 sums of every subset computed once, the parts recomputed per
resample); a part whose interval holds 0 is not distinguishable from 0.

Each row's ``k3`` is the exact k3 estimator of its own pair (``mean(e^-d - 1 + d)``) with a
``COVERAGE`` (90 %, the project's one level: [`intervals`][precision_plugin._core.intervals])
percentile bootstrap interval over sequences (tokens of one sequence move together).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

import annotated_types as at

from precision_plugin._base.boundary import checked, same_rows
from precision_plugin._base.constraints import Whole
from precision_plugin._core.intervals import COVERAGE, Coverage
from precision_plugin._core.metrics.k3 import k3_term
from precision_plugin.errors import PrecisionConfigError

#: Bootstrap resamples for the k3 intervals, and their seed.
BOOTSTRAP = 2000
BOOTSTRAP_SEED = 0
#: The most bootstrap resamples an interval takes: each draws one index per sequence (100,000
#: resamples of 1,000 sequences: 800 MB of int64), and more buys no precision at 90 %.
MAX_BOOTSTRAP = 100_000
#: Bootstrap resamples, and their seed (one torch's generator takes).
Resamples = Annotated[int, Whole(), at.Ge(1), at.Le(MAX_BOOTSTRAP)]
Seed = Annotated[int, Whole(), at.Ge(0), at.Le(2**63 - 1)]
#: The most causes whose parts are Shapley values (``2^k`` rescoring passes: 64 at 6); above it
#: the parts are the sequential saving in ``CAUSES`` order (``k`` passes).
SHAPLEY_MAX_CAUSES = 6


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


@checked
def k3_interval(
    log_ratios: Sequence[Sequence[float]],
    *,
    resamples: Resamples = BOOTSTRAP,
    seed: Seed = BOOTSTRAP_SEED,
    coverage: Coverage = COVERAGE,
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


@checked(
    same_rows(
        "side", "reference", fix="pass the log-probs of the same tokens on both sides, per sequence"
    )
)
def log_ratio(
    side: Sequence[Sequence[float]], reference: Sequence[Sequence[float]]
) -> list[list[float]]:
    """Per token ``side - reference`` (``-inf`` against ``-inf`` is 0: both give probability 0)."""
    out = []
    for a, b in zip(side, reference, strict=True):
        out.append([0.0 if x == y else x - y for x, y in zip(a, b, strict=True)])
    return out


def shapley_weights(k: int) -> list[list[float]]:
    """``W[i][mask]`` with ``phi_i = sum_mask W[i][mask] * v(mask)``: the Shapley value of
    player ``i`` of ``k`` (bit ``i`` of a subset's ``mask``), each ``v(S + i) - v(S)`` weighted
    ``|S|! (k - |S| - 1)! / k!``."""
    w = [[0.0] * (1 << k) for _ in range(k)]
    for i in range(k):
        bit = 1 << i
        for mask in range(1 << k):
            if mask & bit:
                continue
            size = mask.bit_count()
            weight = math.factorial(size) * math.factorial(k - size - 1) / math.factorial(k)
            w[i][mask | bit] += weight
            w[i][mask] -= weight
    return w


def sequential_weights(k: int) -> list[list[float]]:
    """``W[i][mask]`` of the sequential saving: player ``i``'s part is ``v(players 0..i) -
    v(players 0..i-1)`` (switched on in their order)."""
    w = [[0.0] * (1 << k) for _ in range(k)]
    for i in range(k):
        w[i][(1 << (i + 1)) - 1] += 1.0
        w[i][(1 << i) - 1] -= 1.0
    return w


def share_method(k: int) -> str:
    """``"shapley"`` for at most ``SHAPLEY_MAX_CAUSES`` causes, else ``"sequential"``."""
    return "shapley" if k <= SHAPLEY_MAX_CAUSES else "sequential"


def subsets_needed(k: int, method: str) -> list[int]:
    """The subset masks whose ``v`` the ``method``'s parts read (``0``, the empty set, is
    ``v = 0`` and not scored): every subset for Shapley, the ``k`` prefixes for sequential."""
    if method == "shapley":
        return list(range(1, 1 << k))
    return [(1 << (i + 1)) - 1 for i in range(k)]


@checked
@dataclass(frozen=True)
class Part:
    """A part of the k3 total (nats/token) and its share of the total, each with its
    ``COVERAGE`` bootstrap interval (NaN without one: a single sequence, or a total of 0 for the
    share)."""

    value: float
    low: float
    high: float
    share: float
    share_low: float
    share_high: float

    @property
    def distinguishable(self) -> bool:
        """Whether the interval leaves out 0 (False without an interval)."""
        return self.low > 0 or self.high < 0


@checked
@dataclass(frozen=True)
class Shares:
    """The k3 ``total`` = sum of the causes' ``parts`` + ``residual`` (module docstring);
    ``together`` is ``v(all causes)``, ``method`` ``"shapley"`` or ``"sequential"``, ``passes``
    the subsets scored for it (the empty one left out)."""

    method: str
    causes: tuple[str, ...]
    parts: dict[str, Part]
    together: K3
    residual: Part
    total: K3
    passes: int


def _k3_sums(rows: Sequence[Sequence[float]]) -> list[float]:
    return [math.fsum(k3_term(-x) for x in row) for row in rows]


@checked
def cause_shares(
    total: Sequence[Sequence[float]],
    subsets: Mapping[int, Sequence[Sequence[float]]],
    causes: Sequence[str],
    *,
    method: str = "shapley",
    resamples: Resamples = BOOTSTRAP,
    seed: Seed = BOOTSTRAP_SEED,
    coverage: Coverage = COVERAGE,
) -> Shares:
    """Split the k3 of the per-sequence log-ratios ``total`` into the ``causes``' parts
    (``method``: ``"shapley"`` or ``"sequential"``) and the residual (module docstring).
    ``subsets[mask]``: the per-sequence log-ratios, on the same tokens as ``total``, of the
    trainer against the rollout with the causes of ``mask`` switched on (bit ``i`` =
    ``causes[i]``), for every mask of ``subsets_needed`` (the empty mask is ``v = 0``). The
    intervals come from one bootstrap over the sequences that hold tokens, the same draws as
    [`k3_interval`][precision_plugin.probe.attribution.decompose.k3_interval]'s (the total's
    interval is that function's)."""
    import torch

    if method not in ("shapley", "sequential"):
        raise PrecisionConfigError(
            f"cause_shares(): argument 'method' is {method!r}, expected 'shapley' or 'sequential'."
        )
    k = len(causes)
    masks = subsets_needed(k, method)
    _refuse_bad_tokens("cause_shares(): argument 'total'", total)
    lengths = [len(row) for row in total]
    for mask in masks:
        if mask not in subsets:
            raise PrecisionConfigError(
                f"cause_shares(): argument 'subsets' has no mask {mask} (causes "
                f"{[c for i, c in enumerate(causes) if mask >> i & 1]}); pass every subset "
                f"subsets_needed({k}, {method!r}) lists."
            )
        if [len(row) for row in subsets[mask]] != lengths:
            raise PrecisionConfigError(
                f"cause_shares(): subset {mask} holds other tokens than the total; pass the "
                f"log-ratios of the same tokens."
            )
        _refuse_bad_tokens(f"cause_shares(): subset {mask}", subsets[mask])
    weights = shapley_weights(k) if method == "shapley" else sequential_weights(k)
    keep = [i for i, n in enumerate(lengths) if n]
    count = sum(lengths)
    per_seq = {0: [0.0] * len(keep)}
    for mask in masks:
        sums = _k3_sums(subsets[mask])
        per_seq[mask] = [sums[i] for i in keep]
    total_sums = _k3_sums(total)
    total_seq = [total_sums[i] for i in keep]
    v = {mask: math.fsum(sums) / count for mask, sums in per_seq.items()}
    value = math.fsum(total_seq) / count
    full = (1 << k) - 1 if k else 0
    phi = [math.fsum(weights[i][m] * v[m] for m in per_seq if weights[i][m]) for i in range(k)]
    residual = value - v[full]
    order = [0, *masks]
    w = torch.tensor([[weights[i][m] for m in order] for i in range(k)], dtype=torch.float64)
    table = torch.tensor([per_seq[m] for m in order], dtype=torch.float64).T  # [seqs, masks]
    seq_total = torch.tensor(total_seq, dtype=torch.float64)
    seq_count = torch.tensor([lengths[i] for i in keep], dtype=torch.float64)
    nan = math.nan
    if len(keep) >= 2:
        generator = torch.Generator().manual_seed(seed)
        picks = torch.randint(0, len(keep), (resamples, len(keep)), generator=generator)
        times = torch.zeros(resamples, len(keep), dtype=torch.float64)
        times.scatter_add_(1, picks, torch.ones_like(picks, dtype=torch.float64))
        tokens = times @ seq_count
        v_b = (times @ table) / tokens[:, None]
        total_b = (times @ seq_total) / tokens
        draws = torch.cat([v_b @ w.T, (total_b - v_b[:, order.index(full)])[:, None]], dim=1)
        shares_b = draws / total_b[:, None]
        tail = (1.0 - coverage) / 2.0
        q = torch.tensor([tail, 1.0 - tail], dtype=torch.float64)
        bounds = torch.quantile(draws, q, dim=0).T.tolist()
        share_bounds = torch.nanquantile(shares_b, q, dim=0).T.tolist()
    else:
        bounds = share_bounds = [[nan, nan]] * (k + 1)
    share = (lambda x: x / value) if value > 0 else (lambda x: nan)

    def part(j: int, x: float) -> Part:
        low, high = bounds[j]
        s_low, s_high = share_bounds[j] if value > 0 else (nan, nan)
        return Part(x, float(low), float(high), share(x), float(s_low), float(s_high))

    return Shares(
        method=method,
        causes=tuple(causes),
        parts={c: part(i, phi[i]) for i, c in enumerate(causes)},
        together=k3_interval(subsets[full], resamples=resamples, seed=seed, coverage=coverage)
        if k
        else K3(0.0, nan, nan),
        residual=part(k, residual),
        total=k3_interval(total, resamples=resamples, seed=seed, coverage=coverage),
        passes=len(masks),
    )
