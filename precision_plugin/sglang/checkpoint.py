"""What SGLang makes of a checkpoint's ``config.json``: the dtype ``auto`` runs, architectures it
runs in bfloat16 whatever ``--dtype`` says, and DeepSeek DSA models (bf16/fp8-only KV cache).

Pure: the rules are SGLang 0.5.23's, read from its source (cited per rule); where SGLang is
already imported in the process its own tables are used instead. The contract tests
(``tests/contract_sglang/``) check every rule against the installed SGLang.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._base.dtypes import spellings
from precision_plugin._core.model_risks import config_json_for, load_model_config
from precision_plugin.errors import PrecisionConfigError

#: ``sglang/srt/arg_groups/model_override_base.py`` ``MODEL_OVERRIDES``: "These models require
#: bfloat16 regardless of the requested dtype".
BF16_ARCHITECTURES: frozenset[str] = frozenset(
    {"MistralLarge3ForCausalLM", "PixtralForConditionalGeneration"}
)
#: ``sglang/srt/configs/model_config.py`` ``is_deepseek_dsa``: these architectures with an
#: ``index_topk`` use DeepSeek's sparse attention, whose KV cache is bf16 or fp8_e4m3 only
#: (``arg_groups/overrides.py``).
DSA_ARCHITECTURES: frozenset[str] = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGenerationNextN",
        "Glm5NextForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
    }
)
#: ``_STR_DTYPE_TO_TORCH_DTYPE`` of ``configs/model_config.py``: the checkpoint dtype strings
#: SGLang understands; anything else reads as unset (float32).
_STORED = spellings(("half", "float16", "float", "float32", "bfloat16"))


def architecture(config: Mapping[str, Any]) -> str | None:
    """The checkpoint's first ``architectures`` entry (what SGLang dispatches on)."""
    archs = config.get("architectures") or []
    return str(archs[0]) if isinstance(archs, list) and archs else None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language-model part of a checkpoint config (``text_config`` of a multimodal one)."""
    sub = config.get("text_config")
    return sub if isinstance(sub, Mapping) else config


@checked
def auto_dtype(config: Mapping[str, Any]) -> str:
    """The dtype SGLang's ``--dtype auto`` runs for a checkpoint config (``_get_and_verify_dtype``).

    The checkpoint's own dtype (``dtype``, else ``torch_dtype``, of the language model's config),
    except that a float32 (or undeclared) checkpoint runs float16, or bfloat16 for the Gemma
    family.
    """
    text = text_config(config)
    declared = text.get("dtype") or text.get("torch_dtype")
    if declared is None and text is not config:
        declared = config.get("dtype") or config.get("torch_dtype")
    key = str(declared).removeprefix("torch.").lower()
    named = declared is None or isinstance(declared, str) or type(declared).__name__ == "dtype"
    if not named:  # config.json holds a dtype's name: this is no config.json
        raise PrecisionConfigError(
            f"auto_dtype(): the checkpoint config declares dtype {declared!r}, which is no dtype "
            f"name (config.json holds one such as 'bfloat16'); pass the checkpoint's config.json "
            f"contents, or launch SGLang with an explicit --dtype."
        )
    if isinstance(declared, str) and not _torch_names_dtype(declared):
        raise PrecisionConfigError(
            f"the checkpoint's config.json declares dtype {declared!r}, which is no torch dtype "
            f"name: transformers reads it with getattr(torch, {declared!r}) and fails, so SGLang "
            f"cannot load this config (names are case-sensitive: 'bfloat16', 'float16', "
            f"'float32'); write the torch name in config.json, or launch with an explicit --dtype."
        )
    stored = _STORED.get(key, "float32")
    if stored != "float32":
        return stored
    model_type = str(text.get("model_type") or "")
    return "bfloat16" if model_type.startswith("gemma") else "float16"


def _torch_names_dtype(name: str) -> bool:
    """True when ``getattr(torch, name)`` is a dtype, as transformers reads a config's dtype."""
    import torch

    return isinstance(getattr(torch, name.removeprefix("torch."), None), torch.dtype)


def bf16_architectures() -> frozenset[str]:
    """SGLang's bf16-only architectures: the installed SGLang's table when it is already
    imported, else :data:`BF16_ARCHITECTURES`."""
    module = sys.modules.get("sglang.srt.arg_groups.model_override_base")
    table = getattr(module, "MODEL_OVERRIDES", None)
    if isinstance(table, Mapping):
        return frozenset(
            arch
            for arch, values in table.items()
            if isinstance(values, Mapping) and values.get("dtype") == "bfloat16"
        )
    return BF16_ARCHITECTURES


def is_dsa(config: Mapping[str, Any]) -> bool:
    """True for a DeepSeek sparse-attention (DSA) checkpoint, as SGLang decides it."""
    return architecture(config) in DSA_ARCHITECTURES and config.get("index_topk") is not None


def local_config(model_path: Any, revision: Any = None) -> dict[str, Any] | None:
    """The ``config.json`` of a local checkpoint folder or an already cached hub model; ``None``
    when it is not on this machine (nothing is downloaded)."""
    path = config_json_for(model_path, revision)
    if path is None:
        return None
    return load_model_config(path)
