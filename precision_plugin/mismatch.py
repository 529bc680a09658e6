"""Train/rollout mismatch metrics: pure torch, vectorised, masked and NaN-safe.

Inputs are the per-token log-probabilities of the *sampled* tokens under the training policy
π (``train_logprobs``, what the learner computes) and the rollout policy μ
(``rollout_logprobs``, what the sampler returned), with a mask of the tokens that count.
vLLM returns ``None``/``NaN`` for some tokens: such tokens are excluded and counted in
``nan_tokens``, never averaged in.

=============================== ==================================================== ==========
metric                          formula (over valid tokens; r = π/μ)                  healthy
=============================== ==================================================== ==========
``k1_kl``                       mean(log μ − log π)                                  ~0
``k3_kl``                       mean(r − 1 − log r)  (≥ 0, low variance)             < 1e-4
``prob_diff_mean``              mean |π − μ|                                          < 0.005
``prob_diff_max``               max |π − μ|
``logp_abs_diff_mean``          mean |log π − log μ|
``prob_pearson``                Pearson correlation of π and μ                        ~1
``seq_log_ratio``               Σ_t (log π − log μ) per sequence
``seq_log_ratio_slope_per_1k``  least-squares slope of seq_log_ratio vs length ×1000
=============================== ==================================================== ==========
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import MetricSettings

#: Our metric name -> ``(system, name)`` pairs: what other systems log for the same (or the
#: closest) quantity. ``docs/concepts.md`` renders this table; a test keeps the two in sync.
ALIASES: dict[str, tuple[tuple[str, str], ...]] = {
    "k1_kl": (("verl", "rollout_corr/kl"), ("paper / oat", "kl_sample_train_v1")),
    "k3_kl": (("verl", "rollout_corr/k3_kl"), ("prime-rl", "mismatch_kl"), ("SkyRL", "vllm_kl")),
    "prob_diff_mean": (
        ("verl", "training/rollout_probs_diff_mean"),
        ("NeMo-RL", "token_mult_prob_error"),
    ),
    "prob_diff_max": (
        ("verl", "training/rollout_probs_diff_max"),
        ("paper / oat", "sampler_learner_prob_diff_max"),
    ),
    "logp_abs_diff_mean": (
        ("TRL", "sampling/sampling_logp_difference/mean"),
        ("slime", "train_rollout_logprob_abs_diff"),
    ),
    "prob_pearson": (("verl", "training/rollout_probs_pearson_corr"),),
    "logp_sq_diff_half_mean": (("paper / oat", "kl_sample_train_v2"),),
}


@dataclass(frozen=True)
class MismatchMetrics:
    """Mismatch between training policy π and rollout policy μ over a batch of sequences."""

    k1_kl: float
    k3_kl: float
    prob_diff_mean: float
    prob_diff_max: float
    logp_abs_diff_mean: float
    logp_sq_diff_half_mean: float
    prob_pearson: float
    seq_log_ratio_slope_per_1k: float
    seq_abs_log_ratio_slope_per_1k: float
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


def _none_to_nan(x: Any) -> Any:
    """Replace ``None`` (a token an engine returned no log-prob for) by NaN in nested lists."""
    if x is None:
        return math.nan
    if isinstance(x, (list, tuple)):
        return [_none_to_nan(v) for v in x]
    return x


def _as_2d(x: Any, what: str) -> torch.Tensor:
    """``x`` as a float64 ``[batch, seq]`` tensor (``[seq]`` becomes one row)."""
    try:
        t = torch.as_tensor(x if isinstance(x, torch.Tensor) else _none_to_nan(x))
        t = t.to(torch.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise PrecisionConfigError(
            f"compute_mismatch: {what} is not a rectangular array of numbers ({exc}); pass a "
            f"[batch, seq] tensor, padded, with a mask of the real tokens."
        ) from None
    if t.dim() not in (1, 2):
        raise PrecisionConfigError(
            f"compute_mismatch: {what} has shape {tuple(t.shape)}; pass [batch, seq] or [seq] "
            f"(the log-probs of the sampled tokens, not the full [.., vocab] distributions)."
        )
    return t.unsqueeze(0) if t.dim() == 1 else t


def _slope_per_1k(lengths: torch.Tensor, values: torch.Tensor) -> float:
    """Least-squares slope of ``values`` vs ``lengths`` per 1,000 tokens (NaN if undefined)."""
    if lengths.numel() < 2:
        return math.nan
    x = lengths - lengths.mean()
    denom = (x * x).sum()
    if denom <= 0:
        return math.nan
    return float((x * (values - values.mean())).sum() / denom * 1000.0)


def compute_mismatch(
    train_logprobs: Any, rollout_logprobs: Any, mask: Any | None = None
) -> MismatchMetrics:
    """Compute every mismatch metric from per-token log-probs of the sampled tokens.

    ``train_logprobs`` (π) and ``rollout_logprobs`` (μ) are tensors (or nested lists) of shape
    ``[batch, seq]`` or ``[seq]``; ``mask`` (same shape, bool or 0/1) marks the tokens that
    count. A token whose log-prob is ``None``, NaN or infinite on either side is excluded and
    counted in ``nan_tokens``. With no valid token every mean is NaN and ``tokens`` is 0. Bad
    shapes raise :class:`~precision_plugin.errors.PrecisionConfigError` (a ``ValueError``).
    Computation is in float64, so the result does not depend on input dtype.
    """
    lp_train = _as_2d(train_logprobs, "train_logprobs")
    lp_roll = _as_2d(rollout_logprobs, "rollout_logprobs")
    if lp_train.shape != lp_roll.shape:
        raise PrecisionConfigError(
            f"compute_mismatch: train_logprobs has shape {tuple(lp_train.shape)} but "
            f"rollout_logprobs has {tuple(lp_roll.shape)}; pass the log-probs of the same tokens."
        )
    if mask is None:
        base = torch.ones_like(lp_train, dtype=torch.bool)
    else:
        base = _as_2d(mask, "mask").to(torch.bool)
        if base.shape != lp_train.shape:
            raise PrecisionConfigError(
                f"compute_mismatch: mask has shape {tuple(base.shape)}, log-probs have "
                f"{tuple(lp_train.shape)}."
            )
    finite = torch.isfinite(lp_train) & torch.isfinite(lp_roll)
    valid = base & finite
    nan_tokens = int((base & ~finite).sum())
    n = int(valid.sum())

    # Zero out invalid entries before any arithmetic so NaN never propagates.
    zeros = torch.zeros_like(lp_train)
    lt = torch.where(valid, lp_train, zeros)
    lr = torch.where(valid, lp_roll, zeros)
    log_ratio = torch.where(valid, lt - lr, zeros)  # log π − log μ
    seq_ratio = log_ratio.sum(dim=1)
    seq_len = valid.sum(dim=1).to(torch.float64)
    has_tokens = seq_len > 0

    if n == 0:
        nan = math.nan
        return MismatchMetrics(
            k1_kl=nan, k3_kl=nan, prob_diff_mean=nan, prob_diff_max=nan,
            logp_abs_diff_mean=nan, logp_sq_diff_half_mean=nan, prob_pearson=nan,
            seq_log_ratio_slope_per_1k=nan, seq_abs_log_ratio_slope_per_1k=nan,
            tokens=0, nan_tokens=nan_tokens, sequences=0,
        )  # fmt: skip

    p_train = torch.where(valid, lt.exp(), zeros)
    p_roll = torch.where(valid, lr.exp(), zeros)
    prob_diff = (p_train - p_roll).abs()
    ratio = torch.where(valid, log_ratio.exp(), torch.ones_like(lt))
    k3 = torch.where(valid, ratio - 1.0 - log_ratio, zeros)

    def mean(x: torch.Tensor) -> float:
        return float(x.sum() / n)

    pt, pr = p_train[valid], p_roll[valid]
    if n >= 2 and pt.std() > 0 and pr.std() > 0:
        pearson = float(torch.corrcoef(torch.stack([pt, pr]))[0, 1])
    else:
        pearson = math.nan

    lengths, sums = seq_len[has_tokens], seq_ratio[has_tokens]
    return MismatchMetrics(
        k1_kl=mean(-log_ratio),
        k3_kl=mean(k3),
        prob_diff_mean=mean(prob_diff),
        prob_diff_max=float(prob_diff.max()),
        logp_abs_diff_mean=mean(log_ratio.abs()),
        logp_sq_diff_half_mean=mean(0.5 * log_ratio * log_ratio),
        prob_pearson=pearson,
        seq_log_ratio_slope_per_1k=_slope_per_1k(lengths, sums),
        seq_abs_log_ratio_slope_per_1k=_slope_per_1k(lengths, sums.abs()),
        tokens=n,
        nan_tokens=nan_tokens,
        sequences=int(has_tokens.sum()),
        seq_log_ratio=[float(v) for v in sums],
        seq_lengths=[int(v) for v in lengths],
    )


def verdict(metrics: MismatchMetrics, settings: MetricSettings | None = None) -> tuple[str, str]:
    """Classify a measurement: ``("ok" | "watch" | "problem" | "invalid", reason)``.

    Thresholds are on ``prob_diff_mean`` (verl's: < 0.005 normal, > 0.01 a precision problem;
    configurable in ``policy.metrics``). ``invalid`` means no token could be compared.
    """
    s = settings or MetricSettings()
    if metrics.tokens == 0 or math.isnan(metrics.prob_diff_mean):
        return "invalid", "no comparable tokens (all masked or NaN)"
    d = metrics.prob_diff_mean
    if d < s.prob_diff_ok:
        return "ok", f"prob_diff_mean {d:.2e} < {s.prob_diff_ok:g}"
    if d <= s.prob_diff_bad:
        return "watch", f"prob_diff_mean {d:.2e} between {s.prob_diff_ok:g} and {s.prob_diff_bad:g}"
    return "problem", f"prob_diff_mean {d:.2e} > {s.prob_diff_bad:g}: precision mismatch"


def prefixed(metrics: MismatchMetrics, prefix: str = "precision/") -> dict[str, float]:
    """Scalar metrics as ``{prefix + name: value}`` for a trainer's log."""
    return {prefix + k: float(v) for k, v in metrics.to_dict().items()}
