"""The mismatch metrics from sufficient statistics: per-batch sums that add up across processes
and micro-batches (``mismatch_sums``, ``sums_of``), the metrics from their totals
(``metrics_from_sums``, through the one drift fit), the masked per-token log-ratio the
consequence metrics reduce (``masked_log_ratio``), and the per-token log-ratio and k3 that
``compute_mismatch`` shares. Public path:
[`precision_plugin._core.metrics.mismatch`][precision_plugin._core.metrics.mismatch] (re-exported
there).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from precision_plugin._base.boundary import Invalid, Validator, checked
from precision_plugin._core.metrics.drift import fit_drift
from precision_plugin._core.metrics.inputs import SAME_TOKENS, _named_2d, log_probs_arg, mask_arg
from precision_plugin._core.metrics.k3 import k3_terms
from precision_plugin.errors import PrecisionConfigError


def _log_ratio(valid: torch.Tensor, lt: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
    """log π − log μ where valid, else 0; two ``-inf`` (both sides give probability 0) agree."""
    both_zero = torch.isneginf(lt) & torch.isneginf(lr)
    return torch.where(valid & ~both_zero, lt - lr, torch.zeros_like(lt))


def _k3(valid: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """r − 1 − log r (``k3_terms``: infinite where one side gives probability 0) where valid,
    else 0."""
    return torch.where(valid, k3_terms(d), torch.zeros_like(d))


# -- sufficient statistics: the same metrics from sums that add up across processes ----------

#: The entries of [`mismatch_sums`][precision_plugin._core.metrics.mismatch.mismatch_sums]'s first
#: tensor, in order; each adds up across processes and micro-batches.
SUM_FIELDS: tuple[str, ...] = (
    "tokens",
    "nan_tokens",
    "k1",
    "k3",
    "prob_diff",
    "logp_abs_diff",
    "sequences",
    "seq_len",
    "seq_ratio",
    "seq_ratio_sq_per_len",
)


def masked_log_ratio(
    train_logprobs: Any, rollout_logprobs: Any, mask: Any | None = None, *, caller: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The per-token log-ratio ``log π − log μ`` of a ``[batch, seq]`` batch, ready to reduce.

    Returns ``(d, valid, base, (log_pi, log_mu))``, all float64 on the training side's device:
    ``d`` is the log-ratio with 0 wherever a token does not count, ``valid`` the tokens that
    count (under ``mask`` and finite on both sides), ``base`` the mask itself, and the two
    log-probs with 0 where not valid. Bad shapes raise
    [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError] naming ``caller``.
    """
    lp_train = _named_2d(train_logprobs, "train_logprobs", caller)
    lp_roll = _named_2d(rollout_logprobs, "rollout_logprobs", caller)
    if lp_train.shape != lp_roll.shape:
        raise PrecisionConfigError(
            f"{caller}: train_logprobs has shape {tuple(lp_train.shape)} but "
            f"rollout_logprobs has {tuple(lp_roll.shape)}; pass the log-probs of the same tokens."
        )
    base = torch.ones_like(lp_train, dtype=torch.bool)
    if mask is not None:
        base = _named_2d(mask, "mask", caller).to(device=lp_train.device, dtype=torch.bool)
        if base.shape != lp_train.shape:
            raise PrecisionConfigError(
                f"{caller}: mask has shape {tuple(base.shape)}, log-probs have "
                f"{tuple(lp_train.shape)}."
            )
    lp_roll = lp_roll.to(lp_train.device)
    valid = base & torch.isfinite(lp_train) & torch.isfinite(lp_roll)
    zeros = torch.zeros_like(lp_train)
    lt = torch.where(valid, lp_train, zeros)
    lr = torch.where(valid, lp_roll, zeros)
    return lt - lr, valid, base, (lt, lr)


@checked(SAME_TOKENS, train_logprobs=log_probs_arg, rollout_logprobs=log_probs_arg, mask=mask_arg)
def mismatch_sums(
    train_logprobs: Any, rollout_logprobs: Any, mask: Any | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums from which the token-weighted metrics of a batch follow exactly.

    Returns ``(sums, maxima)``: ``sums`` a float64 tensor ordered as ``SUM_FIELDS`` (token and
    sequence counts, the per-token sums of ``log μ − log π``, of k3, of ``|π − μ|`` and of
    ``|log π − log μ|``, and the moments of (sequence length, sequence log-ratio) the drift's
    standard error needs); ``maxima`` a one-element tensor, ``max |π − μ|`` (``-inf``
    with no valid token). Summing ``sums`` and taking the max of ``maxima`` over shards
    (processes, micro-batches) and then calling
    [`metrics_from_sums`][precision_plugin._core.metrics.mismatch.metrics_from_sums] gives what
    [`compute_mismatch`][precision_plugin._core.metrics.mismatch.compute_mismatch] gives on the
    whole
    batch. Inputs, masking and NaN/``-inf`` handling as for ``compute_mismatch``.
    """
    return sums_of(train_logprobs, rollout_logprobs, mask)


def sums_of(
    lp_train: torch.Tensor, lp_roll: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[`mismatch_sums`][precision_plugin._core.metrics.mismatch.mismatch_sums] of 2-D tensors,
    without its boundary check of the values (which costs a device sync): for the training
    telemetry, whose inputs are the trainer's own tensors. Refuses tensors of different shapes."""
    if lp_train.shape != lp_roll.shape or (mask is not None and mask.shape != lp_train.shape):
        shapes = [tuple(t.shape) for t in (lp_train, lp_roll, mask) if t is not None]
        raise PrecisionConfigError(
            f"mismatch_sums: the log-probs and mask have shapes {shapes}; pass the log-probs "
            f"of the same tokens, and a mask of their shape."
        )
    lp_train = lp_train.to(torch.float64)
    base = torch.ones_like(lp_train, dtype=torch.bool)
    if mask is not None:
        base = mask.to(device=lp_train.device, dtype=torch.bool)
    lp_roll = lp_roll.to(device=lp_train.device, dtype=torch.float64)
    scored = ~(lp_train.isnan() | lp_roll.isnan())
    valid = base & scored
    zeros = torch.zeros_like(lp_train)
    lt = torch.where(valid, lp_train, zeros)
    lr = torch.where(valid, lp_roll, zeros)
    d = _log_ratio(valid, lt, lr)  # log π − log μ, 0 where invalid
    prob_diff = torch.where(valid, (lt.exp() - lr.exp()).abs(), zeros)
    seq_len = valid.sum(dim=1).to(torch.float64)
    seq_ratio = d.sum(dim=1)
    has = seq_len > 0
    x, y = seq_len[has], seq_ratio[has]
    sums = torch.stack(
        [
            valid.sum().to(torch.float64),
            (base & ~scored).sum().to(torch.float64),  # NaN; -inf is a probability of 0
            (-d).sum(),
            _k3(valid, d).sum(),
            prob_diff.sum(),
            d.abs().sum(),
            has.sum().to(torch.float64),
            x.sum(),
            y.sum(),
            (y * y / x).sum(),
        ]
    )
    top = prob_diff[valid].max() if bool(valid.any()) else d.new_tensor(-math.inf)
    return sums, top.reshape(1)


def _sums(value: torch.Tensor) -> torch.Tensor:
    if tuple(value.shape) != (len(SUM_FIELDS),):
        raise Invalid(
            f"has shape {tuple(value.shape)}, not ({len(SUM_FIELDS)},); pass the first tensor "
            f"mismatch_sums() returns (summed over shards)"
        )
    return value


def _maxima(value: torch.Tensor) -> torch.Tensor:
    if value.dim() != 1:
        raise Invalid(
            f"has shape {tuple(value.shape)}; pass the second tensor mismatch_sums() returns "
            f"(or those of several shards, concatenated)"
        )
    return value


@checked(
    sums=Validator("mismatch_sums()'s first tensor", _sums),
    maxima=Validator("mismatch_sums()'s second tensor", _maxima),
)
def metrics_from_sums(sums: torch.Tensor, maxima: torch.Tensor) -> dict[str, float]:
    """The core metrics from (summed)
    [`mismatch_sums`][precision_plugin._core.metrics.mismatch.mismatch_sums].

    Returns ``k1_kl``, ``k3_kl``, ``prob_diff_mean``, ``prob_diff_max``,
    ``logp_abs_diff_mean``, ``drift_per_1k``, ``drift_per_1k_se``, ``tokens`` and
    ``nan_tokens``; means are NaN with no valid token, the standard error NaN below two
    sequences (see [`drift_per_1k`][precision_plugin._core.metrics.mismatch.drift_per_1k]).
    """
    s = dict(zip(SUM_FIELDS, (float(v) for v in sums.double().cpu()), strict=True))
    n, seqs = s["tokens"], s["sequences"]
    nan = math.nan

    def mean(name: str) -> float:
        return s[name] / n if n > 0 else nan

    # drift_fit's Σ (S − r·L)² / L from the sums: ΣS²/L − 2rΣS + r²ΣL (≥ 0 but rounding)
    ratio, stderr, _ = fit_drift(
        seqs,
        s["seq_len"],
        s["seq_ratio"],
        lambda r: s["seq_ratio_sq_per_len"] - 2 * r * s["seq_ratio"] + r * r * s["seq_len"],
    )
    drift, drift_se = 1000.0 * ratio, 1000.0 * stderr
    top = float(maxima.double().max()) if maxima.numel() else nan
    return {
        "k1_kl": mean("k1"),
        "k3_kl": mean("k3"),
        "prob_diff_mean": mean("prob_diff"),
        "prob_diff_max": top if n > 0 else nan,
        "logp_abs_diff_mean": mean("logp_abs_diff"),
        "drift_per_1k": drift,
        "drift_per_1k_se": drift_se,
        "tokens": n,
        "nan_tokens": s["nan_tokens"],
    }
