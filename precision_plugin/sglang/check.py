"""Check an SGLang launch against the policy: the dtype it runs and the traps around it.

SGLang never refuses float16 for a model family, has paths that compute in bfloat16 whatever
``--dtype`` says, and can hide float16 overflow; each is one finding here, with the fix.
Pure (SGLang is never imported): the rules are SGLang 0.5.23's, cited per finding.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._base.report import Finding
from precision_plugin._core.frameworks import sglang_runs
from precision_plugin._core.manager import resolve_policy
from precision_plugin._core.model_risks import VLLM_FP16_REFUSED, model_findings
from precision_plugin._core.serving import settle_findings
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import ENV_VAR, PrecisionPolicy
from precision_plugin.sglang.args import LAUNCH_ARGS, read_server_args
from precision_plugin.sglang.checkpoint import (
    architecture,
    auto_dtype,
    bf16_architectures,
    is_dsa,
    local_config,
)

FRAMEWORK = "sglang"
#: The environment variable that makes SGLang replace NaN/inf logits (``utils/async_probe.py``).
SANITIZE_ENV = "SGLANG_SANITIZE_NAN_LOGITS"
#: The one that asserts on them instead (the diagnostic to use under float16).
NAN_CHECK_ENV = "SGLANG_ENABLE_NAN_LOGITS_CHECK"
#: SGLang's ``EnvBool`` true spellings (``srt/environ.py``).
_TRUE = {"true", "1", "yes", "y"}
#: Attention backends with a bf16/fp8-only KV cache: hpc_ops (``hpc_ops_backend.py``) refuses
#: anything else at start; the TRT-LLM and CuteDSL MLA backends accept fp8_e4m3, bf16 or auto
#: (``arg_groups/overrides.py``).
_HPC_OPS = "hpc_ops"
_MLA_BF16_KV = ("trtllm_mla", "cutedsl_mla", "tokenspeed_mla")
_ATTENTION_FIELDS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
_BF16_KV = ("bf16", "bfloat16")


def _dtype_fix(policy: PrecisionPolicy) -> str:
    return (
        f"launch SGLang with --dtype {policy.dtype} (keyword dtype='{policy.dtype}'), or with "
        f"{ENV_VAR}={policy.dtype} in its environment so the plugin's sglang.srt.plugins entry "
        f"point sets it"
    )


def running_dtype(
    values: Mapping[str, Any], config: Mapping[str, Any] | None
) -> tuple[str | None, str]:
    """(the dtype a launch runs, how that was decided); ``None`` when ``auto`` cannot be decided
    here (no checkpoint config). An architecture SGLang forces to bfloat16 wins."""
    asked = sglang_runs(values.get("dtype"))
    arch = architecture(config) if config is not None else None
    if arch in bf16_architectures():
        return "bfloat16", f"SGLang runs {arch} in bfloat16 whatever --dtype says"
    if asked is not None:
        return asked, f"dtype={values.get('dtype')}"
    if config is None:
        return None, "dtype=auto"
    return auto_dtype(config), "dtype=auto, decided from the checkpoint's config.json"


def dtype_findings(
    values: Mapping[str, Any],
    config: Mapping[str, Any] | None,
    policy: PrecisionPolicy,
    where: str,
) -> list[Finding]:
    """The dtype finding of a launch (or a running server) ``where`` names."""
    try:
        runs, how = running_dtype(values, config)
    except PrecisionConfigError as exc:
        return [Finding(FRAMEWORK, "error", f"{where}: {exc}", fix=_dtype_fix(policy))]
    details = {"dtype": values.get("dtype"), "model_path": values.get("model_path")}
    if runs is None:
        return [
            Finding(
                FRAMEWORK,
                "warning",
                f"{where} runs dtype=auto, which SGLang decides from the checkpoint "
                f"({values.get('model_path')!r}), whose config.json is not on this machine: "
                f"the dtype it runs cannot be told here.",
                fix=_dtype_fix(policy),
                details=details,
            )
        ]
    if runs != policy.dtype:
        return [
            Finding(
                FRAMEWORK,
                "error",
                f"{where} runs {runs} ({how}), but the policy is {policy.dtype}: rollouts and "
                f"training would use different precisions.",
                fix=_dtype_fix(policy)
                if "whatever" not in how
                else f"use the consistent-bf16 mode ({ENV_VAR}=bfloat16) for this model",
                details={**details, "runs": runs},
            )
        ]
    return [Finding(FRAMEWORK, "ok", f"{where} runs {runs} ({how}).", details=details)]


def _topk(value: Any) -> int | None:
    """``speculative_eagle_topk`` as SGLang takes it (an integer, or unset); anything else is a
    ``PrecisionConfigError`` naming the field."""
    if value is None:
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise PrecisionConfigError(
            f"speculative_eagle_topk is {value!r}, which SGLang refuses (it takes an integer); "
            f"pass an integer such as 1, or leave it unset."
        ) from None


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in _TRUE


def trap_findings(
    values: Mapping[str, Any],
    config: Mapping[str, Any] | None,
    policy: PrecisionPolicy,
    environ: Mapping[str, str],
    where: str,
) -> list[Finding]:
    """What around the dtype contradicts ``policy``: paths that compute or store in bfloat16
    whatever ``--dtype`` says, and a NaN sanitizer that hides float16 overflow."""
    out: list[Finding] = []
    target = values.get("rl_on_policy_target")
    if target is not None and policy.dtype != "bfloat16":
        out.append(
            Finding(
                FRAMEWORK,
                "error",
                f"{where} has --rl-on-policy-target {target}: SGLang then computes the LM-head "
                f"logits and the log-probs in bfloat16 (logits_processor.py, sampler.py) whatever "
                f"--dtype says, a bf16 rounding the {policy.dtype} learner does not have.",
                fix="drop --rl-on-policy-target (its batch-invariant kernels: "
                "--enable-deterministic-inference), or use the consistent-bf16 mode",
            )
        )
    if policy.is_fp16 and _truthy(environ.get(SANITIZE_ENV, "")):
        out.append(
            Finding(
                FRAMEWORK,
                "error",
                f"{SANITIZE_ENV}={environ[SANITIZE_ENV]} makes SGLang replace NaN/inf logits "
                f"with ±1e30: float16 overflow in the rollout is then hidden and silently "
                f"changes what is sampled.",
                fix=f"unset {SANITIZE_ENV}; {NAN_CHECK_ENV}=1 makes SGLang stop on NaN logits "
                f"instead",
            )
        )
    kv = str(values.get("kv_cache_dtype") or "auto").lower()
    if kv in _BF16_KV and policy.dtype != "bfloat16":
        out.append(
            Finding(
                FRAMEWORK,
                "error",
                f"{where} stores its KV cache in bfloat16 (--kv-cache-dtype {kv}) while the "
                f"model runs {policy.dtype}: attention reads bf16-rounded keys and values.",
                fix="--kv-cache-dtype auto (the model dtype; SGLang has no float16 choice)",
            )
        )
    elif kv != "auto" and kv not in _BF16_KV:
        out.append(
            Finding(
                FRAMEWORK,
                "warning",
                f"{where} stores its KV cache as {kv}: rollout-only rounding the learner does "
                f"not have.",
                fix="--kv-cache-dtype auto",
            )
        )
    backends = {f: values.get(f) for f in _ATTENTION_FIELDS if values.get(f)}
    moe = values.get("moe_runner_backend")
    if policy.is_fp16 and (_HPC_OPS in backends.values() or moe == _HPC_OPS):
        which = [f"--{k.replace('_', '-')} {v}" for k, v in backends.items() if v == _HPC_OPS]
        which += ["--moe-runner-backend hpc_ops"] if moe == _HPC_OPS else []
        out.append(
            Finding(
                FRAMEWORK,
                "error",
                f"{where} uses {', '.join(which)}: the HPC-Ops kernels run bfloat16 (or fp8) "
                f"only (the attention backend refuses a float16 KV cache at start).",
                fix="pick another backend (flashinfer, fa3, triton) for float16",
            )
        )
    mla = sorted({v for v in backends.values() if v in _MLA_BF16_KV})
    if policy.is_fp16 and mla:
        out.append(
            Finding(
                FRAMEWORK,
                "warning",
                f"{where} uses the {', '.join(mla)} attention backend, whose MLA KV cache is "
                f"fp8_e4m3 or bf16 only: a float16 model's cache is not among its tested paths.",
                fix="pick another MLA backend (flashinfer, fa3, triton) for float16",
            )
        )
    if policy.is_fp16 and config is not None and is_dsa(config):
        out.append(
            Finding(
                FRAMEWORK,
                "warning",
                f"{architecture(config)} with index_topk uses DeepSeek sparse attention (DSA), "
                f"whose KV cache SGLang keeps in bfloat16 or fp8_e4m3 only: a float16 rollout "
                f"attends over bf16/fp8-rounded keys and values.",
                fix=f"use the consistent-bf16 mode ({ENV_VAR}=bfloat16) for this model",
            )
        )
    topk = _topk(values.get("speculative_eagle_topk"))
    if policy.is_fp16 and values.get("speculative_algorithm") and topk and topk > 1:
        out.append(
            Finding(
                FRAMEWORK,
                "warning",
                f"{where} drafts speculatively with --speculative-eagle-topk {topk}: its tree "
                f"verification takes FA3's cascade path, and float16 EAGLE drafts have "
                f"overflowed to NaN (sgl-project/sglang#27883).",
                fix="--speculative-eagle-topk 1, or no speculative decoding for RL rollouts",
            )
        )
    return out


def checkpoint_findings(config: Mapping[str, Any], policy: PrecisionPolicy) -> list[Finding]:
    """The checkpoint's float16 risks: SGLang refuses none, so the model types vLLM refuses and
    the families known to overflow float16 are warnings (the vLLM adapter's checkpoint check)."""
    if not policy.is_fp16:
        return []
    found = model_findings(config, policy, refused=VLLM_FP16_REFUSED, engine="SGLang")
    return [f for f in found if f.status != "info"]


@checked(args=LAUNCH_ARGS)
def check_server_args(
    args: Any,
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Check an SGLang launch against ``policy`` before it starts.

    ``args`` is SGLang's ``ServerArgs``, the keyword arguments of ``sglang.Engine`` (a dict) or
    a ``sglang serve`` command line (a list of strings, ``--config FILE`` read as SGLang reads
    it). Findings: the dtype it runs (``auto`` decided from the checkpoint's ``config.json``
    when it is on this machine, as SGLang decides it), ``--rl-on-policy-target`` (bf16 logits),
    ``SGLANG_SANITIZE_NAN_LOGITS`` in ``environ`` (default: this process's environment; hides
    float16 overflow), bf16-only paths (bf16 KV cache, the hpc_ops backends, the TRT-LLM/CuteDSL
    MLA KV cache, DeepSeek DSA), EAGLE tree drafting, and the checkpoint's float16 risks (SGLang
    refuses no model family in float16). ``error`` findings raise
    [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError] together under
    ``strictness="error"``; otherwise they are logged as warnings. Returns the findings.
    """
    pol = resolve_policy(policy)
    findings = launch_findings(
        read_server_args(args), pol, os.environ if environ is None else environ
    )
    return settle_findings(findings, pol)


def launch_findings(
    values: Mapping[str, Any],
    policy: PrecisionPolicy,
    environ: Mapping[str, str],
    where: str = "the SGLang launch",
) -> list[Finding]:
    """Every finding of :func:`check_server_args` for the fields ``values`` (unsettled)."""
    config = local_config(values.get("model_path"), values.get("revision"))
    return [
        *dtype_findings(values, config, policy, where),
        *trap_findings(values, config, policy, environ, where),
        *(checkpoint_findings(config, policy) if config is not None else []),
    ]
