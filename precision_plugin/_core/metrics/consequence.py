"""What the train/rollout mismatch does to RL: the consequence metrics, pure torch, float64.

An RL step weights (or masks) each sampled sequence by its importance ratio
``w = π(y)/μ(y) = exp(S)``, ``S = Σ_t (log π − log μ)`` over the sequence's tokens. From the
same per-token log-probs as
[`compute_mismatch`][precision_plugin._core.metrics.mismatch.compute_mismatch]
(NaN tokens left out and counted the same way):

========================== ================================================================
metric                     meaning
========================== ================================================================
``ess``                    normalized effective sample size of the sequence weights,
                           ``(Σ w)² / (n Σ w²)`` in (0, 1]: the share of the batch that
                           still counts after importance weighting (1: every sample)
``seq_mask_fraction_trl``  share of sequences TRL's default ``sequence_mask`` drops
                           (``w > 3``: ``vllm_importance_sampling_clip_max=3.0``, no lower
                           bound)
``seq_mask_fraction_verl`` share of sequences verl's sequence-level MIS drops (its
                           ``decoupled_seq_is_rs`` preset: ``w`` outside ``[0.5, 2.0]``)
``tis_clip_fraction``      share of tokens whose ratio ``π/μ`` a token-level TIS clip at
                           2.0 (verl's ``rollout_is_threshold`` default) truncates
========================== ================================================================

``ess`` is computed in log space (``log ESS = 2·LSE(S) − LSE(2S) − log n``), so sequences
whose weights over- or underflow float64 still count exactly. Everything reduces from sums
that add up across processes and micro-batches (``consequence_sums``), as the mismatch
metrics do, so the TRL telemetry over two processes reports what one process reports.

``fit_growth`` and ``project`` extrapolate to a longer generation: the sequence log-ratio as a
random walk with drift, ``S(L) ~ Normal(drift·L, variance·L)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import annotated_types as at
import torch

from precision_plugin._base.boundary import Invalid, Validator, at_least, checked, each, same_length
from precision_plugin._base.constraints import AtMost, Count, Each, Finite, Measured, Ordered, Whole
from precision_plugin._core.intervals import (
    COVERAGE,
    HEAVY_TAIL_KURTOSIS,
    HEAVY_TAIL_WARNING,
    TAIL_LAWS,
    Interval,
    chi2_ppf,
    clopper_pearson,
    ess_hull,
    excess_kurtosis,
    heavy_tails,
    tail_bounds,
    variance_normal,
    variance_robust,
    z_value,
)
from precision_plugin._core.metrics.drift import drift_fit
from precision_plugin._core.metrics.inputs import SAME_TOKENS, log_probs_arg, mask_arg
from precision_plugin._core.metrics.shard_sums import masked_log_ratio
from precision_plugin.errors import PrecisionConfigError

#: A share of sequences or tokens (NaN: none measured).
Share = Annotated[float, Finite(nan_ok=True), at.Ge(0), at.Le(1)]
#: A standard error or a variance (NaN: fewer than two sequences).
Spread = Annotated[float, Finite(nan_ok=True), at.Ge(0)]


@checked
@dataclass(frozen=True)
class SequenceMask:
    """A sequence-level importance-sampling mask: sequences whose ratio ``w = exp(S)`` lies
    outside ``[low, high]`` are dropped (``None``: no bound on that side)."""

    key: str
    system: str
    label: str
    low: Annotated[float | None, Finite(), at.Gt(0)]
    high: Annotated[float | None, Finite(), at.Gt(0), Ordered("low", ">")]
    setting: str
    source: str

    @property
    def bounds(self) -> str:
        """The kept range, as the docs and the table show it."""
        if self.low is None:
            return f"w ≤ {self.high:g}"
        if self.high is None:
            return f"w ≥ {self.low:g}"
        return f"{self.low:g} ≤ w ≤ {self.high:g}"

    def masked(self, seq_log_ratio: torch.Tensor) -> torch.Tensor:
        """Which sequences the mask drops, from their log-ratios ``S`` (compared in log space,
        so no weight overflows)."""
        out = torch.zeros_like(seq_log_ratio, dtype=torch.bool)
        if self.low is not None:
            out |= seq_log_ratio < math.log(self.low)
        if self.high is not None:
            out |= seq_log_ratio > math.log(self.high)
        return out


#: TRL 1.16 defaults (GRPOConfig): mode "sequence_mask", clip_max 3.0, clip_min None.
TRL_SEQUENCE_MASK = SequenceMask(
    "trl",
    "TRL",
    "TRL's default sequence_mask",
    None,
    3.0,
    "GRPOConfig defaults: vllm_importance_sampling_mode='sequence_mask', "
    "vllm_importance_sampling_clip_max=3.0, vllm_importance_sampling_clip_min=None",
    "huggingface/trl trl/trainer/grpo_config.py, trl/trainer/grpo_trainer.py "
    "(_generate_and_score_completions)",
)
#: verl's Seq-MIS preset: RolloutCorrectionConfig.decoupled_seq_is_rs() rejects whole sequences
#: with rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0".
VERL_SEQUENCE_MASK = SequenceMask(
    "verl",
    "verl",
    "verl's Seq-MIS preset",
    0.5,
    2.0,
    "RolloutCorrectionConfig.decoupled_seq_is_rs() (Seq-MIS): rollout_rs='seq_sum_k1', "
    "rollout_rs_threshold='0.5_2.0'",
    "volcengine/verl verl/trainer/config/algorithm.py (decoupled_seq_is_rs), "
    "verl/trainer/ppo/rollout_corr_helper.py (compute_rollout_rejection_mask)",
)
SEQUENCE_MASKS: tuple[SequenceMask, ...] = (TRL_SEQUENCE_MASK, VERL_SEQUENCE_MASK)

#: Token-level TIS clip: verl's rollout_is_threshold default (decoupled_token_is), slime's
#: --tis-clip 2.0 and the paper's GRPO-Token-TIS (--tis_c 2). TRL's token_truncate clips at 3.0.
TIS_CLIP = 2.0

#: The consequence metrics, in the order reports show them.
CONSEQUENCE_METRICS: tuple[str, ...] = (
    "ess",
    *(f"seq_mask_fraction_{m.key}" for m in SEQUENCE_MASKS),
    "tis_clip_fraction",
)

#: The entries of
#: [`consequence_sums`][precision_plugin._core.metrics.consequence.consequence_sums]'s first tensor:
#: counts that add up across shards.
COUNT_FIELDS: tuple[str, ...] = (
    "sequences",
    "tokens",
    *(f"seq_masked_{m.key}" for m in SEQUENCE_MASKS),
    "tis_clipped",
)


@checked
@dataclass(frozen=True)
class Consequence:
    """The consequence metrics of a batch (see the module docstring); NaN without sequences."""

    ess: Annotated[float, Finite(nan_ok=True), at.Ge(0)]
    seq_mask_fraction_trl: Share
    seq_mask_fraction_verl: Share
    tis_clip_fraction: Share
    sequences: Count
    tokens: Annotated[int, Whole(), at.Ge(0), Ordered("sequences", ">=")]

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready dict."""
        return asdict(self)


@checked(SAME_TOKENS, train_logprobs=log_probs_arg, rollout_logprobs=log_probs_arg, mask=mask_arg)
def consequence_sums(
    train_logprobs: Any, rollout_logprobs: Any, mask: Any | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums from which the consequence metrics of a batch follow exactly.

    Returns ``(counts, log_moments)``: ``counts`` a float64 tensor ordered as ``COUNT_FIELDS``
    (sequences with a valid token, valid tokens, sequences each mask drops, tokens the TIS
    clip truncates), which add up across shards; ``log_moments`` ``[log Σ w, log Σ w²]`` over
    the sequences (``-inf`` without one), which combine across shards by ``logsumexp``
    ([`combine_log_moments`][precision_plugin._core.metrics.consequence.combine_log_moments]).
    Inputs,
    masking and NaN handling as for
    [`compute_mismatch`][precision_plugin._core.metrics.mismatch.compute_mismatch].
    """
    return consequence_sums_of(train_logprobs, rollout_logprobs, mask)


def consequence_sums_of(
    train_logprobs: Any, rollout_logprobs: Any, mask: Any | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[`consequence_sums`][precision_plugin._core.metrics.consequence.consequence_sums] without its
    boundary check of the values (a device sync): for the training telemetry, on the trainer's own
    tensors."""
    d, valid, _, _ = masked_log_ratio(
        train_logprobs, rollout_logprobs, mask, caller="consequence_sums"
    )
    has = valid.any(dim=1)
    s = d.sum(dim=1)[has]
    counts = torch.stack(
        [
            has.sum(),
            valid.sum(),
            *(m.masked(s).sum() for m in SEQUENCE_MASKS),
            (valid & (d > math.log(TIS_CLIP))).sum(),
        ]
    ).to(torch.float64)
    if s.numel():
        moments = torch.stack([torch.logsumexp(s, 0), torch.logsumexp(2.0 * s, 0)])
    else:
        moments = d.new_full((2,), -math.inf)
    return counts, moments


@checked(log_moments=Validator("consequence_sums()'s second tensor", lambda v: _log_moments(v)))
def combine_log_moments(log_moments: torch.Tensor) -> torch.Tensor:
    """``[k, 2]`` (or flat ``[2k]``) shards' ``log_moments`` -> the ``[2]`` of their union."""
    rows = log_moments.to(torch.float64).reshape(-1, 2)
    if not bool(torch.isfinite(rows).any()):
        return rows.new_full((2,), -math.inf)
    return torch.logsumexp(rows, dim=0)


def _counts(value: torch.Tensor) -> torch.Tensor:
    if tuple(value.shape) != (len(COUNT_FIELDS),):
        raise Invalid(
            f"has shape {tuple(value.shape)}, not ({len(COUNT_FIELDS)},); pass the first tensor "
            f"consequence_sums() returns (summed over shards)"
        )
    return value


def _log_moments(value: torch.Tensor) -> torch.Tensor:
    flat = value.dim() == 1 and value.shape[0] % 2 == 0
    if not (flat or (value.dim() == 2 and value.shape[1] == 2)):
        raise Invalid(
            f"has shape {tuple(value.shape)}; pass the second tensor consequence_sums() returns "
            f"(2 values), or several shards' as [k, 2] or concatenated"
        )
    return value


@checked(
    counts=Validator("consequence_sums()'s first tensor", _counts),
    log_moments=Validator("consequence_sums()'s second tensor", _log_moments),
)
def consequence_from_sums(counts: torch.Tensor, log_moments: torch.Tensor) -> Consequence:
    """The metrics from (summed) ``counts`` and (combined) ``log_moments``."""
    c = dict(zip(COUNT_FIELDS, (float(v) for v in counts.double().cpu()), strict=True))
    lse1, lse2 = (float(v) for v in combine_log_moments(log_moments.cpu()))
    n, tokens = c["sequences"], c["tokens"]
    nan = math.nan
    ess = math.exp(2.0 * lse1 - lse2 - math.log(n)) if n > 0 and math.isfinite(lse1) else nan
    return Consequence(
        ess=min(ess, 1.0) if n > 0 else nan,  # (Σw)² <= nΣw²: only rounding can exceed 1
        seq_mask_fraction_trl=c["seq_masked_trl"] / n if n > 0 else nan,
        seq_mask_fraction_verl=c["seq_masked_verl"] / n if n > 0 else nan,
        tis_clip_fraction=c["tis_clipped"] / tokens if tokens > 0 else nan,
        sequences=int(n),
        tokens=int(tokens),
    )


@checked(SAME_TOKENS, train_logprobs=log_probs_arg, rollout_logprobs=log_probs_arg, mask=mask_arg)
def compute_consequence(
    train_logprobs: Any, rollout_logprobs: Any, mask: Any | None = None
) -> Consequence:
    """The consequence metrics of one batch (``[batch, seq]`` log-probs of the sampled tokens
    under the trainer, π, and the rollout engine, μ, with an optional mask)."""
    return consequence_from_sums(*consequence_sums(train_logprobs, rollout_logprobs, mask))


# -- growth with length: fit and projection ---------------------------------------------------

_Z = z_value(COVERAGE)  # 1.645: a 90 % two-sided interval


@checked
@dataclass(frozen=True)
class GrowthFit:
    """The sequence log-ratio as a random walk with drift: ``S(L) ~ Normal(drift·L,
    variance·L)`` for a completion of ``L`` tokens.

    ``drift`` is ``−KL(μ‖π)`` per token, the expectation of ``S / L`` under the rollout's
    sampling: estimated from the sequences' k3 sums ``K`` (``−Σ K / Σ L``, ``drift_from="k3"``)
    when the fit is given them, else by ``Σ S / Σ L`` (``"k1"``), with its standard error (the
    same random-walk formula). Both estimate the same drift, k3 with far less noise: a
    projection many times longer than the measured completions carries the drift's error with
    it. ``variance`` is ``Σ (S − drift·L)² / L / (n − 1)`` per token with its
    ``COVERAGE`` chi-square interval (``n − 1`` degrees of freedom). Measured over
    completions of different lengths, ``variance`` includes whatever correlation the tokens
    of one sequence have at those lengths; a correlation that grows beyond them makes longer
    sequences spread faster than the model says. ``tis_clip_fraction`` is the measured
    per-token share, length-independent under the model, with a Clopper-Pearson interval.
    ``variance_robust_low``/``_high`` is the interval the projection uses
    ([`variance_robust`][precision_plugin._core.intervals.variance_robust]: it holds for
    heavy-tailed
    log-ratios, where the chi-square interval is too narrow); ``kurtosis`` the residuals'
    excess kurtosis it was sized with: the tail statistic, whose crossing of
    ``HEAVY_TAIL_KURTOSIS`` sets ``warning`` (``HEAVY_TAIL_WARNING``). ``variance_tail_high``:
    the high end the ESS intervals span
    ([`tail_bounds`][precision_plugin._core.intervals.tail_bounds]; see
    [`ess_interval`][precision_plugin._core.metrics.consequence.ess_interval]).
    """

    sequences: Count
    tokens: Annotated[int, Whole(), at.Ge(0), Ordered("sequences", ">=")]
    drift: Measured
    drift_stderr: Spread
    variance: Spread
    variance_low: Spread
    variance_high: Annotated[float, Finite(nan_ok=True), at.Ge(0), Ordered("variance_low", ">=")]
    tis_clip: Interval
    drift_from: str = "k1"
    variance_robust_low: Spread = math.nan
    variance_robust_high: Annotated[
        float, Finite(nan_ok=True), at.Ge(0), Ordered("variance_robust_low", ">=")
    ] = math.nan
    kurtosis: float = math.nan
    variance_tail_high: float = math.nan

    @property
    def warning(self) -> str:
        """``HEAVY_TAIL_WARNING`` where the residuals' excess kurtosis crosses
        ``HEAVY_TAIL_KURTOSIS``, else empty."""
        return HEAVY_TAIL_WARNING if heavy_tails(self.kurtosis) else ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``tail``: the tail statistic, its threshold and the warning)."""
        out = asdict(self)
        out["model"] = "S(L) ~ Normal(drift*L, variance*L)"
        out["coverage"] = COVERAGE
        out["tail"] = {
            "statistic": "excess kurtosis (G2) of the residuals (S - drift*L)/sqrt(L)",
            "value": self.kurtosis,
            "threshold": HEAVY_TAIL_KURTOSIS,
            "laws": list(TAIL_LAWS),
            "warning": self.warning,
        }
        return out


@checked(
    same_length(
        "seq_log_ratio",
        "seq_lengths",
        "seq_kl",
        fix="pass one value per sequence in each (MismatchMetrics.seq_log_ratio, .seq_lengths)",
    ),
    seq_lengths=each(at_least(0)),
    clipped_tokens=at_least(0),
)
def fit_growth(
    seq_log_ratio: Annotated[Sequence[float], Each(Finite())],
    seq_lengths: Sequence[int],
    clipped_tokens: Annotated[int, AtMost("seq_lengths", sum, "the tokens of the sequences")] = 0,
    *,
    seq_kl: Annotated[Sequence[float] | None, Each(Finite())] = None,
) -> GrowthFit:
    """Fit ``GrowthFit`` to sequences' log-ratios ``S_i`` and lengths ``L_i`` (valid tokens);
    ``clipped_tokens`` of the ``Σ L_i`` tokens had a ratio above ``TIS_CLIP``. ``seq_kl``: each
    sequence's sum of k3 terms (``expm1(d) − d``, ``d = log π − log μ``), for the drift."""
    if seq_kl is not None:
        kl = [float(k) for k, n in zip(seq_kl, seq_lengths, strict=True) if n > 0]
    pairs = [(float(s), int(n)) for s, n in zip(seq_log_ratio, seq_lengths, strict=True) if n > 0]
    n = len(pairs)
    tokens = sum(length for _, length in pairs)
    nan = math.nan
    if not 0 <= clipped_tokens <= tokens:
        raise PrecisionConfigError(
            f"fit_growth: clipped_tokens={clipped_tokens} is not between 0 and the "
            f"{tokens} tokens of the sequences; pass the count of tokens above the clip."
        )
    if n == 0:
        return GrowthFit(0, 0, nan, nan, nan, nan, nan, Interval(nan, nan, nan))
    lengths = [length for _, length in pairs]
    drift, stderr, variance = drift_fit(lengths, [s for s, _ in pairs])
    if seq_kl is not None:
        drift, stderr, _ = drift_fit(lengths, [-k for k in kl])
    low, high = variance_normal(variance, n, COVERAGE)
    k1 = sum(s for s, _ in pairs) / tokens
    residuals = [(s - k1 * length) / math.sqrt(length) for s, length in pairs]
    robust = variance_robust(variance, residuals, COVERAGE)
    _, tail_high = tail_bounds(variance, residuals, COVERAGE)
    return GrowthFit(
        n,
        tokens,
        drift,
        stderr,
        variance,
        low,
        high,
        _exact_share(clipped_tokens, tokens),
        "k1" if seq_kl is None else "k3",
        *robust,
        excess_kurtosis(residuals),
        tail_high,
    )


def _tail_range(fit: GrowthFit) -> tuple[float, float]:
    """The variance range the tail-aware intervals span: the robust interval's low end to the
    larger of ``variance_tail_high`` and the robust high end (which a misfit check may widen);
    the normal-model interval where the robust one is missing."""
    low, high = fit.variance_robust_low, fit.variance_robust_high
    if not (math.isfinite(low) and math.isfinite(high)):
        return fit.variance_low, fit.variance_high
    if math.isfinite(fit.variance_tail_high):
        high = max(high, fit.variance_tail_high)
    return low, high


@checked(lengths=each(at_least(1)))
def ess_interval(fit: GrowthFit, lengths: Sequence[int]) -> Interval:
    """The expected ESS of a batch of sequences of ``lengths`` tokens under ``fit``, with its
    ``COVERAGE`` interval that holds for heavy tails
    ([`ess_hull`][precision_plugin._core.intervals.ess_hull]: normal and Student-t-3 sums, variances
    from the robust low end to ``variance_tail_high``). The measured batch: its own lengths;
    a projected batch of ``N`` at ``L`` tokens: ``[L] * N``. Check ``fit.warning``."""
    if not lengths or math.isnan(fit.variance):
        return Interval(math.nan, math.nan, math.nan)
    low, high = _tail_range(fit)
    return Interval(*ess_hull(fit.variance, low, high, fit.drift, list(lengths)))


def _exact_share(k: int, n: int) -> Interval:
    """A share ``k / n`` with its Clopper-Pearson interval at ``COVERAGE``."""
    if n <= 0:
        return Interval(math.nan, math.nan, math.nan)
    return Interval(k / n, *clopper_pearson(k, n, COVERAGE))


def chi2_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile of the chi-square distribution with ``dof`` degrees of freedom
    (``scipy.stats.chi2.ppf``)."""
    if not 0.0 < p < 1.0 or dof < 1:
        raise PrecisionConfigError(f"chi2_quantile: need 0 < p < 1 and dof >= 1, got {p}, {dof}")
    return chi2_ppf(p, dof)


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _t3_cdf(x: float) -> float:
    """The CDF of a Student t with 3 degrees of freedom scaled to unit variance (closed form:
    ``T = x·√3``, ``u = T/√3 = x``)."""
    return 0.5 + (math.atan(x) + x / (1.0 + x * x)) / math.pi


def mask_fraction(
    mask: SequenceMask, drift: float, variance: float, length: float, *, law: str = "normal"
) -> float:
    """Share of length-``length`` sequences ``mask`` drops under ``S ~ Normal(drift·L,
    variance·L)`` (``law="t3"``: ``S = drift·L + √(variance·L)·T``, ``T`` a Student t with 3
    degrees of freedom scaled to unit variance)."""
    mean, sd = drift * length, math.sqrt(max(variance, 0.0) * length)
    if not (math.isfinite(mean) and math.isfinite(sd)):
        return math.nan
    cdf = _t3_cdf if law == "t3" else _normal_cdf

    def below(log_bound: float) -> float:  # P(S < bound)
        if sd == 0.0:
            return 1.0 if mean < log_bound else 0.0
        return cdf((log_bound - mean) / sd)

    out = 0.0
    if mask.low is not None:
        out += below(math.log(mask.low))
    if mask.high is not None:
        out += 1.0 - below(math.log(mask.high))
    return min(max(out, 0.0), 1.0)


@checked
@dataclass(frozen=True)
class Projection:
    """The consequence metrics the ``GrowthFit`` predicts for completions of ``length`` tokens,
    each with its ``COVERAGE`` interval (the fit's uncertainty carried through)."""

    length: int
    ess: Interval
    seq_mask_fraction_trl: Interval
    seq_mask_fraction_verl: Interval
    tis_clip_fraction: Interval

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out: dict[str, Any] = {"length": self.length}
        for name in CONSEQUENCE_METRICS:
            out[name] = getattr(self, name).to_dict()
        return out


#: Points per parameter when searching the fit's uncertainty box for a projection's extremes.
_GRID = 25


def _grid(low: float, high: float, *extra: float) -> list[float]:
    if not (math.isfinite(low) and math.isfinite(high)):
        return [math.nan]
    points = [low + (high - low) * i / (_GRID - 1) for i in range(_GRID)]
    return points + [min(max(x, low), high) for x in extra if math.isfinite(x)]


@checked(length=at_least(1))
def project(fit: GrowthFit, length: int, *, tails: bool = False) -> Projection:
    """``fit`` carried to completions of ``length`` tokens.

    ``ess`` is the lognormal weights' ``E[w]² / E[w²] = exp(−variance·L)`` (a drift common to
    all sequences does not change it); a mask's share is the normal probability of ``S``
    outside its bounds. The value is the fit's point estimate; the interval is the range over
    the box of drifts within ±z standard errors and variances within their robust interval (a grid,
    plus the drift that centres ``S`` in the mask's bounds: a two-sided share is not monotone
    in either parameter). ``tails=True``: the masks' intervals are the hull over ``TAIL_LAWS``
    (normal and Student-t-3 sums) and variances up to ``variance_tail_high``, the interval that
    holds for heavy tails (``tests/unit/test_interval_calibration.py``).
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise PrecisionConfigError(
            f"project: length={length!r} is not a positive number of tokens; pass e.g. 4096."
        )
    nan = Interval(math.nan, math.nan, math.nan)
    v_low, v_high = fit.variance_low, fit.variance_high
    if math.isfinite(fit.variance_robust_low) and math.isfinite(fit.variance_robust_high):
        v_low, v_high = fit.variance_robust_low, fit.variance_robust_high  # heavy tails hold
    variances = _grid(v_low, v_high)
    laws: tuple[str, ...] = ("normal",)
    if tails:
        laws = TAIL_LAWS
        variances = _grid(*_tail_range(fit))
    if math.isnan(fit.variance) or math.isnan(variances[0]):
        return Projection(length, nan, nan, nan, fit.tis_clip)
    ess = Interval(
        math.exp(-fit.variance * length),
        math.exp(-v_high * length),
        math.exp(-v_low * length),
    )
    half = _Z * fit.drift_stderr
    masks = {}
    for m in SEQUENCE_MASKS:
        centre = [
            (math.log(m.low) + math.log(m.high)) / 2.0 / length
            if m.low is not None and m.high is not None
            else math.nan
        ]
        drifts = _grid(fit.drift - half, fit.drift + half, fit.drift, *centre)
        values = [
            mask_fraction(m, d, v, length, law=law)
            for d in drifts
            for v in variances
            for law in laws
        ]
        masks[m.key] = Interval(
            mask_fraction(m, fit.drift, fit.variance, length), min(values), max(values)
        )
    return Projection(
        length=length,
        ess=ess,
        seq_mask_fraction_trl=masks["trl"],
        seq_mask_fraction_verl=masks["verl"],
        tis_clip_fraction=fit.tis_clip,
    )
