"""Does the growth fit hold for the longest sequences? The check behind a projection.

The projection carries the random walk ``S(L) ~ Normal(drift·L, variance·L)`` far beyond the
measured lengths. When the longest sequences spread more than the fit from the shorter ones
predicts (a correlation between the tokens of a sequence that grows with length), the
projection is optimistic. ``check_growth`` tests that: the longest third of the sequences
against the walk fitted to the rest, by the ratio of their per-token variances (an F test,
one-sided: only a faster growth is a risk). A significant excess widens the projection's
variance interval to the long sequences' own (``GrowthCheck.widened_high``) and the report
says why; lengths too uniform to tell a slope from noise make the check impossible, and the
report says that instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import annotated_types as at
from scipy import stats

from precision_plugin._base.boundary import checked, same_length
from precision_plugin._base.constraints import Each, Finite, Whole
from precision_plugin._core.intervals import COVERAGE, MAX_COUNT, variance_robust

#: One-sided level of the misfit test.
ALPHA = 0.05
#: Fewest sequences for the check (at least two long and three shorter ones).
MIN_SEQUENCES = 6
#: The long sequences must be at least this many times longer, on average, than the rest.
MIN_LENGTH_RATIO = 1.5


@checked
@dataclass(frozen=True)
class GrowthCheck:
    """The misfit check's outcome: ``status`` ``"ok"``, ``"misfit"`` or ``"untestable"``;
    ``ratio`` the long sequences' per-token variance over the shorter ones' (1 when the walk
    holds), ``p_value`` its one-sided F test, ``widened_high`` the upper end the projection's
    variance interval takes on a misfit (NaN otherwise), ``message`` one sentence."""

    status: str
    message: str
    long_sequences: int = 0
    long_min_length: int = 0
    ratio: float = math.nan
    p_value: float = math.nan
    widened_high: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _fit(pairs: Sequence[tuple[float, int]]) -> tuple[float, float]:
    drift = sum(s for s, _ in pairs) / sum(n for _, n in pairs)
    ss = sum((s - drift * n) ** 2 / n for s, n in pairs)
    return drift, ss


@checked(
    same_length(
        "seq_log_ratio", "seq_lengths", fix="pass one log-ratio sum and one length per sequence"
    )
)
def check_growth(
    seq_log_ratio: Annotated[Sequence[float], Each(Finite())],
    seq_lengths: Annotated[Sequence[int], Each(Whole(), at.Ge(0), at.Le(MAX_COUNT))],
) -> GrowthCheck:
    """Test the longest third of the sequences (by valid tokens) against the random walk fitted
    to the rest (see the module docstring); a sequence of no valid token (length 0) is left
    out."""
    pairs = sorted(
        ((float(s), int(n)) for s, n in zip(seq_log_ratio, seq_lengths, strict=True) if n > 0),
        key=lambda p: p[1],
    )
    n = len(pairs)
    if n < MIN_SEQUENCES:
        return GrowthCheck(
            "untestable",
            f"the growth check could not be made: {n} sequences, it needs {MIN_SEQUENCES}",
        )
    k = max(2, n // 3)
    rest, long = pairs[: n - k], pairs[n - k :]
    mean_rest = sum(x for _, x in rest) / len(rest)
    mean_long = sum(x for _, x in long) / k
    if mean_long < MIN_LENGTH_RATIO * mean_rest:
        return GrowthCheck(
            "untestable",
            f"the growth check could not be made: the lengths are too uniform (the longest "
            f"{k} average {mean_long:,.0f} tokens, the rest {mean_rest:,.0f}); pass a "
            f"--min-new-tokens well below --max-new-tokens so that lengths vary",
        )
    drift, ss_rest = _fit(rest)
    dof_rest = len(rest) - 1
    v_rest = ss_rest / dof_rest
    # Each long residual also carries the drift's error, (drift - true)·L with variance
    # σ²·L²/ΣL_rest: scaled out, so the ratio is F-distributed under the walk.
    rest_tokens = sum(x for _, x in rest)
    v_long = sum((s - drift * x) ** 2 / x / (1 + x / rest_tokens) for s, x in long) / k
    if not v_rest > 0:
        return GrowthCheck("untestable", "the growth check could not be made: no spread")
    ratio = v_long / v_rest
    p = float(stats.f.sf(ratio, k, dof_rest))
    common = dict(long_sequences=k, long_min_length=long[0][1], ratio=ratio, p_value=p)
    where = f"the {k} longest sequences (≥ {long[0][1]:,} tokens)"
    if p >= ALPHA:
        return GrowthCheck(
            "ok",
            f"growth check: {where} spread {ratio:.2g}x what the shorter ones predict "
            f"(p = {p:.2f}): consistent with the fit",
            **common,
        )
    residuals = [(s - drift * x) / math.sqrt(x) for s, x in long]
    _, high = variance_robust(v_long, residuals, COVERAGE)
    return GrowthCheck(
        "misfit",
        f"growth check: {where} spread {ratio:.2g}x what the shorter ones predict (p = "
        f"{p:.3f}): the variance grows faster than the fit says, so the projection's interval "
        f"is widened to theirs and the true value may lie beyond it",
        **common,
        widened_high=high,
    )
