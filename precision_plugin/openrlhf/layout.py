"""Where OpenRLHF keeps each precision setting, by version, and what it hard-codes (pure).

Read from the released wheels 0.9.10 - 0.11.2 (``openrlhf/cli/train_ppo_ray.py``,
``trainer/ray/vllm_engine.py``, ``trainer/ray/vllm_worker_wrap.py``, ``utils/deepspeed/``):

- learner: ``--ds.param_dtype {bf16,fp16}`` (default bf16) from 0.10.2; ``--param_dtype``
  before, with every other flag flat too (``--vllm_num_engines``). Only the hierarchical
  generation (0.10.2+) is supported here.
- train/rollout importance-sampling (IS) correction, the only switch under which OpenRLHF logs
  its mismatch metric ``vllm_kl``: ``--algo.advantage.is_correction_enable`` (0.10.2 - 0.11.1),
  ``--algo.advantage.is_correction_level {off,token,seq}`` (0.11.2+).
- vLLM engines: ``create_vllm_engines`` passes ``"dtype": "bfloat16"`` to every
  ``RolloutRayActor``, and ``"worker_extension_cls": "openrlhf.trainer.ray.vllm_worker_wrap.
  WorkerWrap"``, which is how an engine built there is recognised inside the actor.
- weight sync: the learner sends ``param.dtype``; ``WorkerWrap.update_weight`` and
  ``update_weight_cuda_ipc`` assert it equals the engine's ``model_config.dtype``.
- DeepSpeed AutoTP (``--ds.tensor_parallel_size`` > 1) and 4-bit loading (``--ds.load_in_4bit``)
  assert ``param_dtype == "bf16"``.
- Ray: ``train()`` calls ``ray.init(runtime_env={"env_vars": {...}})`` with three variables of
  its own, and only when Ray is not initialized yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from precision_plugin._base import versions
from precision_plugin._base.boundary import checked, version_text
from precision_plugin._core.builders import built_by_openrlhf  # noqa: F401 (its public path here)
from precision_plugin.errors import PrecisionConfigError

#: First release with the hierarchical command line (``--ds.param_dtype``).
SUPPORTED_SINCE = Version("0.10.2")
#: First release with ``--algo.advantage.is_correction_level`` (replacing ``..._enable``).
IS_LEVEL_SINCE = Version("0.11.2")
#: The layout assumed when no OpenRLHF is installed and no version is given.
ASSUMED_VERSION = Version("0.11.2")

#: Parsed-argument keys (``args.ds.param_dtype`` after OpenRLHF's ``hierarchize``).
PARAM_DTYPE = "ds.param_dtype"
TENSOR_PARALLEL = "ds.tensor_parallel_size"
LOAD_IN_4BIT = "ds.load_in_4bit"
NUM_ENGINES = "vllm.num_engines"
MODEL = "actor.model_name_or_path"
IS_ENABLE = "algo.advantage.is_correction_enable"
IS_LEVEL = "algo.advantage.is_correction_level"

#: The variables ``train()`` passes to ``ray.init`` and their defaults (it reads the driver's
#: environment first).
RAY_ENV_VARS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
}

#: The dtype ``create_vllm_engines`` hard-codes for every engine.
ENGINE_DTYPE = "bfloat16"
#: The ``worker_extension_cls`` every engine of ``create_vllm_engines`` gets.
WORKER_EXTENSION = "openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap"

#: What OpenRLHF's fp16 DeepSpeed section (``{"enabled": true}`` only) runs: DeepSpeed's own
#: dynamic loss scaler defaults (``DeepSpeedFP16Config``), in the policy's ``loss_scaler`` terms.
DEEPSPEED_FP16_SCALER = {
    "enabled": True,
    "init_scale": 2.0**16,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 1000,
    "hysteresis": 2,
    "min_scale": 1.0,
}


def flag(key: str) -> str:
    """The flag of a parsed-argument key: ``ds.param_dtype`` -> ``--ds.param_dtype``."""
    return f"--{key}"


@checked
@dataclass(frozen=True)
class Layout:
    """The precision flags of one OpenRLHF version."""

    version: Version

    @property
    def is_switch(self) -> str:
        """The key that turns the IS correction (and ``vllm_kl``) on in this version."""
        return IS_LEVEL if self.version >= IS_LEVEL_SINCE else IS_ENABLE

    @property
    def retired_is_switch(self) -> str:
        """The IS key of the other generation, which this version's parser does not know."""
        return IS_ENABLE if self.version >= IS_LEVEL_SINCE else IS_LEVEL

    def is_on_flags(self) -> list[str]:
        """The flags that turn the IS correction on (token level, OpenRLHF's defaults otherwise)."""
        if self.version >= IS_LEVEL_SINCE:
            return [flag(IS_LEVEL), "token"]
        return [flag(IS_ENABLE)]


@checked(version=version_text("OpenRLHF", "0.11.2"))
def openrlhf_version(version: str | Version | None = None) -> Version:
    """``version`` when given, else the installed OpenRLHF's, else :data:`ASSUMED_VERSION`."""
    if version is not None:
        try:
            return versions.parse_version(version)
        except InvalidVersion:
            raise PrecisionConfigError(
                f"openrlhf_version={version!r} was given, which is not a version number; pass "
                f"one such as '0.11.2' (or nothing, for the installed OpenRLHF)."
            ) from None
    return versions.installed_version("openrlhf") or ASSUMED_VERSION


@checked(version=version_text("OpenRLHF", "0.11.2"))
def layout(version: str | Version | None = None) -> Layout:
    """The :class:`Layout` of OpenRLHF ``version`` (default: installed); refuses < 0.10.2."""
    v = openrlhf_version(version)
    if v < SUPPORTED_SINCE:
        raise PrecisionConfigError(
            f"OpenRLHF {v} was asked for; precision_plugin knows the command line of OpenRLHF "
            f">= {SUPPORTED_SINCE} (--ds.param_dtype). Older releases spell it --param_dtype "
            f"with flat flags. Upgrade OpenRLHF, or pass --param_dtype "
            f"fp16/bf16 yourself and export PRECISION_PLUGIN for its engines."
        )
    return Layout(v)
