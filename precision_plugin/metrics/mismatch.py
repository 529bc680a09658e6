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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import annotated_types as at
import torch

from precision_plugin.boundary import (
    Invalid,
    Validator,
    checked,
    numbers_1d,
    one_of,
    same_length,
    same_shape,
)
from precision_plugin.constraints import Each, Whole
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import MetricSettings


@checked
@dataclass(frozen=True)
class Alias:
    """A name another system logs for one of our metrics, and when the two numbers agree.

    ``condition`` is empty when that system's figure equals ours whenever both see the same
    finite log-probs; otherwise it says when they agree. ``skips_nan`` is true when the system,
    like ``compute_mismatch``, leaves out tokens whose log-prob is NaN (elsewhere a NaN under
    the mask changes its figure). ``note`` says when the system logs the figure and what its π
    is; ``source`` names the repository and file of its formula. ``logged`` is false for a
    figure the system computes and acts on but does not log (``name`` then names the tensor).
    """

    system: str
    name: str
    source: str
    condition: str = ""
    note: str = ""
    skips_nan: bool = False
    logged: bool = True

    @property
    def exact(self) -> bool:
        """True when the figures agree on every input without NaN."""
        return not self.condition


_VERL_CORR = "volcengine/verl verl/trainer/ppo/rollout_corr_helper.py (compute_offpolicy_metrics)"
_VERL_CORR_WHEN = (
    "verl ≥ 0.8 outside bypass mode: one token mean over the batch. verl ≤ 0.7 and bypass mode "
    "log the mean of per-micro-batch token means against the policy being updated"
)
_VERL_CORR_NOTE = "needs rollout log-probs and algorithm.rollout_correction (both default in 0.9)"
_VERL_DEBUG = "volcengine/verl verl/utils/debug/metrics.py (calculate_debug_metrics)"
_VERL_DEBUG_NOTE = (
    "needs rollout.calculate_log_probs; π is the recomputed old log-prob (not in bypass mode)"
)
_NEMO_LOSS = "NVIDIA-NeMo/RL nemo_rl/algorithms/loss/loss_functions.py (ClippedPGLossFn)"
_NEMO_KL = _NEMO_LOSS + ", nemo_rl/algorithms/utils.py (calculate_kl)"
_NEMO_ONE_BATCH = "one global batch per step (several add their means up)"
_NEMO_NOTE = "a NaN anywhere in the padded batch, even masked, makes it NaN"
_OAT = "sail-sg/oat oat/algorithms/ppo.py (PPOLearner.learning_step)"
_OAT_ONE_PROCESS = "one process (oat averages per-process values without token weighting)"
_OAT_NOTE = "PPO/GRPO updates only (not --reinforce_update); μ is vLLM's, π the learner's"
_SKYRL = "NovaSky-AI/SkyRL skyrl/train/trainer.py (RayPPOTrainer.fwd_logprobs_values_reward)"
_SKYRL_NOTE = "not logged when the old-log-prob forward is skipped"
_TRL = "huggingface/trl trl/trainer/grpo_trainer.py (TRL 1.16, _generate_and_score_completions)"
_TRL_NOTE = "only with use_vllm and vllm_importance_sampling_correction"
_VERL_RC = "volcengine/verl verl/trainer/ppo/rollout_corr_helper.py"
_VERL_ONE_BATCH = (
    "verl ≥ 0.8 outside bypass mode: one figure over the batch (verl ≤ 0.7 and bypass mode "
    "average per-micro-batch figures against the policy being updated)"
)

#: Our metric -> what other systems log for the same quantity. The one table: docs/concepts.md
#: shows ``alias_table()``, the TRL adapter renames TRL's metrics with ``aliases_for("TRL")``,
#: and tests/unit/test_aliases.py re-implements every entry with that system's formula.
ALIASES: dict[str, tuple[Alias, ...]] = {
    "k1_kl": (
        Alias("verl", "rollout_corr/kl", _VERL_CORR, _VERL_CORR_WHEN, _VERL_CORR_NOTE),
        Alias(
            "OpenRLHF",
            "train/vllm_kl",
            "OpenRLHF/OpenRLHF openrlhf/models/loss.py (PolicyLoss), "
            "openrlhf/trainer/ray/ppo_actor.py (token-weighted reduction), "
            "openrlhf/utils/logging_utils.py (train/ prefix); 0.11.0 - 0.11.2",
            note="only with the importance-sampling correction on (--algo.advantage."
            "is_correction_level token or seq from 0.11.2, --algo.advantage.is_correction_enable "
            "before) and --actor.policy_loss_type ppo; a missing rollout log-prob is scored as 0.0",
        ),
        Alias("oat", "kl_sample_train_v1", _OAT, _OAT_ONE_PROCESS, _OAT_NOTE),
        Alias(
            "NeMo-RL",
            "gen_kl_error",
            _NEMO_KL,
            "reference_policy_kl_type='k1' (default 'k3'); " + _NEMO_ONE_BATCH,
            _NEMO_NOTE,
        ),
    ),
    "k3_kl": (
        Alias("verl", "rollout_corr/k3_kl", _VERL_CORR, _VERL_CORR_WHEN, _VERL_CORR_NOTE),
        Alias(
            "prime-rl",
            "mismatch_kl/all/mean",
            "PrimeIntellect-ai/prime-rl src/prime_rl/trainer/rl/loss.py "
            "(compute_importance_ratio_and_mismatch_kl), src/prime_rl/trainer/rl/train.py",
            note="π is the training forward; with async rollouts μ may be older weights",
        ),
        Alias(
            "NeMo-RL",
            "gen_kl_error",
            _NEMO_KL,
            "reference_policy_kl_type='k3' (the default); " + _NEMO_ONE_BATCH,
            _NEMO_NOTE,
        ),
    ),
    "prob_diff_mean": (
        Alias("verl", "training/rollout_probs_diff_mean", _VERL_DEBUG, note=_VERL_DEBUG_NOTE),
    ),
    "prob_diff_max": (
        Alias("verl", "training/rollout_probs_diff_max", _VERL_DEBUG, note=_VERL_DEBUG_NOTE),
        Alias(
            "oat",
            "sampler_learner_prob_diff_max",
            _OAT,
            "the worst token has μ > π: oat logs the signed max of μ − π, masked positions "
            "as 0 (else ours is −sampler_learner_prob_diff_min); and " + _OAT_ONE_PROCESS,
            _OAT_NOTE,
        ),
    ),
    "prob_diff_std": (
        Alias("verl", "training/rollout_probs_diff_std", _VERL_DEBUG, note=_VERL_DEBUG_NOTE),
    ),
    "logp_abs_diff_mean": (
        Alias(
            "TRL",
            "sampling/sampling_logp_difference/mean",
            _TRL,
            "one process and one generation batch per logged step (TRL averages per-process "
            "means, then the batches, without token weighting)",
            _TRL_NOTE,
            skips_nan=True,
        ),
        Alias(
            "slime",
            "train/train_rollout_logprob_abs_diff",
            "THUDM/slime slime/backends/megatron_utils/loss.py (policy_loss_function), "
            "slime/backends/megatron_utils/cp_utils.py (get_sum_of_sample_mean)",
            "--calculate-per-token-loss (by default slime averages per-sample means, equal to "
            "ours only when all samples have as many tokens), and no token rejected by a TIS/MIS "
            "function (it leaves the numerator, not the denominator)",
            "π is the old log-prob (the current one with --use-rollout-logprobs)",
        ),
        Alias("SkyRL", "policy/rollout_train_logprobs_abs_diff_mean", _SKYRL, note=_SKYRL_NOTE),
    ),
    "logp_abs_diff_max": (
        Alias(
            "TRL",
            "sampling/sampling_logp_difference/max",
            _TRL,
            "one generation batch per logged step (TRL averages the batches' maxima)",
            _TRL_NOTE,
            skips_nan=True,
        ),
        Alias("SkyRL", "policy/rollout_train_logprobs_abs_diff_max", _SKYRL, note=_SKYRL_NOTE),
    ),
    "logp_sq_diff_half_mean": (
        Alias("oat", "kl_sample_train_v2", _OAT, _OAT_ONE_PROCESS, _OAT_NOTE),
        Alias(
            "NeMo-RL",
            "gen_kl_error",
            _NEMO_KL,
            "reference_policy_kl_type='k2' (default 'k3'); " + _NEMO_ONE_BATCH,
            _NEMO_NOTE,
        ),
    ),
    "mult_prob_error": (
        Alias("NeMo-RL", "token_mult_prob_error", _NEMO_LOSS, _NEMO_ONE_BATCH, _NEMO_NOTE),
    ),
    "prob_pearson": (
        Alias(
            "verl",
            "training/rollout_actor_probs_pearson_corr",
            _VERL_DEBUG,
            note=_VERL_DEBUG_NOTE,
        ),
    ),
    # The consequence metrics (precision_plugin.consequence).
    "ess": (
        Alias(
            "verl",
            "rollout_corr/rollout_is_eff_sample_size",
            _VERL_RC + " (compute_is_metrics)",
            "rollout_is='sequence', every sequence as long and no sequence weight above "
            "rollout_is_threshold (2.0): verl averages the weights clipped at the threshold "
            "over tokens (verl ≤ 0.8, e.g. 0.7.1, clips them to [1/threshold, threshold], so "
            "there none below 0.5 either); and " + _VERL_ONE_BATCH,
            "needs algorithm.rollout_correction.rollout_is (null, i.e. off, by default)",
        ),
    ),
    "seq_mask_fraction_trl": (
        Alias(
            "TRL",
            "importance_sampling_ratio",
            _TRL,
            note="not logged: the share of completions whose importance_sampling_ratio "
            "GRPOTrainer sets to 0 in sequence_mask mode (the default of "
            "vllm_importance_sampling_correction, clip_max 3.0); " + _TRL_NOTE,
            skips_nan=True,
            logged=False,
        ),
    ),
    "seq_mask_fraction_verl": (
        Alias(
            "verl",
            "rollout_corr/rollout_rs_seq_sum_k1_seq_masked_fraction",
            _VERL_RC + " (compute_rollout_rejection_mask)",
            "no token with |log π − log μ| above 20 (verl clamps each before summing); and "
            + _VERL_ONE_BATCH,
            "with the Seq-MIS preset decoupled_seq_is_rs() (rollout_rs='seq_sum_k1', "
            "rollout_rs_threshold='0.5_2.0'); rollout_rs_seq_masked_fraction is the same "
            "when seq_sum_k1 is the only option",
        ),
    ),
    "tis_clip_fraction": (
        Alias(
            "verl",
            "rollout_corr/rollout_is_ratio_fraction_high",
            _VERL_RC + " (compute_is_metrics)",
            _VERL_ONE_BATCH,
            "rollout_is='token' with the default rollout_is_threshold=2.0 (decoupled_token_is())",
        ),
    ),
}


#: The systems ``ALIASES`` names (``aliases_for`` takes one of them).
SYSTEMS = tuple(sorted({a.system for aliases in ALIASES.values() for a in aliases}))


@checked(system=one_of(*SYSTEMS))
def aliases_for(system: str) -> dict[str, str]:
    """``{their name: our metric}`` for the figures one system of ``ALIASES`` logs (e.g.
    ``"TRL"``)."""
    return {
        a.name: ours
        for ours, aliases in ALIASES.items()
        for a in aliases
        if a.system == system and a.logged
    }


@checked
def alias_table() -> str:
    """``ALIASES`` as the Markdown table docs/concepts.md shows."""
    rows = [
        "| ours | system | their name | agrees with ours | logged when / notes | formula in |",
        "|---|---|---|---|---|---|",
    ]
    for ours, aliases in ALIASES.items():
        for a in aliases:
            agrees = "exact" if a.exact else f"if {a.condition}"
            if a.skips_nan:
                agrees += "; skips NaN tokens as we do"
            cells = (f"`{ours}`", a.system, f"`{a.name}`", agrees, a.note, a.source)
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


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


def _none_to_nan(x: Any) -> Any:
    """Replace ``None`` (a token an engine returned no log-prob for) by NaN in nested lists."""
    if x is None:
        return math.nan
    if isinstance(x, (list, tuple)):
        return [_none_to_nan(v) for v in x]
    return x


#: A log-prob above this is not one (probabilities passed by mistake?): a log-softmax never
#: rounds a log-prob above 0 by more than a few ulps.
LOGPROB_MAX = 0.01


def _as_2d(x: Any) -> torch.Tensor:
    """``x`` as a float64 ``[batch, seq]`` tensor (``[seq]`` becomes one row)."""
    try:
        if isinstance(x, torch.Tensor):
            t = x.to(torch.float64)
        else:  # lists and arrays straight to float64: torch would round floats to float32 first
            t = torch.as_tensor(_none_to_nan(x), dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise Invalid(
            f"is not a rectangular array of numbers ({exc}); pass a [batch, seq] tensor, "
            f"padded, with a mask of the real tokens"
        ) from None
    if t.dim() not in (1, 2):
        raise Invalid(
            f"has shape {tuple(t.shape)}; pass [batch, seq] or [seq] (the log-probs of the "
            f"sampled tokens, not the full [.., vocab] distributions)"
        )
    return t.unsqueeze(0) if t.dim() == 1 else t


#: One token count per sequence: whole numbers >= 0 (``True`` is no length).
TokenCounts = Annotated[Any, Each(Whole(), at.Ge(0))]
#: The drift's inputs: one token count and one log-ratio sum per sequence.
_LENGTHS = numbers_1d("a sequence's token count", low=0)
_SUMS = numbers_1d("a sequence's sum of log π − log μ")
_PER_SEQUENCE = same_length(
    "lengths", "sums", fix="pass one token count and one log-ratio sum per sequence"
)


@checked(_PER_SEQUENCE, lengths=_LENGTHS, sums=_SUMS)
def drift_fit(lengths: TokenCounts, sums: Any) -> tuple[float, float, float]:
    """``(drift, stderr, variance)`` per token of sequences' log-ratios ``S_i`` (sums of
    log π − log μ) and lengths ``L_i``, under the random walk ``S ~ Normal(drift·L, variance·L)``.

    ``drift = Σ S / Σ L`` (the token mean of log π − log μ, i.e. −k1; weighted least squares),
    ``variance = Σ (S − drift·L)² / L / (n − 1)`` and ``stderr = sqrt(variance / Σ L)``; the
    last two NaN below two sequences, all three NaN without a token. ``lengths`` and ``sums``
    are sequences of numbers or 1-D tensors; sequences of length 0 are left out.
    """
    x = torch.as_tensor(lengths, dtype=torch.float64).reshape(-1)
    y = torch.as_tensor(sums, dtype=torch.float64).reshape(-1)
    keep = x > 0
    x, y = x[keep], y[keep]
    return fit_drift(
        x.numel(), float(x.sum()), float(y.sum()), lambda d: float(((y - d * x) ** 2 / x).sum())
    )


def fit_drift(
    sequences: float, length: float, total: float, residual: Callable[[float], float]
) -> tuple[float, float, float]:
    """The one drift fit, from ``sequences`` (n), ``length`` (Σ L), ``total`` (Σ S) and
    ``residual(drift)`` (Σ (S − drift·L)² / L): ``(drift, stderr, variance)`` with
    ``drift = Σ S / Σ L``, ``variance = residual / (n − 1)``, ``stderr = sqrt(variance / Σ L)``;
    the last two NaN below two sequences, all three NaN without a token.
    [`drift_fit`][precision_plugin.metrics.mismatch.drift_fit] computes the residual from the
    sequences, [`metrics_from_sums`][precision_plugin.metrics.mismatch.metrics_from_sums] from
    sums that add up across processes."""
    if length <= 0:
        return math.nan, math.nan, math.nan
    drift = total / length
    if sequences < 2:
        return drift, math.nan, math.nan
    variance = max(residual(drift), 0.0) / (sequences - 1)
    return drift, math.sqrt(variance / length), variance


@checked(_PER_SEQUENCE, lengths=_LENGTHS, sums=_SUMS)
def drift_per_1k(lengths: TokenCounts, sums: Any) -> tuple[float, float]:
    """The drift per 1,000 tokens (``1000 · Σ S / Σ L``, that is −1000·k1) and its standard
    error, from [`drift_fit`][precision_plugin.metrics.mismatch.drift_fit]."""
    drift, stderr, _ = drift_fit(lengths, sums)
    return 1000.0 * drift, 1000.0 * stderr


def _log_probs(x: Any) -> torch.Tensor:
    t = _as_2d(x)
    high = t.nan_to_num(nan=-math.inf, posinf=math.inf).max() if t.numel() else None
    if high is not None and float(high) > LOGPROB_MAX:
        raise Invalid(
            f"holds {float(high):.4g}: no log-probability is above 0 (were probabilities "
            f"passed?); pass log-probs, e.g. probs.log()"
        )
    return t


#: The log-probs of the sampled tokens: ``[batch, seq]`` or ``[seq]``, <= 0, NaN/None where
#: an engine returned none; converted to a float64 2-D tensor.
log_probs_arg = Validator(
    "log-probs of the sampled tokens, [batch, seq] or [seq]",
    _log_probs,
    ([[0.5, 0.25]], [[-0.1], [-0.2, -0.3]], [[[-0.1]]], "x", None),
)


def _mask(x: Any) -> torch.Tensor:
    t = _as_2d(x)
    if t.numel() and not bool(((t == 0) | (t == 1)).all()):
        bad = t[~((t == 0) | (t == 1))][0].item()
        raise Invalid(
            f"holds {bad:g}: a mask is 0/1 or bool (1: the token counts); pass e.g. "
            f"attention_mask or completion_mask, not weights"
        )
    return t


#: A mask of the tokens that count (bool or 0/1), of the log-probs' shape; converted to a 2-D
#: tensor.
mask_arg = Validator(
    "a [batch, seq] mask of the tokens that count",
    _mask,
    ([[1], [1, 0]], [[[1]]], "x", [[2.0]], [[0.5]], [[math.nan]]),
)
#: The log-probs of the same tokens on both sides, and a mask of their shape.
SAME_TOKENS = same_shape(
    "train_logprobs",
    "rollout_logprobs",
    "mask",
    fix="pass the log-probs of the same tokens, and a mask of their shape",
)


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


def _log_ratio(valid: torch.Tensor, lt: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
    """log π − log μ where valid, else 0; two ``-inf`` (both sides give probability 0) agree."""
    both_zero = torch.isneginf(lt) & torch.isneginf(lr)
    return torch.where(valid & ~both_zero, lt - lr, torch.zeros_like(lt))


def _k3(valid: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """r − 1 − log r as expm1(d) − d (exp(d) − 1 would lose a tiny d to rounding); infinite
    where one side gives probability 0."""
    k3 = torch.where(d.isinf(), torch.full_like(d, math.inf), torch.expm1(d) - d)
    return torch.where(valid, k3, torch.zeros_like(d))


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


# -- sufficient statistics: the same metrics from sums that add up across processes ----------

#: The entries of [`mismatch_sums`][precision_plugin.metrics.mismatch.mismatch_sums]'s first
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


def _named_2d(x: Any, name: str, caller: str) -> torch.Tensor:
    """``_as_2d`` for an internal caller: the error names ``caller``'s argument."""
    try:
        return _as_2d(x)
    except Invalid as exc:
        raise PrecisionConfigError(f"{caller}(): argument {name!r} {exc}.") from None


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
    [`metrics_from_sums`][precision_plugin.metrics.mismatch.metrics_from_sums] gives what
    [`compute_mismatch`][precision_plugin.metrics.mismatch.compute_mismatch] gives on the whole
    batch. Inputs, masking and NaN/``-inf`` handling as for ``compute_mismatch``.
    """
    return sums_of(train_logprobs, rollout_logprobs, mask)


def sums_of(
    lp_train: torch.Tensor, lp_roll: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[`mismatch_sums`][precision_plugin.metrics.mismatch.mismatch_sums] of 2-D tensors,
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
    [`mismatch_sums`][precision_plugin.metrics.mismatch.mismatch_sums].

    Returns ``k1_kl``, ``k3_kl``, ``prob_diff_mean``, ``prob_diff_max``,
    ``logp_abs_diff_mean``, ``drift_per_1k``, ``drift_per_1k_se``, ``tokens`` and
    ``nan_tokens``; means are NaN with no valid token, the standard error NaN below two
    sequences (see [`drift_per_1k`][precision_plugin.metrics.mismatch.drift_per_1k]).
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
