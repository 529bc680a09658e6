"""vLLM adapter: one dtype and the cascade-attention guard for every vLLM engine.

Public entry points:

- [`engine_kwargs`][precision_plugin.vllm.engine_kwargs] - the kwargs an ``LLM(...)`` /
  ``EngineArgs`` should get (pure).
- [`cascade_guard`][precision_plugin.vllm.cascade_guard] - the guard's decision and reason for
  the installed vLLM and GPU.
- [`check_model_config`][precision_plugin.vllm.check_model_config] - fp16 refusals (raise) and
  overflow risks (warn) of a checkpoint.
- [`general_plugin`][precision_plugin.vllm.general_plugin] - the ``vllm.general_plugins`` entry
  point: active when ``PRECISION_PLUGIN`` is set or ``enable()`` ran in the process; reaches
  ``LLM(...)``, ``vllm serve`` and ``trl vllm-serve`` alike.
- [`verify_server`][precision_plugin.vllm.verify_server] /
  [`verify_engine`][precision_plugin.vllm.verify_engine] - compare what a server or a colocated
  engine actually runs with the policy.

The package, by concern: ``cascade`` (the version/GPU table of the cascade-attention bug),
``engine`` (engine kwargs, pure), ``models`` (checkpoint checks), ``enforce`` (the patches inside
vLLM processes and the general plugin), ``server`` (what a running engine or server runs),
``doctor``, ``probe_engine`` (vLLM as the probe's rollout engine) and ``adapter`` (the hooks).
vLLM itself is imported lazily, inside functions.
"""

from precision_plugin._core.model_risks import check_model_config
from precision_plugin.vllm.cascade import CascadeDecision, cascade_decision
from precision_plugin.vllm.enforce import (
    enforce_on_engine_args,
    general_plugin,
    install_vllm_patches,
)
from precision_plugin.vllm.engine import (
    EngineSettings,
    cascade_guard,
    engine_arg_fields,
    engine_kwargs,
    resolve_engine_kwargs,
    rollout_gpu_capability,
    vllm_version,
)
from precision_plugin.vllm.server import verify_engine, verify_server

__all__ = [
    "CascadeDecision",
    "EngineSettings",
    "cascade_decision",
    "cascade_guard",
    "check_model_config",
    "engine_arg_fields",
    "engine_kwargs",
    "enforce_on_engine_args",
    "general_plugin",
    "install_vllm_patches",
    "resolve_engine_kwargs",
    "rollout_gpu_capability",
    "verify_engine",
    "verify_server",
    "vllm_version",
]
