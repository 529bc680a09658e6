"""The Hydra overrides that make a verl run follow the policy (pure; verl is never imported)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from precision_plugin._base.boundary import checked, gpu_capability, one_of, version_text
from precision_plugin._core.frameworks import vllm_dtype
from precision_plugin._core.manager import resolve_policy
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import ENV_VAR, PrecisionPolicy
from precision_plugin.verl.layout import (
    LONG_NAME,
    RAY_ENV_VARS,
    ROLLOUT,
    SHORT_NAME,
    STRATEGIES,
    TURBO_AUTOCAST,
    TURBO_PARAM_DTYPE,
    VLLM_ENGINE_KWARGS,
    Layout,
    layout,
)

_AUTO: Any = object()


def _changes(value: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            nested = _changes(item, default[key])
            if nested:
                out[key] = nested
        elif item != default[key]:
            out[key] = item
    return out


@checked
def env_value(policy: PrecisionPolicy) -> str:
    """The ``PRECISION_PLUGIN`` value that carries ``policy`` into Ray workers, Hydra-quoted.

    A policy that differs from the defaults only in its dtype travels as the dtype name; any
    other as single-quoted compact JSON of the fields that differ (no spaces, so
    ``$(precision-plugin verl-overrides)`` splits it as one word, and Hydra reads the quotes).
    """
    changes = _changes(policy.to_dict(), PrecisionPolicy().to_dict())
    changes.pop("dtype", None)
    if not changes:
        return policy.dtype
    data = {"dtype": policy.dtype, **changes}
    return "'" + json.dumps(data, sort_keys=True, separators=(",", ":")) + "'"


@checked
def learner_overrides(policy: PrecisionPolicy, lay: Layout) -> list[str]:
    """Overrides for the actor, reference and critic learners of ``lay``.

    FSDP gets both keys on every version: ``mixed_precision.param_dtype`` is what the engine of
    verl >= 0.8 (and the legacy critic) reads, ``fsdp_config.dtype`` what the legacy actor and
    reference of verl <= 0.7 autocast and scale in; setting both keeps the config free of the
    ignored-key trap either way. ``++`` adds ``mixed_precision``, absent from verl's YAML.
    """
    out: list[str] = []
    if lay.megatron:
        if policy.dtype not in ("float16", "bfloat16"):
            raise PrecisionConfigError(
                f"verl's Megatron learner was asked to run {policy.dtype}; megatron.dtype "
                f"accepts only bfloat16 or float16 (verl McoreEngineConfig). Use "
                f"dtype='float16' or 'bfloat16', or the FSDP strategy."
            )
        for section in lay.learners.values():
            out.append(f"{section}.dtype={LONG_NAME[policy.dtype]}")
        return out
    if lay.turbo and policy.dtype != TURBO_AUTOCAST:
        raise PrecisionConfigError(
            f"verl's FSDP-Turbo learner (strategy=fsdp_turbo, verl {lay.version}) was asked to "
            f"run {policy.dtype}; its engine replaces _build_fsdp_module, where the FSDP engine "
            f"sets its autocast dtype and float16 loss scaler, so it always computes in "
            f"{TURBO_AUTOCAST} without a scaler and no override changes that. Use "
            f"strategy='fsdp' (or fsdp2), or dtype='bfloat16'."
        )
    for section in lay.learners.values():
        out.append(f"{section}.dtype={LONG_NAME[policy.dtype]}")
        out.append(f"++{section}.mixed_precision.param_dtype={SHORT_NAME[policy.dtype]}")
        if lay.turbo:
            out.append(f"++{section}.{TURBO_PARAM_DTYPE}={SHORT_NAME[policy.dtype]}")
    return out


@checked(vllm_version=version_text("vLLM"), capability=gpu_capability)
def cascade_overrides(
    policy: PrecisionPolicy, *, vllm_version: Any = _AUTO, capability: Any = _AUTO
) -> list[str]:
    """``disable_cascade_attn=True`` through the rollout's vLLM engine kwargs, where needed.

    The decision is the vLLM adapter's (installed vLLM and GPU unless given). Where vLLM has
    no flag (< 0.8.2) the vLLM general plugin, reached through ``PRECISION_PLUGIN``, patches the
    engine instead; where the flag is deprecated (>= 0.32) nothing is passed.
    """
    from precision_plugin.vllm.engine import decide_cascade

    kwargs: dict[str, Any] = {}
    if vllm_version is not _AUTO:
        kwargs["version"] = vllm_version
    if capability is not _AUTO:
        kwargs["capability"] = capability
    decision = decide_cascade(policy, **kwargs)
    if decision.action == "pass_flag":
        return [f"++{VLLM_ENGINE_KWARGS}.disable_cascade_attn=True"]
    return []


@checked(vllm_version=version_text("vLLM"))
def ray_invariance_overrides(policy: PrecisionPolicy, *, vllm_version: Any = _AUTO) -> list[str]:
    """``VLLM_BATCH_INVARIANT=1`` in the Ray workers' environment with ``batch_invariant='on'``
    (verl starts its vLLM engines in Ray actors, which read it at engine start): nothing for a
    vLLM older than 0.11.1 (no such mode); a vLLM not installed here is assumed to have it."""
    from precision_plugin._core.batch_invariance import batch_invariant_env

    if vllm_version is _AUTO:
        from precision_plugin._base.versions import installed_version

        vllm_version = installed_version("vllm")
    env = batch_invariant_env(policy, None if vllm_version is None else str(vllm_version))
    # Quoted: Hydra reads a bare 1 as an int, and Ray's env_vars take strings only.
    return [f"++{RAY_ENV_VARS}.{name}='{value}'" for name, value in env.items()]


@checked(
    verl_version=version_text("verl"),
    strategy=one_of(*STRATEGIES),
    vllm_version=version_text("vLLM"),
    gpu_capability=gpu_capability,
    rollout=one_of("vllm", "sglang"),
)
def overrides(
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    verl_version: str | Version | None = None,
    strategy: str = "fsdp",
    vllm_version: Any = _AUTO,
    gpu_capability: Any = _AUTO,
    rollout: str = "vllm",
) -> list[str]:
    """The Hydra overrides that make a verl PPO/GRPO run follow ``policy``.

    ``policy`` is resolved by :func:`precision_plugin._core.manager.resolve_policy` (argument,
    active
    ``enable()`` policy, ``PRECISION_PLUGIN``, defaults). ``verl_version`` defaults to the
    installed verl (else the current layout, >= 0.8); ``strategy`` is the learner: ``fsdp``
    (also for fsdp2), ``fsdp_turbo`` (bfloat16 only: verl 0.9.1's FSDP-Turbo engine ignores a
    float16 setting, so a float16 policy is refused) or ``megatron``.
    ``vllm_version``/``gpu_capability`` default to the installed vLLM and the visible GPU (for
    the cascade-attention guard). Append the result to
    ``python -m verl.trainer.main_ppo ...``: the rollout dtype, every learner's dtype,
    ``calculate_log_probs`` (so verl logs its mismatch metrics), the cascade guard where the
    vLLM needs it, and ``PRECISION_PLUGIN`` in the Ray workers' environment (so every vLLM
    engine's general plugin and verl's plugin hook enforce the same policy).

    ``rollout`` is the engine of ``actor_rollout_ref.rollout.name``: ``vllm`` (the cascade
    guard), or ``sglang`` (``engine_kwargs.sglang.dtype`` too, which verl spreads over
    ``rollout.dtype``; ``PRECISION_PLUGIN`` then reaches SGLang's ``sglang.srt.plugins`` entry
    point, which verifies the dtype in SGLang's processes).
    """
    pol = resolve_policy(policy)
    lay = layout(verl_version, strategy)
    if rollout == "sglang":
        from precision_plugin.verl.sglang import sglang_overrides

        engine = sglang_overrides(pol)
    else:  # "vllm" (the boundary refused anything else)
        engine = cascade_overrides(pol, vllm_version=vllm_version, capability=gpu_capability)
        engine += ray_invariance_overrides(pol, vllm_version=vllm_version)
    return [
        f"{ROLLOUT}.dtype={vllm_dtype(pol)}",
        *learner_overrides(pol, lay),
        f"{ROLLOUT}.calculate_log_probs=True",
        *engine,
        f"++{RAY_ENV_VARS}.{ENV_VAR}={env_value(pol)}",
    ]
