"""SGLang adapter: one dtype for SGLang rollout engines, the traps around it, and what a server
runs. SGLang is the rollout engine of slime, AReaL and verl's ``rollout.name=sglang``.

Public entry points:

- [`server_args`][precision_plugin.sglang.server_args] - the flags (``sglang serve``), keyword
  arguments (``sglang.Engine``) and environment of a launch under the policy (pure).
- [`check_server_args`][precision_plugin.sglang.check_server_args] - the dtype a launch runs
  (``auto`` decided from the checkpoint) and the traps: ``--rl-on-policy-target`` (bf16
  logits), ``SGLANG_SANITIZE_NAN_LOGITS`` (hides fp16 overflow), bf16-only paths, and the
  checkpoint's float16 risks (SGLang refuses no model in float16).
- [`verify_server`][precision_plugin.sglang.verify_server] - ``GET /server_info`` of a running
  server, compared with the policy.
- [`general_plugin`][precision_plugin.sglang.general_plugin] - the ``sglang.srt.plugins`` entry
  point: sets the dtype where SGLang resolves its arguments, verifies it in every process that
  builds a model config, active when ``PRECISION_PLUGIN`` is set or ``enable()`` ran.
- slime: [`slime_args`][precision_plugin.slime.slime_args] /
  [`check_slime_args`][precision_plugin.slime.check_slime_args]; AReaL:
  [`areal_overrides`][precision_plugin.areal.areal_overrides] /
  [`check_areal_config`][precision_plugin.areal.check_areal_config]. verl's sglang rollout is
  in ``precision_plugin.verl``.

The package, by concern: ``args`` (launch arguments, pure), ``checkpoint`` (what SGLang makes of
a ``config.json``), ``check`` (the launch check), ``server`` (``/server_info``), ``plugin`` (the
entry point and its hooks), ``slime``, ``areal``, ``doctor`` and ``adapter``. SGLang itself is
imported only inside its own processes, by the entry point.
"""

from precision_plugin._base import moved
from precision_plugin.sglang.args import LaunchSettings, read_server_args, server_args
from precision_plugin.sglang.check import check_server_args
from precision_plugin.sglang.checkpoint import auto_dtype
from precision_plugin.sglang.plugin import general_plugin
from precision_plugin.sglang.server import verify_server

__all__ = [
    "LaunchSettings",
    "auto_dtype",
    "check_server_args",
    "general_plugin",
    "read_server_args",
    "server_args",
    "verify_server",
]


# slime's and AReaL's names (precision_plugin.slime, precision_plugin.areal: orchestrators,
# layer 4) under their old path here resolve through the alias table, by name.
__getattr__ = moved.getattr_of(__name__)
