"""OpenRLHF adapter: one policy for OpenRLHF's DeepSpeed learner and its Ray-hosted vLLM engines.

OpenRLHF's ``create_vllm_engines`` hard-codes ``dtype="bfloat16"`` for every engine, so
``--ds.param_dtype fp16`` alone trains in fp16 and samples in bf16 (and the released versions'
weight sync then fails at the first sync). The plugin closes the gap from both ends:

- [`args`][precision_plugin.openrlhf.args] - the ``train_ppo_ray`` arguments for the learner
  (also ``precision-plugin openrlhf-args``).
- [`runtime_env`][precision_plugin.openrlhf.runtime_env] - the Ray ``runtime_env`` carrying
  ``PRECISION_PLUGIN`` (merged with OpenRLHF's own variables). In each engine actor the plugin's
  ``vllm.general_plugins`` entry point then replaces the hard-coded bf16 with the policy dtype
  and says so in the actor's log.
- [`check_args`][precision_plugin.openrlhf.check_args] - every contradiction between OpenRLHF's
  parsed arguments, the environment the actors get, the installed OpenRLHF and vLLM, and the
  policy, in one error (strict) or one warning.
- [`parse_args`][precision_plugin.openrlhf.parse_args] - a command line parsed by the installed
  OpenRLHF's own parser, for ``check_args``.

The package, by concern: ``layout`` (OpenRLHF's flags and hard-coded values by version, pure),
``installed`` (what the installed OpenRLHF does, read from its source), ``launch`` (arguments
and runtime env), ``check``, ``parse``, ``doctor`` and ``adapter`` (the hooks). Nothing here
imports OpenRLHF at module level.
"""

from __future__ import annotations

from precision_plugin.openrlhf.check import check_args, find_problems
from precision_plugin.openrlhf.installed import WeightSync, installed
from precision_plugin.openrlhf.launch import args, runtime_env
from precision_plugin.openrlhf.layout import Layout, layout
from precision_plugin.openrlhf.parse import parse_args

__all__ = [
    "Layout",
    "WeightSync",
    "args",
    "check_args",
    "find_problems",
    "installed",
    "layout",
    "parse_args",
    "runtime_env",
]
