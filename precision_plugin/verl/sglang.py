"""verl's SGLang rollout (``actor_rollout_ref.rollout.name=sglang``): its precision keys and
their checks (pure; neither verl nor SGLang is imported).

verl 0.7.1 and 0.9.1 build SGLang's ``ServerArgs`` from ``rollout.dtype`` and then spread
``rollout.engine_kwargs.sglang`` over it (``workers/rollout/sglang_rollout/
async_sglang_server.py``), so ``engine_kwargs.sglang.dtype`` wins over ``rollout.dtype``. The
server starts through ``Engine._launch_subprocesses``, which resolves the arguments before
SGLang loads plugins: the dtype comes from this config (the overrides set both keys), and the
plugin's ``sglang.srt.plugins`` entry point verifies it in SGLang's processes.
"""

from __future__ import annotations

from typing import Any

from precision_plugin._base.config_lookup import lookup
from precision_plugin._core.frameworks import sglang_dtype
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.sglang.args import read_server_args
from precision_plugin.sglang.check import trap_findings
from precision_plugin.verl.contradiction import Contradiction
from precision_plugin.verl.layout import RAY_ENV_VARS, ROLLOUT

SGLANG_ENGINE_KWARGS = f"{ROLLOUT}.engine_kwargs.sglang"


def is_sglang(cfg: Any) -> bool:
    """True when the composed config's rollout engine is SGLang."""
    return lookup(cfg, f"{ROLLOUT}.name") == "sglang"


def rollout_dtype_key(cfg: Any) -> str:
    """The key that decides the rollout dtype: ``engine_kwargs.sglang.dtype`` when an SGLang
    rollout sets it, else ``rollout.dtype``."""
    if is_sglang(cfg) and lookup(cfg, f"{SGLANG_ENGINE_KWARGS}.dtype") is not None:
        return f"{SGLANG_ENGINE_KWARGS}.dtype"
    return f"{ROLLOUT}.dtype"


def engine_args(cfg: Any) -> dict[str, Any]:
    """The SGLang arguments verl passes for this config's rollout (the precision-relevant ones):
    ``rollout.dtype`` with ``engine_kwargs.sglang`` spread over it."""
    kwargs = lookup(cfg, SGLANG_ENGINE_KWARGS) or {}
    items = kwargs.items() if hasattr(kwargs, "items") else []
    return {"dtype": lookup(cfg, f"{ROLLOUT}.dtype", "bfloat16"), **dict(items)}


def sglang_overrides(policy: PrecisionPolicy) -> list[str]:
    """The extra override of an SGLang rollout: its engine kwargs' ``dtype`` (it would win over
    ``rollout.dtype``)."""
    return [f"++{SGLANG_ENGINE_KWARGS}.dtype={sglang_dtype(policy)}"]


def sglang_contradictions(cfg: Any, policy: PrecisionPolicy) -> list[Contradiction]:
    """The SGLang traps an SGLang rollout's engine kwargs set against ``policy`` (bf16 logits of
    ``rl_on_policy_target``, a bf16 KV cache, the hpc_ops backends) and a NaN sanitizer in the
    Ray workers' environment; empty for another rollout engine. The dtype itself is checked with
    the other keys (:func:`rollout_dtype_key`)."""
    if not is_sglang(cfg):
        return []
    env = lookup(cfg, RAY_ENV_VARS) or {}
    environ = {str(k): str(v) for k, v in (env.items() if hasattr(env, "items") else [])}
    values = read_server_args(engine_args(cfg))
    where = "verl's SGLang rollout"
    out = []
    for finding in trap_findings(values, None, policy, environ, where):
        if finding.status == "error":
            out.append(Contradiction(SGLANG_ENGINE_KWARGS, finding.message, finding.fix))
    return out
