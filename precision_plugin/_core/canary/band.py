"""The canary's band: how far its k3 may move from the first check's floor by rounding alone.

At the first check (the floor) the canary's per-token k3 values ``expm1(d) - d`` (``d = log π -
log μ``) are what two engines' rounding makes of these tokens. A later check at other weights
rounds differently, so its mean k3 is a fresh draw from about the same distribution. The band's
upper edge is a one-sided ``1 - alpha`` prediction bound for that fresh mean: a seeded bootstrap
of the floor's tokens gives the spread of one mean, ``q`` its ``1 - alpha`` quantile, and a fresh
mean minus the floor's own estimate spreads ``sqrt(2)`` times as wide, so ``upper = floor +
sqrt(2) * (q - floor)``. Heavy tails (a few tokens carrying the k3) widen it by themselves.

With a precision reference (the learner's own log-probs of the canary in float32, beside its
policy-dtype ones) the statistic is the canary's k3 divided by the reference's, ``k3(learner,
rollout) / k3(learner, learner in float32)``: how many times the rounding of the policy dtype
itself the two engines disagree. Training moves the weights and the canary's tokens, and the
rounding grows or shrinks with them (docs/canary.md: by orders of magnitude over a clean run of
the recipe); the reference moves with it, the ratio does not.
The bootstrap then resamples tokens in pairs and takes the ratio of the two means.

A floor of exactly 0 (both sides bit-identical on every canary token) has no spread to resample:
then a later k3 is out of band only above ``abs_tol``, stated with the band. ``abs_tol`` is also
the least width of any band.

Every floor gets a finite band or one clear refusal, never a NaN edge:

- a reference whose k3 is 0 on every token (float32 computes what the policy dtype does) measures
  no rounding: the band holds the raw k3 (``normalized`` false, ``note`` says why);
- a reference that is 0 on so many tokens that some bootstrap resample draws none of the others
  (its ratio would be ``0/0``): the ratio is not defined on every resample, so the band holds
  the raw k3 as well (``note`` says how many tokens the reference measured);
- a floor whose mean k3, or its band, overflows float64 (k3 terms near 1e308, log-ratios of
  hundreds of nats) is refused: no later check could be compared with it;
- NaN, infinite or negative k3 terms are refused at the boundary (``token_k3`` turns a
  non-finite log-prob into ``inf``, which a floor refuses).

A later check's statistic over a normalized band needs its reference (refused without one); a
reference whose k3 is 0 at that check gives the ratio's limit: 0 when the check's k3 is 0 too,
else ``inf`` (out of band).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from precision_plugin._base.boundary import checked, each, in_range, same_length
from precision_plugin._core.metrics.k3 import k3_term
from precision_plugin.errors import PrecisionConfigError

if TYPE_CHECKING:
    import torch

#: Default one-sided false-alarm rate of one check (two consecutive checks raise an alarm).
ALPHA = 1e-3
#: Bootstrap resamples of the floor (deterministic: seeded).
RESAMPLES = 20_000
#: The smallest k3 a band ever tolerates above its floor (a floor of 0 tolerates exactly this).
ABS_TOL = 1e-12
#: Most bootstrap resamples a band takes (8 MB of means; more buys no precision at alpha >= 1e-9
#: worth the minutes).
MAX_RESAMPLES = 1_000_000
#: Largest seed torch's generator takes.
MAX_SEED = 2**63 - 1


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def layout_difference(
    first: Sequence[Sequence[float]], second: Sequence[Sequence[float]]
) -> str | None:
    """How two sides' per-sequence log-probs cover different tokens (``"1 row vs 2 rows"``,
    ``"row 0: 1 vs 2 tokens"``), or ``None`` when they have the same layout."""
    if len(first) != len(second):
        return f"{_count(len(first), 'row')} vs {_count(len(second), 'row')}"
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        if len(a) != len(b):
            return f"row {i}: {len(a)} vs {_count(len(b), 'token')}"
    return None


@checked
def token_k3(learner: Sequence[Sequence[float]], rollout: Sequence[Sequence[float]]) -> list[float]:
    """Per-token ``k3_term(d)`` (``expm1(d) - d``) with ``d = log π - log μ`` (learner minus
    rollout), in float64, flattened in sequence order; a NaN or infinite log-prob gives ``inf``
    (the canary counts a NaN ``d``, which ``k3_term`` passes through, as infinitely far)."""
    differ = layout_difference(learner, rollout)
    if differ is not None:
        raise PrecisionConfigError(
            f"token_k3(): learner and rollout cover different tokens ({differ}); pass the same "
            f"tokens on both sides."
        )
    out: list[float] = []
    for lrow, rrow in zip(learner, rollout, strict=True):
        for a, b in zip(lrow, rrow, strict=True):
            d = float(a) - float(b)
            out.append(math.inf if math.isnan(d) else k3_term(d))
    return out


@checked
@dataclass(frozen=True)
class CanaryBand:
    """The floor's statistic over ``tokens`` canary tokens (its mean k3, or with ``normalized``
    its mean k3 over the reference's) and the largest a later check may show by rounding alone
    (``upper``; ``alpha`` one-sided, ``resamples`` bootstrap draws); ``note`` says why a band
    given a reference holds the raw k3 (empty otherwise)."""

    floor: float
    upper: float
    tokens: int
    alpha: float
    resamples: int
    abs_tol: float
    normalized: bool = False
    note: str = ""

    def statistic(self, per_token_k3: Sequence[float], reference_k3: float | None) -> float:
        """A check's statistic: its mean k3, over ``reference_k3`` (the mean k3 of the learner
        against itself in float32) when the band is ``normalized`` (module docstring: a
        reference of 0 gives 0 for a k3 of 0, else ``inf``; a normalized band refuses a check
        without its reference)."""
        mean = math.fsum(per_token_k3) / len(per_token_k3) if per_token_k3 else math.nan
        if not self.normalized:
            return mean
        if reference_k3 is None or not reference_k3 >= 0:
            raise PrecisionConfigError(
                f"CanaryBand.statistic(): the band holds the k3 over the float32 reference "
                f"(normalized), but reference_k3 is {reference_k3!r}; pass the reference's mean "
                f"k3 (>= 0) of this check's canary tokens."
            )
        if reference_k3 > 0:
            return mean / reference_k3
        return 0.0 if mean == 0 else math.inf

    def contains(self, k3: float) -> bool:
        """Whether ``k3`` is within the band (at most ``upper``; NaN is not)."""
        return k3 <= self.upper

    def ratio(self, k3: float) -> float:
        """``k3 / floor``; with a floor of 0: 1.0 for a k3 of 0, else ``inf``."""
        if self.floor > 0:
            return k3 / self.floor
        return 1.0 if k3 == 0 else math.inf


#: A one-sided false-alarm rate (``alpha`` of a band and of a ``CanaryMonitor``).
ALPHA_RANGE = in_range(1e-9, 0.5, why="a one-sided false-alarm rate")
#: A k3 tolerance (``abs_tol`` of a band and of a ``CanaryMonitor``).
ABS_TOL_RANGE = in_range(0, None, why="a k3 tolerance")
#: Per-token k3 values: each ``expm1(d) - d`` of a finite log-ratio, finite and >= 0.
K3_TERMS = each(in_range(0, None, why="a k3 term expm1(d) - d of finite log-probs"))


@checked(
    same_length(
        "per_token_k3",
        "reference_k3",
        fix="pass the reference's k3 of the same canary tokens, one per token",
    ),
    per_token_k3=K3_TERMS,
    reference_k3=K3_TERMS,
    alpha=ALPHA_RANGE,
    resamples=in_range(100, MAX_RESAMPLES, integer=True, why="bootstrap resamples"),
    seed=in_range(0, MAX_SEED, integer=True, why="a seed torch's generator takes"),
    abs_tol=ABS_TOL_RANGE,
)
def canary_band(
    per_token_k3: Sequence[float],
    *,
    reference_k3: Sequence[float] | None = None,
    alpha: float = ALPHA,
    resamples: int = RESAMPLES,
    seed: int = 0,
    abs_tol: float = ABS_TOL,
) -> CanaryBand:
    """The band of a canary whose floor check gave ``per_token_k3`` (and, per token, the
    precision reference's ``reference_k3``; module docstring)."""
    import torch

    values = torch.tensor([float(v) for v in per_token_k3], dtype=torch.float64)
    n = int(values.numel())
    if n == 0:
        raise PrecisionConfigError(
            "canary_band(): per_token_k3 is empty; pass the floor check's k3 of at least one "
            "canary token (token_k3(learner, rollout))."
        )
    reference, note = None, ""
    if reference_k3 is not None:
        reference = torch.tensor([float(v) for v in reference_k3], dtype=torch.float64)
        measured = int((reference > 0).sum())
        if measured == 0:  # no rounding to measure against (float32): the raw k3
            reference = None
            note = (
                "the float32 reference equals the learner on every canary token (its k3 is 0), "
                "so the band holds the raw k3"
            )
    if reference is not None:
        band = _bootstrap(values, reference, alpha, resamples, seed, abs_tol)
        if band is not None:
            return band
        note = (
            f"the float32 reference measures rounding on {measured} of {n} canary tokens, too "
            f"few for the ratio: some bootstrap resamples draw none of them (0/0), so the band "
            f"holds the raw k3"
        )
    band = _bootstrap(values, None, alpha, resamples, seed, abs_tol)
    assert band is not None  # no reference: every resample's mean is defined
    return dataclasses.replace(band, note=note)


def _bootstrap(
    values: torch.Tensor,
    reference: torch.Tensor | None,
    alpha: float,
    resamples: int,
    seed: int,
    abs_tol: float,
) -> CanaryBand | None:
    """The band of ``values`` (over ``reference`` when given; module docstring); ``None`` when
    a resample's reference mean is 0 (the ratio is not defined on it). Refuses a floor or an
    upper edge past float64."""
    import torch

    n = int(values.numel())
    floor = float(values.mean()) / (float(reference.mean()) if reference is not None else 1.0)
    normalized = reference is not None
    upper = floor + abs_tol
    if math.isfinite(floor) and floor != 0.0:
        generator = torch.Generator().manual_seed(seed)
        means = torch.empty(resamples, dtype=torch.float64)
        chunk = max(1, (1 << 22) // n)
        for at in range(0, resamples, chunk):
            rows = min(chunk, resamples - at)
            index = torch.randint(0, n, (rows, n), generator=generator)
            means[at : at + rows] = values[index].mean(dim=1)
            if reference is not None:
                below = reference[index].mean(dim=1)
                if not bool((below > 0).all()):
                    return None
                means[at : at + rows] /= below
        q = float(torch.quantile(means, 1.0 - alpha))
        upper = max(floor + math.sqrt(2.0) * max(q - floor, 0.0), floor + abs_tol)
    if not (math.isfinite(floor) and math.isfinite(upper)):
        top = float(values.max())
        raise PrecisionConfigError(
            f"canary_band(): the floor's {'k3 ratio' if normalized else 'mean k3'} or its band "
            f"overflows float64 (k3 terms up to {top:.3g} over {n} tokens: log-ratios of "
            f"hundreds of nats), so no later check could be compared with it; score the same "
            f"canary tokens on both sides with the same model."
        )
    return CanaryBand(floor, upper, n, alpha, resamples, abs_tol, normalized)
