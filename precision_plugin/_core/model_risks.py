"""Checkpoint checks before a rollout launch: model types vLLM refuses in float16, and families that
overflow float16. Pure: reads a ``config.json`` (or a dict), never imports vLLM unless asked to
read vLLM's own refusal table.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from precision_plugin._base import userfiles
from precision_plugin._base.boundary import checked
from precision_plugin._base.dtypes import canonical_dtype_name
from precision_plugin._base.report import Finding
from precision_plugin._core.manager import resolve_policy
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import ENV_VAR, PrecisionPolicy

log = logging.getLogger("precision_plugin")

#: vLLM's ``_FLOAT16_NOT_SUPPORTED_MODELS`` of current releases (0.31 - 0.33; 0.16 - 0.18 also
#: listed plamo2). ``ModelConfig`` raises for these with ``dtype=float16``.
VLLM_FP16_REFUSED: dict[str, str] = {
    "gemma2": "Numerical instability. Please use bfloat16 or float32 instead.",
    "gemma3": "Numerical instability. Please use bfloat16 or float32 instead.",
    "gemma3_text": "Numerical instability. Please use bfloat16 or float32 instead.",
    "glm4": "Numerical instability. Please use bfloat16 or float32 instead.",
}

#: Families whose activations or gradients exceed float16's range (~6.5e4), with the evidence.
#: Source: Unsloth's ``FORCE_FLOAT32`` list (unslothai/unsloth-zoo ``model_lists.py``).
FP16_OVERFLOW_RISK: dict[str, str] = {
    "gemma3n": "Unsloth forces float32 for gemma3n: activations exceed float16's range.",
    "gemma4": (
        "Unsloth forces float32 for gemma4: float16 GRPO hit +inf in mlp.down_proj at step 2 "
        "(unsloth#5092, unsloth-zoo#600) and NaN grad_norm at step 1 (unsloth-zoo#866)."
    ),
    "gpt_oss": "Unsloth forces float32 for gpt_oss: activations exceed float16's range.",
    "qwen3_5": "Unsloth forces float32 for qwen3_5: activations exceed float16's range.",
    "qwen3_moe": (
        "Unsloth forces float32 for qwen3_moe: Qwen3-30B-A3B had NaN grad_norm at step 1 under "
        "float16, the backward pass overflows (unsloth-zoo#866)."
    ),
    "glm4_moe": "Unsloth forces float32 for glm4_moe: activations exceed float16's range.",
}

_BF16_HINT = (
    f"use the consistent-bf16 mode instead: precision_plugin.enable(dtype='bfloat16') or "
    f"{ENV_VAR}=bfloat16 for vLLM servers"
)


@checked
def vllm_refusal_table() -> dict[str, str]:
    """The installed vLLM's own fp16 refusal table when vLLM is already imported, else ours.

    vLLM >= 0.11 keeps it in ``vllm/config/model.py``; 0.10.x in ``vllm/config/__init__.py``.
    """
    for name in ("vllm.config.model", "vllm.config"):
        table = getattr(sys.modules.get(name), "_FLOAT16_NOT_SUPPORTED_MODELS", None)
        if isinstance(table, Mapping):
            return {str(k): str(v) for k, v in table.items()}
    return dict(VLLM_FP16_REFUSED)


def load_model_config(path_or_dict: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Read a checkpoint's ``config.json`` (a directory, the file itself, or a dict)."""
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict)
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise PrecisionConfigError(
            f"check_model_config: expected a checkpoint folder, its config.json or the parsed "
            f"dict, got {type(path_or_dict).__name__}."
        )
    path = Path(userfiles.check_path(path_or_dict, "check_model_config"))
    if path.is_dir():
        path = path / "config.json"
    if not os.path.lexists(path):
        raise PrecisionConfigError(
            f"check_model_config: no config.json at {path}. Pass a local checkpoint directory "
            f"(or its config.json, or the parsed dict)."
        )
    data = userfiles.read_json(path, "check_model_config:")
    if not isinstance(data, dict):
        raise PrecisionConfigError(
            f"check_model_config: {path} holds a JSON {type(data).__name__}, not the object "
            f"a config.json is."
        )
    return data


def _model_types(config: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    """Top-level ``model_type`` and the ``model_type`` of nested text/LLM sub-configs."""
    top = config.get("model_type")
    nested = []
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, Mapping) and sub.get("model_type"):
            nested.append(str(sub["model_type"]))
    return (str(top) if top else None), nested


@checked
def checkpoint_dtype(config: Mapping[str, Any]) -> str | None:
    """The dtype a checkpoint's config declares (``dtype`` or legacy ``torch_dtype``)."""
    for source in (config, config.get("text_config") or {}):
        if isinstance(source, Mapping):
            value = source.get("dtype") or source.get("torch_dtype")
            if value:
                return str(value).removeprefix("torch.")
    return None


@checked
def check_model_config(
    path_or_dict: str | os.PathLike[str] | Mapping[str, Any],
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    raise_on_refusal: bool = True,
    refused: Mapping[str, str] | None = None,
    engine: str = "vLLM",
) -> list[Finding]:
    """Check a checkpoint against ``policy`` before a rollout engine (vLLM by default) loads it.

    Raises [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError] when the policy is
    float16 and vLLM refuses float16 for the checkpoint's ``model_type`` (gemma2, gemma3,
    gemma3_text, glm4 in current releases), unless ``raise_on_refusal`` is false (then the refusal
    is an ``error`` finding). Returns findings: a ``warning`` for families known to overflow
    float16, ``info`` for a cast.

    ``engine`` names another engine that loads the checkpoint (``"SGLang"``): such an engine
    refuses nothing, so a model type vLLM refuses is a ``warning`` (float16 runs unguarded
    there) and nothing raises; the findings carry ``engine.lower()`` as their framework.
    """
    return model_findings(
        path_or_dict,
        resolve_policy(policy),
        raise_on_refusal=raise_on_refusal,
        refused=refused,
        engine=engine,
    )


def model_findings(
    path_or_dict: str | os.PathLike[str] | Mapping[str, Any],
    policy: PrecisionPolicy,
    *,
    raise_on_refusal: bool = True,
    refused: Mapping[str, str] | None = None,
    engine: str = "vLLM",
) -> list[Finding]:
    """[`check_model_config`][precision_plugin.vllm.check_model_config] for a resolved
    ``policy``."""
    config = load_model_config(path_or_dict)
    top, nested = _model_types(config)
    table = dict(refused) if refused is not None else vllm_refusal_table()
    findings: list[Finding] = []
    details = {"model_type": top, "nested_model_types": nested}
    framework = engine.lower()

    if policy.is_fp16 and top in table and engine != "vLLM":
        findings.append(
            Finding(
                framework,
                "warning",
                f"vLLM refuses float16 for model type {top!r} ({table[top]}); {engine} does not "
                f"refuse it, so this checkpoint would run in float16 unguarded.",
                fix=f"Measure its float16 headroom (precision-plugin probe --model PATH), or "
                f"{_BF16_HINT}",
                details=details,
            )
        )
    elif policy.is_fp16 and top in table:
        message = (
            f"vLLM refuses float16 for model type {top!r} ({table[top]}); the precision policy "
            f"asks for float16."
        )
        if raise_on_refusal:
            raise PrecisionConfigError(f"{message} Fix: {_BF16_HINT}.")
        findings.append(Finding("vllm", "error", message, fix=_BF16_HINT, details=details))
    if policy.is_fp16:
        for sub in nested:
            if sub in table:
                findings.append(
                    Finding(
                        framework,
                        "warning",
                        f"The language model inside this {top!r} checkpoint is {sub!r}, which "
                        f"vLLM refuses in float16 on its own ({table[sub]}).",
                        fix=_BF16_HINT,
                        details=details,
                    )
                )
        for kind in dict.fromkeys([t for t in (top, *nested) if t in FP16_OVERFLOW_RISK]):
            findings.append(
                Finding(
                    framework,
                    "warning",
                    f"Model type {kind!r} is known to overflow float16: {FP16_OVERFLOW_RISK[kind]}",
                    fix=f"Watch precision/loss_scale and skipped steps, or {_BF16_HINT}.",
                    details={**details, "evidence": FP16_OVERFLOW_RISK[kind]},
                )
            )
    stored = checkpoint_dtype(config)
    if stored and stored != policy.dtype:
        findings.append(
            Finding(
                framework,
                "info",
                f"The checkpoint is stored in {stored}; {engine} will cast it to {policy.dtype}.",
                details={**details, "checkpoint_dtype": stored},
            )
        )
    return findings


@checked
def config_json_for(model: Any, revision: Any = None) -> str | None:
    """Local ``config.json`` of a model path or an already cached hub id; never downloads."""
    if not model:
        return None
    path = os.path.join(str(model), "config.json")
    if os.path.isfile(path):
        return path
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(str(model), "config.json", revision=revision)
    except Exception:
        return None
    return found if isinstance(found, str) else None


@checked
def check_engine_model(
    model: Any, policy: PrecisionPolicy, *, dtype: str | None, revision: Any = None
) -> None:
    """The checkpoint check of every vLLM path (``engine_kwargs``, the engine wrapper).

    When the engine will run ``dtype`` float16 and the model's ``config.json`` is local (a
    folder, or a hub id already cached), a model type vLLM refuses in float16 raises
    [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError] before vLLM is
    started; overflow-prone families are logged as warnings. Nothing happens for another dtype
    or a model whose config is not here.
    """
    if canonical_dtype_name(dtype) != "float16":  # fp16, half, torch.float16: one dtype
        return
    path = config_json_for(model, revision)
    if path is None:
        return
    fp16 = policy.replace(dtype="float16")
    for finding in model_findings(path, fp16, refused=vllm_refusal_table()):
        if finding.status == "warning":
            log.warning("vLLM model %s: %s %s", model, finding.message, finding.fix)
