"""``precision_plugin.vllm.models``: its old public path. The model-risk tables and checkpoint
checks live in [`precision_plugin._core.model_risks`][precision_plugin._core.model_risks] (layer
2), shared by
the vLLM and SGLang adapters and the probe."""

from precision_plugin._core.model_risks import (
    FP16_OVERFLOW_RISK,
    VLLM_FP16_REFUSED,
    check_engine_model,
    check_model_config,
    checkpoint_dtype,
    config_json_for,
    load_model_config,
    vllm_refusal_table,
)

__all__ = [
    "FP16_OVERFLOW_RISK",
    "VLLM_FP16_REFUSED",
    "check_engine_model",
    "check_model_config",
    "checkpoint_dtype",
    "config_json_for",
    "load_model_config",
    "vllm_refusal_table",
]
