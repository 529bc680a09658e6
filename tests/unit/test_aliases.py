"""Every entry of mismatch.ALIASES against a re-implementation of the other system's code.

Each re-implementation follows the named file line by line (its reductions over micro-batches,
processes and logging windows included) and is fed the padded tensors that system would hold.
An exact alias must agree with ``compute_mismatch`` on ragged batches; a conditional one must
agree when its condition holds and differ when it fails; and a NaN token under the mask must
change the other system's figure unless the alias says that system skips NaN tokens as we do.
Adding an alias without a re-implementation here fails ``test_every_alias_has_a_reimplementation``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from precision_plugin._core.metrics.consequence import CONSEQUENCE_METRICS, compute_consequence
from precision_plugin._core.metrics.mismatch import ALIASES, Alias, aliases_for, compute_mismatch

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # log π, log μ, mask: [rows, T] float64

LENGTHS = (9, 3, 14, 1, 6, 11)  # ragged: padded to 14; any split of the rows has tokens


def ragged(seed: int = 0, nan_tokens: bool = False, noise: float = 0.05) -> Batch:
    """A padded batch of sampled-token log-probs with a realistic spread and a mismatch of
    ``noise`` per token (small by default; the consequence metrics need one that masks)."""
    g = torch.Generator().manual_seed(seed)
    rows, width = len(LENGTHS), max(LENGTHS)
    mask = torch.zeros(rows, width, dtype=torch.float64)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1.0
    # Sampled tokens are mostly likely ones, with a tail down to 1e-3.
    u = torch.rand(rows, width, generator=g, dtype=torch.float64)
    log_pi = torch.log(1e-3 + (1 - 1e-3) * u**0.25)
    log_mu = torch.clamp(log_pi + noise * torch.randn(rows, width, generator=g), max=0.0)
    # Padding holds finite junk, as a padded forward leaves it.
    junk = -5.0 * torch.rand(rows, width, generator=g, dtype=torch.float64)
    log_pi = torch.where(mask.bool(), log_pi, junk)
    log_mu = torch.where(mask.bool(), log_mu, junk.flip(1))
    if nan_tokens:  # the engine returned no log-prob for two real tokens (and one pad slot)
        log_mu[0, 2] = log_mu[2, 5] = log_mu[3, 4] = math.nan
    return log_pi, log_mu, mask


def rows(batch: Batch, k: int) -> list[Batch]:
    """``batch`` split into ``k`` consecutive groups of rows (micro-batches, processes, ...)."""
    parts = [torch.tensor_split(t, k, dim=0) for t in batch]
    return [tuple(p[i] for p in parts) for i in range(k)]  # type: ignore[misc]


def worst_token(batch: Batch, mu_higher: bool) -> Batch:
    """``batch`` with π and μ swapped, if needed, at the token of largest |π − μ| so that μ > π
    there (``mu_higher``) or π > μ; |π − μ| stays the same everywhere."""
    pi, mu, mask = (t.clone() for t in batch)
    gap = torch.where(mask.bool(), (pi.exp() - mu.exp()).abs(), torch.zeros_like(pi))
    gap = torch.nan_to_num(gap, nan=-1.0)
    i, j = divmod(int(gap.argmax()), pi.shape[1])
    if (mu[i, j] > pi[i, j]) != mu_higher:
        pi[i, j], mu[i, j] = mu[i, j].clone(), pi[i, j].clone()
    return pi, mu, mask


# --- verl --------------------------------------------------------------------------------------


def _verl_masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # volcengine/verl verl/utils/torch_functional.py: masked_sum / masked_mean
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum() / (mask.sum() + 1e-8)


def verl_rollout_corr(key: str, batch: Batch, micro_batches: int | None = None) -> float:
    """verl/trainer/ppo/rollout_corr_helper.py: compute_offpolicy_metrics, "kl" and "k3_kl"."""

    def offpolicy(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask):
        if key == "kl":
            return _verl_masked_mean(rollout_log_prob - old_log_prob, response_mask).item()
        log_ratio = old_log_prob - rollout_log_prob
        k3_kl_matrix = torch.exp(log_ratio) - log_ratio - 1
        return _verl_masked_mean(k3_kl_matrix, response_mask).item()

    if micro_batches is None:  # verl >= 0.8 outside bypass mode: once per batch, on the driver
        return offpolicy(*batch)
    # verl <= 0.7 (workers/actor/dp_actor.py: compute_rollout_corr_metrics_from_logprobs per
    # micro-batch) and bypass mode: reduce_metrics (verl/utils/metric/utils.py) takes np.mean.
    return float(np.mean([offpolicy(*part) for part in rows(batch, micro_batches)]))


def verl_debug(key: str, batch: Batch) -> float:
    """verl/utils/debug/metrics.py: calculate_debug_metrics (the training/rollout_* keys)."""
    actor_old_log_probs, rollout_old_log_probs, response_mask = batch
    actor_probs = torch.exp(actor_old_log_probs)
    rollout_probs = torch.exp(rollout_old_log_probs)
    response_mask_bool = response_mask.bool()
    if key == "pearson_corr":
        mt1 = torch.masked_select(actor_probs, response_mask_bool)
        mt2 = torch.masked_select(rollout_probs, response_mask_bool)
        return torch.corrcoef(torch.stack([mt1, mt2], dim=0))[0][1].item()
    rollout_probs_diff = torch.masked_select(
        torch.abs(actor_probs - rollout_probs), response_mask_bool
    )
    return {"max": torch.max, "mean": torch.mean, "std": torch.std}[key](rollout_probs_diff).item()


# --- OpenRLHF ----------------------------------------------------------------------------------


def openrlhf_vllm_kl(batch: Batch, processes: int = 2, micro_batches: int = 2) -> float:
    """openrlhf/models/loss.py PolicyLoss.forward; openrlhf/trainer/ray/ppo_actor.py ppo_train."""
    old_log_probs, rollout_log_probs, action_mask = batch
    # openrlhf/utils/agent.py: a token vLLM gave no log-prob for is recorded as 0.0.
    rollout_log_probs = torch.nan_to_num(rollout_log_probs, nan=0.0)
    weighted_sum, total_tokens = 0.0, 0.0
    for shard in rows((old_log_probs, rollout_log_probs, action_mask), processes):
        for old, rollout, mask in rows(shard, micro_batches):
            # models/utils.py masked_mean: (tensor * mask).sum() / mask.sum()
            vllm_kl = ((rollout - old) * mask).sum() / mask.sum()
            # a 0-dim info tensor is weighted "token": value * n_tokens, all-reduced, / n_tokens
            n_tokens = float(mask.sum())
            weighted_sum += vllm_kl.item() * n_tokens
            total_tokens += n_tokens
    return weighted_sum / total_tokens


# --- oat (the paper's code) ------------------------------------------------------------------


def oat(key: str, batch: Batch, processes: int = 1, micro_batches: int = 2) -> float:
    """oat/algorithms/ppo.py PPOLearner.learning_step; oat/utils/deepspeed.py all_reduce(mean)."""
    logps, vllm_logps, response_masks = batch
    # learning_step: actor_logps start as zeros and get vLLM's log-probs at response positions.
    actor_logps = torch.where(response_masks.bool(), vllm_logps, 0.0)
    per_process = []
    for shard in rows((logps, actor_logps, response_masks), processes):
        kl_v1_sum = kl_v2_sum = act_num_token = 0.0
        diff_max = []
        for mb_logps, mb_actor_logps, mb_response_masks in rows(shard, micro_batches):
            token_diff = mb_actor_logps - mb_logps
            prob_diff = torch.exp(mb_actor_logps) - torch.exp(mb_logps)
            kl_v1_sum += (token_diff * mb_response_masks).sum(1).sum()  # oat/utils/ops.masked_sum
            kl_v2_sum += (token_diff**2 * mb_response_masks).sum(1).sum()
            act_num_token += (mb_response_masks == 1).sum()
            diff_max.append(torch.amax(prob_diff * mb_response_masks).item())
        per_process.append(
            {
                "kl_sample_train_v1": float(kl_v1_sum / act_num_token),
                "kl_sample_train_v2": float(0.5 * kl_v2_sum / act_num_token),
                "sampler_learner_prob_diff_max": float(torch.tensor(diff_max).max()),
            }[key]
        )
    return sum(per_process) / len(per_process)  # strategy.all_reduce(op="mean")


# --- NeMo-RL -----------------------------------------------------------------------------------


def _nemo_calculate_kl(logprobs, logprobs_reference, kl_type: str) -> torch.Tensor:
    # nemo_rl/algorithms/utils.py calculate_kl with input/output clamps None (as the loss calls it)
    logr = logprobs_reference - logprobs
    if kl_type == "k1":
        return -logr
    if kl_type == "k2":
        return torch.square(logr) / 2
    return torch.exp(logr) - 1 - logr


def nemo(key: str, batch: Batch, kl_type: str = "k3", global_batches: int = 1) -> float:
    """nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn.__call__; grpo.py sums mb metrics."""
    logged = 0.0
    for gb in rows(batch, global_batches):
        global_valid_toks = gb[2].sum()
        for prev_logprobs, generation_logprobs, mask in rows(gb, 2):  # micro-batches
            if key == "token_mult_prob_error":
                values = torch.exp(torch.abs(generation_logprobs - prev_logprobs) * mask)
            else:
                values = _nemo_calculate_kl(generation_logprobs, prev_logprobs, kl_type)
            # nemo_rl/algorithms/utils.py masked_mean with global_normalization_factor
            logged += (torch.sum(values * mask) / (global_valid_toks + 1e-8)).item()
    return logged


# --- slime, prime-rl, SkyRL, TRL ---------------------------------------------------------------


def slime(batch: Batch, per_token: bool = False, rejected: int = 0) -> float:
    """slime/backends/megatron_utils/loss.py: sum_of_sample_mean((old - rollout).abs()), then
    observability/train_metric_utils.py: / total tokens or / samples in the step."""
    old_log_probs, rollout_log_probs, loss_masks = batch
    x = (old_log_probs - rollout_log_probs).abs()
    # With --use-tis/--get-mismatch-metrics the reducer is rebuilt with the TIS/MIS function's
    # modified_response_masks (rejected tokens 0) over the original denominators.
    modified = loss_masks.clone()
    modified[0, :rejected] = 0.0
    if per_token:  # cp_utils.get_sum_of_sample_mean -> sum_of_token; divisor: step num_tokens
        num_tokens = sum(torch.clamp_min(m.sum(), 1) for m in loss_masks)
        return float((x * modified).sum() / num_tokens)
    # sum_of_sample_mean; rollout_mask_sums = each sample's own total (one sample per rollout)
    per_sample = [
        (x_i * m_i).sum() / torch.clamp_min(denom.sum(), 1)
        for x_i, m_i, denom in zip(x, modified, loss_masks, strict=True)
    ]
    return float(sum(per_sample) / len(per_sample))  # / step_global_batch_size


def prime_rl(batch: Batch, processes: int = 2, micro_batches: int = 2) -> float:
    """src/prime_rl/trainer/rl/loss.py compute_importance_ratio_and_mismatch_kl; train.py appends
    mismatch_kl[loss_mask] per micro-batch; trainer/utils.py Tensors.compute_stats: gather, mean."""
    gathered = []
    for shard in rows(batch, processes):
        for trainer_logprobs, inference_logprobs, loss_mask in rows(shard, micro_batches):
            log_importance_ratio = trainer_logprobs - inference_logprobs
            importance_ratio = torch.exp(log_importance_ratio)
            mismatch_kl = importance_ratio - log_importance_ratio - 1
            gathered.append(mismatch_kl[loss_mask.bool()])
    return torch.cat(gathered).mean().item()


def skyrl(key: str, batch: Batch) -> float:
    """skyrl/train/trainer.py: policy/rollout_train_logprobs_abs_diff_{mean,max}."""
    action_log_probs, rollout_logprobs, loss_mask = batch
    logprobs_diff = (rollout_logprobs[loss_mask > 0] - action_log_probs[loss_mask > 0]).abs()
    return (logprobs_diff.mean() if key == "mean" else logprobs_diff.max()).item()


def trl(key: str, batch: Batch, processes: int = 1, generation_batches: int = 1) -> float:
    """trl/trainer/grpo_trainer.py (TRL 1.16): _generate_and_score_completions, then log()."""
    logged = []
    for generation in rows(batch, generation_batches):
        per_process = []
        for old_per_token_logps, sampling_per_token_logps, completion_mask in rows(
            generation, processes
        ):
            delta = torch.abs(old_per_token_logps - sampling_per_token_logps)
            mask = completion_mask.bool()
            delta = delta[mask & ~torch.isnan(delta)]
            if key == "mean":
                per_process.append(torch.mean(delta) if delta.numel() > 0 else torch.tensor(0.0))
            else:
                per_process.append(torch.max(delta) if delta.numel() > 0 else torch.tensor(0.0))
        gathered = torch.stack(per_process)  # accelerator.gather
        logged.append((gathered.mean() if key == "mean" else gathered.max()).item())
    valid = [v for v in logged if not math.isnan(v)]  # GRPOTrainer.log averages the window
    return sum(valid) / len(valid)


# --- the consequence metrics: verl's rollout correction, TRL's sequence mask -----------------

VERL_SAFETY_BOUND = 20.0  # rollout_corr_helper.py SAFETY_BOUND


def _verl_masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None):
    # verl/utils/torch_functional.py masked_sum (masked_mean divides by mask.sum + 1e-8)
    return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis=axis)


def _verl_masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None):
    return _verl_masked_sum(values, mask, axis) / (mask.sum(axis=axis) + 1e-8)


def verl_is_metric(
    key: str,
    batch: Batch,
    rollout_is: str,
    micro_batches: int | None = None,
    verl_version: str = "0.9.1",
):
    """rollout_corr_helper.py compute_rollout_correction_weights + compute_is_metrics with the
    default rollout_is_threshold=2.0 (TIS: one upper bound). ``verl_version`` "0.7.1": its
    ESS clamps the weights to [1/threshold, threshold] (0.9.1: [0, threshold])."""

    def one(old_log_prob, rollout_log_prob, response_mask) -> float:
        threshold = 2.0
        log_ratio = old_log_prob - rollout_log_prob
        if rollout_is == "token":
            log_ratio_safe = torch.clamp(log_ratio, min=-VERL_SAFETY_BOUND, max=VERL_SAFETY_BOUND)
            raw_rollout_is_weights = torch.exp(log_ratio_safe)
        else:
            log_ratio_sum = _verl_masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
            log_ratio_sum_safe = torch.clamp(log_ratio_sum, -VERL_SAFETY_BOUND, VERL_SAFETY_BOUND)
            raw_rollout_is_weights = torch.exp(log_ratio_sum_safe).expand_as(log_ratio)
        raw_rollout_is_weights = raw_rollout_is_weights * response_mask
        rollout_is_weights = raw_rollout_is_weights.clamp(max=threshold)
        if key == "rollout_is_ratio_fraction_high":
            assert rollout_is == "token"
            above = raw_rollout_is_weights > threshold
            return _verl_masked_mean(above.float().double(), response_mask).item()
        lower = 1.0 / threshold if verl_version == "0.7.1" else 0.0
        weights_for_ess = rollout_is_weights.clamp(min=lower, max=threshold)
        mean_for_ess = _verl_masked_mean(weights_for_ess, response_mask)
        is_weights_normalized = weights_for_ess / (mean_for_ess + 1e-8)
        return 1.0 / _verl_masked_mean(is_weights_normalized.square(), response_mask).item()

    if micro_batches is None:  # verl >= 0.8 outside bypass mode: once per batch
        return one(*batch)
    return float(np.mean([one(*part) for part in rows(batch, micro_batches)]))


def verl_seq_mis(batch: Batch, micro_batches: int | None = None) -> float:
    """rollout_corr_helper.py compute_rollout_rejection_mask with decoupled_seq_is_rs()'s
    rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0": the option's seq_masked_fraction."""

    def one(old_log_prob, rollout_log_prob, response_mask) -> float:
        lower_log, upper_log = math.log(0.5), math.log(2.0)
        log_ratio = old_log_prob - rollout_log_prob
        log_ratio_safe = torch.clamp(log_ratio, min=-VERL_SAFETY_BOUND, max=VERL_SAFETY_BOUND)
        token_k1 = -log_ratio_safe
        seq_valid_mask = response_mask.sum(dim=-1) > 0
        seq_stat = _verl_masked_sum(token_k1, response_mask, axis=-1)
        seq_keep_bool_direct = (seq_stat >= lower_log) & (seq_stat <= upper_log)
        token_keep_bool = seq_keep_bool_direct.unsqueeze(-1).expand_as(response_mask.bool())
        seq_keep_bool_tensor = (~((~token_keep_bool) & response_mask.bool())).all(dim=-1)
        seq_valid_float = seq_valid_mask.double()
        seq_keep_float = seq_keep_bool_tensor.double()
        return (((1.0 - seq_keep_float) * seq_valid_float).sum() / seq_valid_float.sum()).item()

    if micro_batches is None:
        return one(*batch)
    return float(np.mean([one(*part) for part in rows(batch, micro_batches)]))


def trl_sequence_mask_zeros(batch: Batch) -> float:
    """grpo_trainer.py (TRL 1.16) _generate_and_score_completions, mode "sequence_mask" with the
    default clip_max=3.0, clip_min=None: the share of completions whose ratio it sets to 0."""
    old_per_token_logps, sampling_per_token_logps, mask = batch
    per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)
    per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    vllm_importance_sampling_ratio = torch.exp(per_sequence_logps_diff)
    min_val, max_val = -math.inf, 3.0
    invalid_mis_mask = (vllm_importance_sampling_ratio < min_val) | (
        vllm_importance_sampling_ratio > max_val
    )
    ratio = vllm_importance_sampling_ratio.masked_fill(invalid_mis_mask, value=0.0)
    has_tokens = mask.sum(dim=-1) > 0
    return float((ratio.squeeze(-1)[has_tokens] == 0).double().mean())


def equal_lengths(batch: Batch, length: int = 3) -> Batch:
    """Every row with ``length`` tokens (a shorter row borrows row 0's tokens)."""
    pi, mu, mask = (t.clone() for t in batch)
    for i in range(pi.shape[0]):
        n = int(mask[i].sum())
        if n < length:
            pi[i, n:length], mu[i, n:length] = pi[0, n:length], mu[0, n:length]
    mask.zero_()
    mask[:, :length] = 1.0
    return pi, mu, mask


def one_heavy_sequence(batch: Batch) -> Batch:
    """``equal_lengths`` with row 1's sequence weight raised to about e (above verl's 2.0)."""
    pi, mu, mask = equal_lengths(batch)
    mu[1, 0] = pi[1, 0] - 1.0 - (pi[1, 1:3] - mu[1, 1:3]).sum()
    return pi, mu, mask


def one_light_sequence(batch: Batch) -> Batch:
    """``equal_lengths`` with row 1's sequence weight lowered to about 1/e (below 0.5)."""
    pi, mu, mask = equal_lengths(batch)
    pi[1, 0] = mu[1, 0] - 1.0 - (pi[1, 1:3] - mu[1, 1:3]).sum()  # π lowered: log-probs < 0
    return pi, mu, mask


def calm_nan_rows(batch: Batch) -> Batch:
    """Rows 0 and 2 (where ``ragged`` puts its NaN tokens) with a mismatch 100x smaller, so
    both sides keep them and a NaN token is what changes the other system's decision."""
    pi, mu, mask = (t.clone() for t in batch)
    for i in (0, 2):
        mu[i] = pi[i] + 0.01 * (mu[i] - pi[i])
    return pi, mu, mask


def token_beyond_verl_clamp(batch: Batch) -> Batch:
    """Row 0 gets tokens with log-ratios +21 and -20: S = 1 is masked by [0.5, 2], but verl
    clamps +21 to +20 first and keeps the row."""
    pi, mu, mask = (t.clone() for t in batch)
    pi[0, :2], mu[0, :2] = torch.tensor([-1.0, -30.0]), torch.tensor([-22.0, -10.0])
    mu[0, 2 : int(mask[0].sum())] = pi[0, 2 : int(mask[0].sum())]
    return pi, mu, mask


# --- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """How to recompute one alias: the formula, settings under which the condition holds, and
    settings (or a change of the data) under which it fails."""

    theirs: Callable[..., float]
    holds: dict[str, Any] = field(default_factory=dict)
    breaks: tuple[dict[str, Any], ...] = ()
    prepare: Callable[[Batch], Batch] | None = None  # makes the data meet the condition
    rel_tol: float = 1e-9  # what the system's own rounding leaves (verl and NeMo add 1e-8)
    noise: float = 0.05  # the data's mismatch per token: the masks need one that masks


def _curry(fn: Callable[..., float], *args: Any) -> Callable[..., float]:
    return lambda batch, **kw: fn(*args, batch, **kw)


_PI_HIGHER = {"prepare": lambda b: worst_token(b, mu_higher=False)}  # breaks oat's signed max

CASES: dict[tuple[str, str, str], Case] = {
    ("k1_kl", "verl", "rollout_corr/kl"): Case(
        _curry(verl_rollout_corr, "kl"), breaks=({"micro_batches": 2},)
    ),
    ("k1_kl", "OpenRLHF", "train/vllm_kl"): Case(openrlhf_vllm_kl),
    ("k1_kl", "oat", "kl_sample_train_v1"): Case(
        _curry(oat, "kl_sample_train_v1"), breaks=({"processes": 2},)
    ),
    ("k1_kl", "NeMo-RL", "gen_kl_error"): Case(
        _curry(nemo, "gen_kl_error"),
        holds={"kl_type": "k1"},
        breaks=({"kl_type": "k3"}, {"kl_type": "k1", "global_batches": 2}),
    ),
    ("k3_kl", "verl", "rollout_corr/k3_kl"): Case(
        _curry(verl_rollout_corr, "k3_kl"), breaks=({"micro_batches": 2},)
    ),
    ("k3_kl", "prime-rl", "mismatch_kl/all/mean"): Case(prime_rl),
    ("k3_kl", "NeMo-RL", "gen_kl_error"): Case(
        _curry(nemo, "gen_kl_error"),
        holds={"kl_type": "k3"},
        breaks=({"kl_type": "k2"}, {"kl_type": "k3", "global_batches": 2}),
    ),
    ("prob_diff_mean", "verl", "training/rollout_probs_diff_mean"): Case(
        _curry(verl_debug, "mean")
    ),
    ("prob_diff_max", "verl", "training/rollout_probs_diff_max"): Case(_curry(verl_debug, "max")),
    ("prob_diff_max", "oat", "sampler_learner_prob_diff_max"): Case(
        _curry(oat, "sampler_learner_prob_diff_max"),
        prepare=lambda b: worst_token(b, mu_higher=True),
        breaks=(_PI_HIGHER, {"processes": 2}),
        rel_tol=2**-23,  # oat collects the per-micro-batch maxima in a float32 tensor
    ),
    ("prob_diff_std", "verl", "training/rollout_probs_diff_std"): Case(_curry(verl_debug, "std")),
    ("logp_abs_diff_mean", "TRL", "sampling/sampling_logp_difference/mean"): Case(
        _curry(trl, "mean"), breaks=({"processes": 2}, {"generation_batches": 2})
    ),
    ("logp_abs_diff_mean", "slime", "train/train_rollout_logprob_abs_diff"): Case(
        slime,
        holds={"per_token": True},
        breaks=({"per_token": False}, {"per_token": True, "rejected": 2}),
    ),
    ("logp_abs_diff_mean", "SkyRL", "policy/rollout_train_logprobs_abs_diff_mean"): Case(
        _curry(skyrl, "mean")
    ),
    ("logp_abs_diff_max", "TRL", "sampling/sampling_logp_difference/max"): Case(
        _curry(trl, "max"), holds={"processes": 3}, breaks=({"generation_batches": 2},)
    ),
    ("logp_abs_diff_max", "SkyRL", "policy/rollout_train_logprobs_abs_diff_max"): Case(
        _curry(skyrl, "max")
    ),
    ("logp_sq_diff_half_mean", "oat", "kl_sample_train_v2"): Case(
        _curry(oat, "kl_sample_train_v2"), breaks=({"processes": 2},)
    ),
    ("logp_sq_diff_half_mean", "NeMo-RL", "gen_kl_error"): Case(
        _curry(nemo, "gen_kl_error"),
        holds={"kl_type": "k2"},
        breaks=({"kl_type": "k1"}, {"kl_type": "k2", "global_batches": 2}),
    ),
    ("mult_prob_error", "NeMo-RL", "token_mult_prob_error"): Case(
        _curry(nemo, "token_mult_prob_error"), breaks=({"global_batches": 2},)
    ),
    ("prob_pearson", "verl", "training/rollout_actor_probs_pearson_corr"): Case(
        _curry(verl_debug, "pearson_corr")
    ),
    ("ess", "verl", "rollout_corr/rollout_is_eff_sample_size"): Case(
        lambda b, **kw: verl_is_metric("rollout_is_eff_sample_size", b, "sequence", **kw),
        prepare=equal_lengths,
        breaks=(
            {"prepare": lambda b: b},  # ragged lengths: verl weights each sequence by its tokens
            {"prepare": one_heavy_sequence},  # a weight above 2.0: verl clips it first
            {"micro_batches": 2},
            # verl 0.7.1 also raises a weight below 0.5 to 0.5 (0.9.1 keeps it: see below)
            {"prepare": one_light_sequence, "verl_version": "0.7.1"},
        ),
        rel_tol=1e-7,  # verl divides by mean + 1e-8
        noise=0.15,
    ),
    ("seq_mask_fraction_trl", "TRL", "importance_sampling_ratio"): Case(
        trl_sequence_mask_zeros, noise=0.6
    ),
    (
        "seq_mask_fraction_verl",
        "verl",
        "rollout_corr/rollout_rs_seq_sum_k1_seq_masked_fraction",
    ): Case(
        verl_seq_mis,
        prepare=calm_nan_rows,
        breaks=({"prepare": token_beyond_verl_clamp}, {"micro_batches": 4}),
        noise=0.6,
    ),
    ("tis_clip_fraction", "verl", "rollout_corr/rollout_is_ratio_fraction_high"): Case(
        lambda b, **kw: verl_is_metric("rollout_is_ratio_fraction_high", b, "token", **kw),
        breaks=({"micro_batches": 2},),
        rel_tol=1e-7,
        noise=0.6,
    ),
}

ENTRIES: list[tuple[str, Alias]] = [(m, a) for m, aliases in ALIASES.items() for a in aliases]
IDS = [f"{m}-{a.system}-{a.name}" for m, a in ENTRIES]


def _ours(metric: str, batch: Batch) -> float:
    if metric in CONSEQUENCE_METRICS:
        return float(getattr(compute_consequence(*batch), metric))
    return float(getattr(compute_mismatch(*batch), metric))


def _agree(theirs: float, ours: float, rel_tol: float = 1e-9) -> bool:
    return math.isclose(theirs, ours, rel_tol=rel_tol, abs_tol=1e-15)


def test_every_alias_has_a_reimplementation():
    listed = {(m, a.system, a.name) for m, a in ENTRIES}
    assert listed == set(CASES), "an alias without a re-implementation here, or one too many"
    for metric, alias in ENTRIES:
        case = CASES[metric, alias.system, alias.name]
        assert alias.exact == (not case.breaks and case.prepare is None), (
            f"{alias.system} {alias.name}: a conditional alias must be shown failing, an exact one "
            f"must hold without preparing the data"
        )
        assert alias.source.split()[0].count("/") == 1 and len(alias.source.split()) > 1


@pytest.mark.parametrize(("metric", "alias"), ENTRIES, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alias_agrees_where_its_condition_holds(metric: str, alias: Alias, seed: int):
    case = CASES[metric, alias.system, alias.name]
    batch = ragged(seed, noise=case.noise)
    if case.prepare:
        batch = case.prepare(batch)
    theirs, ours = case.theirs(batch, **case.holds), _ours(metric, batch)
    assert math.isfinite(ours)
    assert _agree(theirs, ours, case.rel_tol), (
        f"{alias.system} {alias.name}: {theirs!r} vs {ours!r}"
    )


CONDITIONAL = [e for e in ENTRIES if not e[1].exact]


@pytest.mark.parametrize(
    ("metric", "alias"), CONDITIONAL, ids=[f"{m}-{a.system}-{a.name}" for m, a in CONDITIONAL]
)
def test_conditional_alias_differs_when_its_condition_fails(metric: str, alias: Alias):
    case = CASES[metric, alias.system, alias.name]
    for breaking in case.breaks:
        settings = dict(breaking)
        prepare = settings.pop("prepare", case.prepare)
        batch = ragged(noise=case.noise)
        batch = prepare(batch) if prepare else batch
        theirs, ours = case.theirs(batch, **{**case.holds, **settings}), _ours(metric, batch)
        assert math.isfinite(theirs) and math.isfinite(ours)
        assert not math.isclose(theirs, ours, rel_tol=1e-6), (
            f"{alias.system} {alias.name} with {breaking}: still equal ({theirs!r}); the condition "
            f"in ALIASES is not what makes the figures agree"
        )


@pytest.mark.parametrize(("metric", "alias"), ENTRIES, ids=IDS)
def test_nan_tokens_under_the_mask(metric: str, alias: Alias):
    """We skip NaN tokens; only systems marked ``skips_nan`` give the same figure."""
    case = CASES[metric, alias.system, alias.name]
    batch = ragged(nan_tokens=True, noise=case.noise)
    if case.prepare:
        batch = case.prepare(batch)
    theirs, ours = case.theirs(batch, **case.holds), _ours(metric, batch)
    assert math.isfinite(ours) and compute_mismatch(*batch).nan_tokens >= 1
    agrees = _agree(theirs, ours, case.rel_tol)
    assert agrees == alias.skips_nan, f"{alias.system} {alias.name}: {theirs!r} vs {ours!r}"


def test_the_trl_adapter_reads_the_one_table():
    from precision_plugin.trl import adapter as trl_adapter

    assert aliases_for("TRL") == trl_adapter.TRL_METRIC_ALIASES
    m = compute_mismatch(*ragged())
    logs = {"sampling/sampling_logp_difference/mean": m.logp_abs_diff_mean, "loss": 1.0}
    logs["sampling/sampling_logp_difference/max"] = m.logp_abs_diff_max
    renamed = trl_adapter.alias_metrics(logs)
    assert renamed == {
        "logp_abs_diff_mean": m.logp_abs_diff_mean,
        "logp_abs_diff_max": m.logp_abs_diff_max,
    }
    assert set(renamed) <= set(m.to_dict())


def test_verl_0_9_keeps_a_light_sequence_weight_in_its_ess():
    """The ESS alias holds for a sequence weight below 0.5 from verl 0.9 on (it clamps at 0),
    as the condition says; verl 0.7.1 differs there (its break case above)."""
    batch = one_light_sequence(ragged(0, noise=0.15))
    log_w = (batch[0] - batch[1])[1, :3].sum()
    assert float(log_w) < math.log(0.5)  # the light sequence really is below 0.5
    theirs = verl_is_metric("rollout_is_eff_sample_size", batch, "sequence")
    assert _agree(theirs, _ours("ess", batch), rel_tol=1e-7)
