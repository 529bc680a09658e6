"""The alias catalogue, as data: which names other RL systems log for our mismatch metrics, and
when their figures agree with ours.

``ALIASES`` maps each of our metric names to frozen ``Alias`` records (one per system that logs
a figure for it); ``aliases_for`` and ``alias_table`` read it. ``tests/unit/test_aliases.py``
recomputes each alias with that system's own formula. Public path:
[`precision_plugin._core.metrics.mismatch`][precision_plugin._core.metrics.mismatch] (re-exported
there).
"""

from __future__ import annotations

from dataclasses import dataclass

from precision_plugin._base.boundary import checked, one_of


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
    # The consequence metrics (precision_plugin._core.metrics.consequence).
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
