"""What an OpenRLHF run needs to follow the policy: learner arguments and the Ray runtime env.

Pure: OpenRLHF is never imported (only its installed parser's flags are read, to
feature-detect them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from precision_plugin._base.boundary import checked, version_text
from precision_plugin._core import frameworks
from precision_plugin._core.manager import resolve_policy
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.openrlhf.installed import installed
from precision_plugin.openrlhf.layout import (
    PARAM_DTYPE,
    RAY_ENV_VARS,
    SUPPORTED_SINCE,
    flag,
    layout,
)
from precision_plugin.policy import ENV_VAR, PrecisionPolicy


def env_value(policy: PrecisionPolicy) -> str:
    """The ``PRECISION_PLUGIN`` value that carries ``policy`` into OpenRLHF's Ray actors: the
    dtype name when the rest of the policy is the defaults, else its compact JSON."""
    return policy.dtype if policy == PrecisionPolicy(dtype=policy.dtype) else policy.to_json()


def _learner_param_dtype(policy: PrecisionPolicy) -> str:
    """OpenRLHF's ``--ds.param_dtype`` for ``policy`` (``fp16``/``bf16``); a float32 policy,
    which OpenRLHF's learner cannot run, is refused (by ``args()``, ``runtime_env()`` and
    ``precision-plugin openrlhf-args`` alike)."""
    spelled = frameworks.openrlhf_param_dtype(policy)
    if spelled is None:
        raise PrecisionConfigError(
            f"OpenRLHF was asked to train in {policy.dtype}, but its learner runs bf16 or fp16 "
            f"only ({flag(PARAM_DTYPE)} choices). Use dtype='float16' or 'bfloat16'."
        )
    return spelled


@checked(openrlhf_version=version_text("OpenRLHF", "0.11.2"))
def args(
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    openrlhf_version: str | Version | None = None,
) -> list[str]:
    """The ``train_ppo_ray`` arguments that make OpenRLHF's learner run ``policy``.

    ``policy`` is resolved by [`resolve_policy`][precision_plugin._core.manager.resolve_policy]
    (argument, active ``enable()`` policy, ``PRECISION_PLUGIN``, defaults);
    ``openrlhf_version`` defaults to the installed OpenRLHF (else 0.11.2). Today that is
    ``--ds.param_dtype fp16`` (or ``bf16``) on every supported version (>= 0.10.2): OpenRLHF has
    no flag for its vLLM engines' dtype, which ``PRECISION_PLUGIN`` in the actors' environment
    sets instead (see [`runtime_env`][precision_plugin.openrlhf.runtime_env]). A float32 policy
    is refused (OpenRLHF's learner runs bf16 or fp16 only), and so is a flag the installed
    OpenRLHF's parser does not declare.
    """
    return learner_flags(
        resolve_policy(policy, what="precision_plugin.openrlhf.args()"), openrlhf_version
    )


def learner_flags(pol: PrecisionPolicy, openrlhf_version: str | Version | None) -> list[str]:
    """[`args`][precision_plugin.openrlhf.args] for a resolved policy (the check's fixes)."""
    lay = layout(openrlhf_version)
    spelled = _learner_param_dtype(pol)
    found = installed()
    same = found is not None and found.version == lay.version
    if same and found.flags and flag(PARAM_DTYPE) not in found.flags:  # type: ignore[union-attr]
        raise PrecisionConfigError(
            f"the installed OpenRLHF {lay.version} declares no {flag(PARAM_DTYPE)} in its "
            f"train_ppo_ray parser, so its learner dtype cannot be set from the command line "
            f"(released OpenRLHF {SUPPORTED_SINCE} - 0.11.2 declare it). Pass its learner-dtype "
            f"flag yourself."
        )
    return [flag(PARAM_DTYPE), spelled]


@checked
def runtime_env(
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
) -> dict[str, Any]:
    """The Ray ``runtime_env`` that carries ``policy`` into every OpenRLHF actor.

    ``{"env_vars": {...}}`` with ``PRECISION_PLUGIN`` and the three variables OpenRLHF's own
    ``ray.init`` passes (``TOKENIZERS_PARALLELISM``, ``NCCL_DEBUG``,
    ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS``, read from this environment with OpenRLHF's
    defaults), so that ``ray.init(runtime_env=runtime_env())`` before ``train()`` (OpenRLHF then
    skips its own) or ``ray job submit --runtime-env-json`` loses none of them. In each vLLM
    engine, the plugin's ``vllm.general_plugins`` entry point then replaces OpenRLHF's
    hard-coded ``dtype="bfloat16"`` with the policy dtype. With ``batch_invariant='on'`` it also
    carries ``VLLM_BATCH_INVARIANT=1``, which each vLLM engine actor reads at engine start
    (not for an installed vLLM older than 0.11.1, which has no such mode). A float32 policy
    is refused, as by ``args()``: OpenRLHF's learner runs bf16 or fp16 only.
    """
    pol = resolve_policy(policy, what="precision_plugin.openrlhf.runtime_env()")
    _learner_param_dtype(pol)  # the engines would sample against a learner that cannot run it
    return _carried_env(pol)


def _carried_env(pol: PrecisionPolicy) -> dict[str, Any]:
    """``runtime_env()`` of a resolved policy, float32 included (a finding's fix quotes it next
    to the finding that refuses float32)."""
    from precision_plugin._base.versions import installed_version
    from precision_plugin._core.batch_invariance import batch_invariant_env

    env_vars = {name: os.environ.get(name, default) for name, default in RAY_ENV_VARS.items()}
    env_vars[ENV_VAR] = env_value(pol)
    vllm = installed_version("vllm")
    env_vars.update(batch_invariant_env(pol, None if vllm is None else str(vllm)))
    return {"env_vars": env_vars}
