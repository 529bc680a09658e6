"""Train/rollout mismatch metrics: pure torch, vectorised, masked and NaN-safe.

Inputs are the per-token log-probabilities of the *sampled* tokens under the training policy
π (``train_logprobs``, what the learner computes) and the rollout policy μ
(``rollout_logprobs``, what the sampler returned), with a mask of the tokens that count.
vLLM returns ``None``/``NaN`` for some tokens: such tokens are excluded and counted in
``nan_tokens``, never averaged in.

=============================== ==================================================== ==========
metric                          formula (over valid tokens; r = π/μ)                  healthy
=============================== ==================================================== ==========
``k1_kl``                       mean(log μ − log π)  (estimates KL(μ‖π) ≥ 0)         < 1e-4
``k3_kl``                       mean(r − 1 − log r)  (≥ 0, low variance)             < 1e-4
``prob_diff_mean``              mean |π − μ|                                          < 0.005
``prob_diff_max``               max |π − μ|
``prob_diff_std``               sample std (n − 1) of |π − μ|
``logp_abs_diff_mean``          mean |log π − log μ|
``logp_abs_diff_max``           max |log π − log μ|
``logp_sq_diff_half_mean``      mean ½(log π − log μ)²  (the k2 estimator)
``mult_prob_error``             mean exp|log π − log μ| = mean max(r, 1/r)  (≥ 1)    < 1.05
``prob_pearson``                Pearson correlation of π and μ                        ~1
``seq_log_ratio``               Σ_t (log π − log μ) per sequence
``drift_per_1k``                −1000·k1: Σ(log π − log μ) per 1,000 tokens          > −0.1
``drift_per_1k_se``             its standard error (the random-walk fit, ``drift_fit``)
=============================== ==================================================== ==========

Why the drift is −1000·k1: under the rollout policy, E_μ[Σ_t (log π − log μ)] = −L·KL(μ‖π) for
a sequence of L tokens, so the token-weighted mean of log π − log μ, times 1,000, is how much the
sequence log-ratio drifts per 1,000 tokens (the paper's Fig. 5 slope: BF16 −1.01, FP16 −0.07).
A least-squares slope of |Σ| against length measures the random walk's spread instead.

``ALIASES`` says which names other RL systems log for the same numbers, and when the two agree;
``tests/unit/test_aliases.py`` recomputes each of them with that system's own formula.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from precision_plugin._base.boundary import Validator, checked

# The modules this one was split into (issue 29); every name stays importable from here.
from precision_plugin._core.metrics.aliases import (  # noqa: F401
    _NEMO_KL,
    _NEMO_LOSS,
    _NEMO_NOTE,
    _NEMO_ONE_BATCH,
    _OAT,
    _OAT_NOTE,
    _OAT_ONE_PROCESS,
    _SKYRL,
    _SKYRL_NOTE,
    _TRL,
    _TRL_NOTE,
    _VERL_CORR,
    _VERL_CORR_NOTE,
    _VERL_CORR_WHEN,
    _VERL_DEBUG,
    _VERL_DEBUG_NOTE,
    _VERL_ONE_BATCH,
    _VERL_RC,
    ALIASES,
    SYSTEMS,
    Alias,
    alias_table,
    aliases_for,
)
from precision_plugin._core.metrics.drift import drift_fit, drift_per_1k, fit_drift  # noqa: F401
from precision_plugin._core.metrics.inputs import (  # noqa: F401
    _LENGTHS,
    _PER_SEQUENCE,
    _SUMS,
    LOGPROB_MAX,
    SAME_TOKENS,
    TokenCounts,
    _as_2d,
    _log_probs,
    _mask,
    _named_2d,
    _none_to_nan,
    log_probs_arg,
    mask_arg,
)
from precision_plugin._core.metrics.shard_sums import (  # noqa: F401
    SUM_FIELDS,
    _k3,
    _log_ratio,
    _maxima,
    _sums,
    masked_log_ratio,
    metrics_from_sums,
    mismatch_sums,
    sums_of,
)
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import MetricSettings


@checked
@dataclass(frozen=True)
class MismatchMetrics:
    """Mismatch between training policy π and rollout policy μ over a batch of sequences."""

    k1_kl: float
    k3_kl: float
    prob_diff_mean: float
    prob_diff_max: float
    prob_diff_std: float
    logp_abs_diff_mean: float
    logp_abs_diff_max: float
    logp_sq_diff_half_mean: float
    mult_prob_error: float
    prob_pearson: float
    drift_per_1k: float
    drift_per_1k_se: float
    tokens: int
    nan_tokens: int
    sequences: int
    seq_log_ratio: list[float] = field(default_factory=list)
    seq_lengths: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, float | int]:
        """The scalar metrics (no per-sequence lists), JSON-ready."""
        return {k: v for k, v in self.__dict__.items() if k not in ("seq_log_ratio", "seq_lengths")}

    @property
    def seq_kl(self) -> float:
        """Sequence-level KL estimate: mean over sequences of Σ (log μ − log π)."""
        if not self.seq_log_ratio:
            return math.nan
        return -sum(self.seq_log_ratio) / len(self.seq_log_ratio)


@checked(SAME_TOKENS, train_logprobs=log_probs_arg, rollout_logprobs=log_probs_arg, mask=mask_arg)
def compute_mismatch(
    train_logprobs: Any, rollout_logprobs: Any, mask: Any | None = None
) -> MismatchMetrics:
    """Compute every mismatch metric from per-token log-probs of the sampled tokens.

    ``train_logprobs`` (π) and ``rollout_logprobs`` (μ) are tensors (or nested lists) of shape
    ``[batch, seq]`` or ``[seq]``; ``mask`` (same shape, bool or 0/1) marks the tokens that
    count. A token whose log-prob is ``None`` or NaN on either side is excluded and counted in
    ``nan_tokens``; ``-inf`` is a probability of 0, a real disagreement: it counts, and the
    log-ratio metrics (``k1_kl``, ``k3_kl``, ...) become infinite. With no valid token every
    mean is NaN and ``tokens`` is 0. Bad shapes and values above 0 (probabilities passed as
    log-probs) raise [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError] (a
    ``ValueError``). Inputs are converted to float64 (lists directly, never via float32) and
    everything is computed in float64.
    """
    lp_train, lp_roll = train_logprobs, rollout_logprobs  # 2-D float64 (the boundary's)
    if lp_train.shape != lp_roll.shape:
        raise PrecisionConfigError(
            f"compute_mismatch: train_logprobs has shape {tuple(lp_train.shape)} but "
            f"rollout_logprobs has {tuple(lp_roll.shape)}; pass the log-probs of the same tokens."
        )
    if mask is None:
        base = torch.ones_like(lp_train, dtype=torch.bool)
    else:
        base = mask.to(torch.bool)
        if base.shape != lp_train.shape:
            raise PrecisionConfigError(
                f"compute_mismatch: mask has shape {tuple(base.shape)}, log-probs have "
                f"{tuple(lp_train.shape)}."
            )
    scored = ~(lp_train.isnan() | lp_roll.isnan())
    valid = base & scored
    nan_tokens = int((base & ~scored).sum())
    n = int(valid.sum())

    # Zero out invalid entries before any arithmetic so NaN never propagates.
    zeros = torch.zeros_like(lp_train)
    lt = torch.where(valid, lp_train, zeros)
    lr = torch.where(valid, lp_roll, zeros)
    log_ratio = _log_ratio(valid, lt, lr)  # log π − log μ
    seq_ratio = log_ratio.sum(dim=1)
    seq_len = valid.sum(dim=1).to(torch.float64)
    has_tokens = seq_len > 0

    if n == 0:
        nan = math.nan
        return MismatchMetrics(
            k1_kl=nan, k3_kl=nan, prob_diff_mean=nan, prob_diff_max=nan, prob_diff_std=nan,
            logp_abs_diff_mean=nan, logp_abs_diff_max=nan, logp_sq_diff_half_mean=nan,
            mult_prob_error=nan, prob_pearson=nan, drift_per_1k=nan, drift_per_1k_se=nan,
            tokens=0, nan_tokens=nan_tokens, sequences=0,
        )  # fmt: skip

    p_train = torch.where(valid, lt.exp(), zeros)
    p_roll = torch.where(valid, lr.exp(), zeros)
    prob_diff = (p_train - p_roll).abs()
    abs_log_ratio = log_ratio.abs()
    k3 = _k3(valid, log_ratio)

    def mean(x: torch.Tensor) -> float:
        return float(x.sum() / n)

    pt, pr = p_train[valid], p_roll[valid]
    prob_diff_std = float(prob_diff[valid].std()) if n >= 2 else math.nan
    if n >= 2 and pt.std() > 0 and pr.std() > 0:
        pearson = float(torch.corrcoef(torch.stack([pt, pr]))[0, 1])
    else:
        pearson = math.nan

    lengths, sums = seq_len[has_tokens], seq_ratio[has_tokens]
    drift, drift_se = drift_per_1k(lengths, sums)
    return MismatchMetrics(
        k1_kl=mean(-log_ratio),
        k3_kl=mean(k3),
        prob_diff_mean=mean(prob_diff),
        prob_diff_max=float(prob_diff.max()),
        prob_diff_std=prob_diff_std,
        logp_abs_diff_mean=mean(abs_log_ratio),
        logp_abs_diff_max=float(abs_log_ratio.max()),
        logp_sq_diff_half_mean=mean(0.5 * log_ratio * log_ratio),
        mult_prob_error=mean(torch.where(valid, abs_log_ratio.exp(), zeros)),
        prob_pearson=pearson,
        drift_per_1k=drift,
        drift_per_1k_se=drift_se,
        tokens=n,
        nan_tokens=nan_tokens,
        sequences=int(has_tokens.sum()),
        seq_log_ratio=[float(v) for v in sums],
        seq_lengths=[int(v) for v in lengths],
    )


def _metric_settings(value: Any) -> MetricSettings:
    if isinstance(value, Mapping):
        from precision_plugin.policy import PrecisionPolicy

        return PrecisionPolicy.from_dict({"metrics": dict(value)}).metrics
    return value  # type: ignore[no-any-return]


@checked(settings=Validator("policy.metrics or a dict of its keys", _metric_settings))
def verdict(
    metrics: MismatchMetrics, settings: MetricSettings | Mapping[str, Any] | None = None
) -> tuple[str, str]:
    """Classify a measurement: ``("ok" | "watch" | "problem" | "invalid", reason)``.

    Thresholds are on ``prob_diff_mean`` (verl's: < 0.005 normal, > 0.01 a precision problem;
    configurable in ``policy.metrics``, given here as a ``MetricSettings`` or a dict of its
    keys). ``invalid`` means no token could be compared; a token one side gives probability 0
    (log-prob ``-inf``) is a ``problem`` whatever the mean.
    """
    s = settings or MetricSettings()
    if metrics.tokens == 0 or math.isnan(metrics.prob_diff_mean):
        return "invalid", "no comparable tokens (all masked or NaN)"
    if math.isinf(metrics.logp_abs_diff_max):
        return "problem", (
            "a sampled token has probability 0 on one side (log-prob -inf): the policies "
            "disagree completely on it"
        )
    d = metrics.prob_diff_mean
    if d < s.prob_diff_ok:
        return "ok", f"prob_diff_mean {d:.2e} < {s.prob_diff_ok:g}"
    if d <= s.prob_diff_bad:
        return "watch", f"prob_diff_mean {d:.2e} between {s.prob_diff_ok:g} and {s.prob_diff_bad:g}"
    return "problem", f"prob_diff_mean {d:.2e} > {s.prob_diff_bad:g}: precision mismatch"


@checked
def prefixed(metrics: MismatchMetrics, prefix: str = "precision/") -> dict[str, float]:
    """Scalar metrics as ``{prefix + name: value}`` for a trainer's log."""
    return {prefix + k: float(v) for k, v in metrics.to_dict().items()}
