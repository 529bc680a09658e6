"""The probe: measure the train/rollout mismatch of a model in each dtype, before any training.

By concern: ``schema`` (configuration and results), ``inputs`` (device, model folder, prompts),
``engine`` (the one HF rollout engine and the engine protocol), ``scoring`` (the trainer side
and the self-check), ``length`` (the log-ratio against length), ``advice`` (what the mismatch
does to RL at the target length, the verdicts, what to do), ``layerwise`` (where the two sides
part), ``run`` (the measurement itself), ``table`` and ``plot`` (rendering), ``gguf`` (a
checkpoint folder from a GGUF file) and ``tiny_model`` (the embedded default model).
vLLM's engine lives in ``precision_plugin.vllm.probe_engine`` and is offered through the
``precision_probe_engines`` hook.
"""

from precision_plugin._core.hf_engine import (
    HFRolloutEngine,
    RolloutEngine,
    RolloutSample,
    hf_engine_factory,
    load_causal_lm,
)
from precision_plugin.probe.inputs import (
    MAX_PROMPT_TOKENS,
    PROMPTS,
    build_prompts,
    check_model_dir,
    completion_budgets,
    encode_prompts,
    read_prompts_file,
    resolve_device,
)
from precision_plugin.probe.length import LengthBucket, LengthEffect, length_effect
from precision_plugin.probe.run import available_engines, run_probe
from precision_plugin.probe.schema import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_DTYPES,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_NUM_PROMPTS,
    DEFAULT_SEED,
    DEFAULT_TARGET_LENGTH,
    SELF_CHECK_DTYPE,
    DtypeResult,
    ProbeConfig,
    ProbeResult,
    SelfCheck,
)
from precision_plugin.probe.scoring import measure, self_check, trainer_logprobs, trainer_precision

__all__ = [
    "DEFAULT_DTYPES",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_NUM_PROMPTS",
    "DEFAULT_SEED",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_TARGET_LENGTH",
    "MAX_PROMPT_TOKENS",
    "PROMPTS",
    "SELF_CHECK_DTYPE",
    "DtypeResult",
    "LengthBucket",
    "LengthEffect",
    "HFRolloutEngine",
    "ProbeConfig",
    "ProbeResult",
    "RolloutEngine",
    "RolloutSample",
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
]
