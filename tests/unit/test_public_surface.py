"""The public surface, pinned: every module and name docs/api.md documents, every subpackage's
``__all__``, the console script and the three entry points stay importable under the same names
through any move of the code (issue 29: a move, not a change of behaviour).

``DOCUMENTED`` is a snapshot of docs/api.md's targets at their current paths (old paths: test_moved.py);
``test_api_md_targets_are_pinned`` keeps it in step with the page, so a name the page gains is
pinned here too.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import precision_plugin

ROOT = Path(__file__).resolve().parents[2]

#: Module -> public names it documents (docs/api.md), as of the layered restructuring.
DOCUMENTED: dict[str, list[str]] = {
    "precision_plugin._core.configs": [
        "AREAL",
        "DIALECTS",
        "MEGATRON",
        "OPENRLHF",
        "SGLANG",
        "SLIME",
        "TRL",
        "VERL",
        "Dialect",
        "Key",
        "Pair",
        "load",
        "parse_override",
    ],
    "precision_plugin._core.configs.megatron": ["MEGATRON_COMMIT", "MEGATRON_PAIRS", "RULES"],
    "precision_plugin._base.constraints": [
        "AtMost",
        "Each",
        "Finite",
        "Ordered",
        "Whole",
        "constraints_of",
        "relations_for",
        "validator_for",
    ],
    "precision_plugin._base.conflicts": ["settle_conflict"],
    "precision_plugin._core.intervals": [
        "Interval",
        "clopper_pearson",
        "variance_normal",
        "variance_robust",
        "excess_kurtosis",
        "batch_ess",
        "mixed_batch_ess",
        "expected_batch_ess",
        "ratio_interval",
        "COVERAGE",
        "LAPLACE_EXCESS_KURTOSIS",
    ],
    "precision_plugin._core.misfit": ["check_growth", "GrowthCheck"],
    "precision_plugin._core.canary.workers": ["batch_metrics", "check_canary", "masked_rows"],
    "precision_plugin._core.scoring.float16_cpu": [
        "widen_float16",
        "widen_float16_linears",
        "widen_float16_attention",
        "float16_autocast_linears",
        "float16_attention",
        "sdpa_float16",
        "widened",
        "MIN_ROWS",
        "KEY_TILE",
        "CHUNK_SCORES",
        "ATTENTION",
    ],
    "precision_plugin._core.scoring.multinomial_cpu": ["Multinomial", "exact_draw"],
    "precision_plugin._core.scoring.packed_cpu": [
        "pack_linears",
        "rows_for",
        "packed_product",
        "trainer_kernels",
        "PACK_ROWS",
        "MIN_ROWS",
    ],
    "precision_plugin._core.scoring.fused_cpu": [
        "fuse_shared_inputs",
        "fusable",
        "SharedInputProduct",
    ],
    "precision_plugin._core.scoring.sglang": [
        "SGLangScorer",
        "generate_request",
        "completion_logprobs",
        "logprob_start",
    ],
    "precision_plugin.vllm.invariance": [
        "invariant_backends",
        "selected_backend",
        "attention_backend_findings",
        "check_attention_backend",
    ],
    "precision_plugin._core.canary": [
        "CanaryMonitor",
        "CanaryCheck",
        "canary_band",
        "CanaryBand",
        "token_k3",
        "VERDICT_CODES",
        "certify_batch_invariance",
        "Invariance",
        "precision_level",
    ],
    "precision_plugin._core.decision": [
        "decide",
        "Decision",
        "Evidence",
        "Headroom",
        "Attribution",
        "apply_forms",
        "prompts_to_decide",
    ],
    "precision_plugin.audit": ["audit_run", "contradictions"],
    "precision_plugin._core.buffers": [
        "FLOAT32_BUFFERS",
        "Float32Buffer",
        "buffer_dtypes",
        "cast_model",
        "float32_buffers",
        "keep_float32_buffers",
        "keeps_float32",
    ],
    "precision_plugin.callback": ["PrecisionCallback"],
    "precision_plugin._core.metrics.consequence": [
        "Consequence",
        "GrowthFit",
        "Interval",
        "Projection",
        "SEQUENCE_MASKS",
        "SequenceMask",
        "TIS_CLIP",
        "combine_log_moments",
        "compute_consequence",
        "consequence_from_sums",
        "consequence_sums",
        "fit_growth",
        "project",
    ],
    "precision_plugin.deepspeed": [
        "apply_config",
        "config_policy",
        "engine_dtype",
        "engine_scaler_stats",
        "track_engine",
    ],
    "precision_plugin.errors": [
        "AdapterInstallError",
        "ForwardOverflowError",
        "LossScaleAtMinimumError",
        "PrecisionConfigError",
        "PrecisionMismatchError",
        "PrecisionPluginError",
        "ServerUnreachableError",
        "settle_conflict",
    ],
    "precision_plugin._core.frameworks": [
        "GradScalerSettings",
        "TrainerFlags",
        "deepspeed_autocast_flag",
        "deepspeed_dynamic_scaling",
        "deepspeed_enabled_sections",
        "deepspeed_flag",
        "deepspeed_min_scale",
        "deepspeed_scale_power",
        "flags_of",
        "grad_scaler",
        "mixed_precision",
        "openrlhf_learner_dtype",
        "openrlhf_param_dtype",
        "settle_once",
        "sglang_dtype",
        "sglang_runs",
        "trainer_flags",
        "vllm_dtype",
    ],
    "precision_plugin.hookspecs": [
        "precision_collect_metrics",
        "precision_doctor",
        "precision_install",
        "precision_probe_engines",
        "precision_train_begin",
        "precision_train_end",
        "precision_uninstall",
    ],
    "precision_plugin._core.manager": [
        "active_patches",
        "call_each",
        "current_policy",
        "disable",
        "enable",
        "hook_impls",
        "requested_policy",
        "resolve_policy",
    ],
    "precision_plugin._core.master_weights": ["check_model", "prepare_model"],
    "precision_plugin._core.metrics.mismatch": [
        "ALIASES",
        "Alias",
        "MismatchMetrics",
        "aliases_for",
        "compute_mismatch",
        "drift_fit",
        "drift_per_1k",
        "metrics_from_sums",
        "mismatch_sums",
        "verdict",
    ],
    "precision_plugin.openrlhf": [
        "args",
        "check_args",
        "find_problems",
        "parse_args",
        "runtime_env",
    ],
    "precision_plugin._core.overflow": [
        "Fp32Fallback",
        "HeadroomReport",
        "ModuleHeadroom",
        "OverflowDetector",
        "OverflowEvent",
        "Recommendation",
        "fp16_margin_bits",
        "headroom",
        "keep_fp32_modules",
        "match_modules",
    ],
    "precision_plugin._base.patching": ["Patcher"],
    "precision_plugin.policy": ["PrecisionPolicy"],
    "precision_plugin.probe": [
        "HFRolloutEngine",
        "ProbeConfig",
        "ProbeResult",
        "RolloutEngine",
        "RolloutSample",
        "run_probe",
    ],
    "precision_plugin.probe.advice": [
        "ConsequenceReport",
        "DtypeConsequence",
        "ESS_GOOD",
        "ESS_WARNING",
        "NEGLIGIBLE",
        "assess",
    ],
    "precision_plugin.probe.gguf": ["checkpoint_from_gguf", "find_gguf"],
    "precision_plugin.probe.layerwise": [
        "DtypeLayerwise",
        "LayerwiseReport",
        "PART_FACTOR",
        "StageDivergence",
        "replay",
    ],
    "precision_plugin._base.report": ["Finding"],
    "precision_plugin._core.sampling": ["LogitsProcessor", "SamplingSettings"],
    "precision_plugin._core.scaler": ["ScalerStats", "check_scale_floor", "make_grad_scaler"],
    "precision_plugin.sglang": [
        "LaunchSettings",
        "auto_dtype",
        "check_server_args",
        "general_plugin",
        "read_server_args",
        "server_args",
        "verify_server",
    ],
    "precision_plugin.slime": ["check_slime_args", "slime_args"],
    "precision_plugin.areal": ["areal_overrides", "check_areal_config"],
    "precision_plugin.trl": ["HFRollout"],
    "precision_plugin.trl.rollout": ["sampling_settings"],
    "precision_plugin.vllm": [
        "cascade_guard",
        "check_model_config",
        "engine_kwargs",
        "general_plugin",
        "verify_engine",
        "verify_server",
    ],
}

#: Each subpackage's ``__all__`` (a subset may grow; none of these may go).
SUBPACKAGE_ALL: dict[str, list[str]] = {
    "precision_plugin._core.configs": [
        "AREAL",
        "DIALECTS",
        "MEGATRON",
        "OPENRLHF",
        "SGLANG",
        "SLIME",
        "TRL",
        "VERL",
        "Dialect",
        "Key",
        "Pair",
        "load",
        "parse_override",
    ],
    "precision_plugin.trl": ["HFRollout", "TRL_METRIC_ALIASES", "alias_metrics"],
    "precision_plugin.vllm": [
        "CascadeDecision",
        "EngineSettings",
        "cascade_decision",
        "cascade_guard",
        "check_model_config",
        "enforce_on_engine_args",
        "engine_arg_fields",
        "engine_kwargs",
        "general_plugin",
        "install_vllm_patches",
        "resolve_engine_kwargs",
        "rollout_gpu_capability",
        "verify_engine",
        "verify_server",
        "vllm_version",
    ],
    "precision_plugin.sglang": [
        "LaunchSettings",
        "auto_dtype",
        "check_server_args",
        "general_plugin",
        "read_server_args",
        "server_args",
        "verify_server",
    ],
    "precision_plugin.verl": [
        "Contradiction",
        "Layout",
        "check_config",
        "find_contradictions",
        "layout",
        "overrides",
    ],
    "precision_plugin.openrlhf": [
        "Layout",
        "WeightSync",
        "args",
        "check_args",
        "find_problems",
        "installed",
        "layout",
        "parse_args",
        "runtime_env",
    ],
    "precision_plugin.deepspeed": [
        "SECTION",
        "apply_config",
        "config_policy",
        "engine_dtype",
        "engine_scaler_stats",
        "load_config",
        "track_engine",
        "translate",
    ],
    "precision_plugin.probe": [
        "DEFAULT_DTYPES",
        "DEFAULT_MAX_NEW_TOKENS",
        "DEFAULT_NUM_PROMPTS",
        "DEFAULT_SEED",
        "DEFAULT_TARGET_LENGTH",
        "DtypeResult",
        "HFRolloutEngine",
        "LengthBucket",
        "LengthEffect",
        "MAX_PROMPT_TOKENS",
        "PROMPTS",
        "ProbeConfig",
        "ProbeResult",
        "RolloutEngine",
        "RolloutSample",
        "SELF_CHECK_DTYPE",
        "SelfCheck",
        "available_engines",
        "build_prompts",
        "check_model_dir",
        "completion_budgets",
        "encode_prompts",
        "hf_engine_factory",
        "length_effect",
        "load_causal_lm",
        "measure",
        "read_prompts_file",
        "resolve_device",
        "run_probe",
        "self_check",
        "trainer_logprobs",
        "trainer_precision",
    ],
    "precision_plugin.sanity": [
        "DtypeRun",
        "PRESETS",
        "SanityConfig",
        "SanityResult",
        "SeedRun",
        "StepRecord",
        "check_engine",
        "missing_fields",
        "preset_config",
        "run_sanity",
    ],
    "precision_plugin._core.overflow": [
        "FP16_MAX",
        "Fp32Fallback",
        "HeadroomReport",
        "ModuleHeadroom",
        "OverflowDetector",
        "OverflowEvent",
        "Recommendation",
        "fp16_margin_bits",
        "headroom",
        "keep_fp32_modules",
        "match_modules",
        "recommend",
    ],
}

TOP_LEVEL = [
    "AdapterInstallError",
    "ForwardOverflowError",
    "LossScaleAtMinimumError",
    "PrecisionCallback",
    "PrecisionConfigError",
    "PrecisionMismatchError",
    "PrecisionPluginError",
    "PrecisionPolicy",
    "__version__",
    "current_policy",
    "disable",
    "enable",
    "prepare_model",
    "resolve_policy",
]

#: pyproject.toml's console script and entry points: (group, value).
ENTRY_POINTS = [
    ("console_scripts", "precision_plugin.cli:main"),
    ("vllm.general_plugins", "precision_plugin.vllm:general_plugin"),
    ("verl.plugins", "precision_plugin.verl.plugin"),
    ("sglang.srt.plugins", "precision_plugin.sglang:general_plugin"),
]


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_documented_names_importable(module: str) -> None:
    """Every name docs/api.md documents is importable from the module the page names."""
    mod = importlib.import_module(module)
    missing = [n for n in DOCUMENTED[module] if not hasattr(mod, n)]
    assert missing == [], f"{module} lost {missing}"


@pytest.mark.parametrize("module", sorted(SUBPACKAGE_ALL))
def test_subpackage_all_kept(module: str) -> None:
    """Each subpackage's ``__all__`` keeps every name, and each resolves."""
    mod = importlib.import_module(module)
    assert set(SUBPACKAGE_ALL[module]) <= set(mod.__all__)
    assert [n for n in SUBPACKAGE_ALL[module] if not hasattr(mod, n)] == []


def test_top_level_all() -> None:
    """``precision_plugin.__all__`` is exactly the public API of DESIGN.md, all resolvable."""
    assert sorted(precision_plugin.__all__) == sorted(TOP_LEVEL)
    for name in TOP_LEVEL:
        assert getattr(precision_plugin, name) is not None


@pytest.mark.parametrize(("group", "value"), ENTRY_POINTS)
def test_entry_points(group: str, value: str) -> None:
    """pyproject.toml still declares each entry point, and its target imports and is callable
    (or, for verl's module entry point, is a module)."""
    text = (ROOT / "pyproject.toml").read_text()
    assert f'"{value}"' in text
    module, _, attr = value.partition(":")
    mod = importlib.import_module(module)
    if attr:
        assert callable(getattr(mod, attr))


def test_api_md_targets_are_pinned() -> None:
    """Every ``::: target`` of docs/api.md is a module (or a name in one) pinned above."""
    text = (ROOT / "docs" / "api.md").read_text()
    for target in re.findall(r"^::: (\S+)", text, re.M):
        module = target
        while module not in DOCUMENTED and "." in module:
            module = module.rsplit(".", 1)[0]
        assert module in DOCUMENTED, target
