"""Buffers the real engines keep in float32 while the weights run in float16 or bfloat16.

vLLM builds a model's weights in the serving dtype but computes some tensors in float32 and
keeps them so. A wholesale ``model.to(torch.float16)`` (or DeepSpeed's module cast, or the
float16 tensors ZeRO-3's ``zero.Init`` creates) rounds them too, which adds a mismatch vLLM does
not have. The table ``FLOAT32_BUFFERS`` lists them with the vLLM source that keeps them in
float32 (vLLM 0.33.0, paths under ``vllm/model_executor/``):

- RoPE inverse frequencies: every buffer whose name ends in ``inv_freq`` (transformers'
  ``inv_freq``, ``original_inv_freq`` and Gemma-3's ``{layer_type}_inv_freq``).
  ``layers/rotary_embedding/base.py`` computes them in float32 (``_compute_inv_freq``, lines
  80-92), builds cos/sin from them in float32 (``_compute_cos_sin_cache``, lines 94-103) and casts
  only that cos/sin cache to the model dtype (lines 58-63). The scaled variants do the same:
  llama3 (``llama3_rope.py`` ``_compute_inv_freq``, lines 33-53), yarn (``yarn_scaling_rope.py``
  lines 76-84: cos/sin times ``mscale`` in float32, then the cast), longrope
  (``phi3_long_rope_scaled_rope.py`` lines 82-90 and 111-122) and dynamic NTK
  (``dynamic_ntk_scaling_rope.py`` lines 53-72). transformers computes cos/sin in float32 from
  the buffer, multiplies by ``attention_scaling`` and casts to the activations' dtype, the same
  order, so a float32 buffer is all it takes.
- MoE routing bias ``e_score_correction_bias`` (DeepSeek-V3, GLM-4.5 and others): a float32
  parameter in ``models/deepseek_v2.py`` (lines 327-330) and ``models/glm4_moe.py``
  (lines 148-150).

[`cast_model`][precision_plugin._core.buffers.cast_model] is the one cast of a rollout copy;
[`keep_float32_buffers`][precision_plugin._core.buffers.keep_float32_buffers] restores the table's
buffers after someone else's cast (DeepSpeed's), from float32 values saved before it
([`float32_buffers`][precision_plugin._core.buffers.float32_buffers]) or, for RoPE frequencies that
never existed in float32 (``zero.Init``), recomputed by the module's own RoPE function.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from precision_plugin._base.boundary import checked, dtype_name, torch_device, torch_module
from precision_plugin.errors import PrecisionConfigError

log = logging.getLogger("precision_plugin")


@checked
@dataclass(frozen=True)
class Float32Buffer:
    """A buffer name suffix vLLM keeps in float32, and where its source says so."""

    suffix: str
    what: str
    vllm_source: str


#: The buffers vLLM keeps in float32 (see the module docstring).
FLOAT32_BUFFERS: tuple[Float32Buffer, ...] = (
    Float32Buffer(
        "inv_freq",
        "RoPE inverse frequencies (inv_freq, original_inv_freq, <layer_type>_inv_freq)",
        "vllm/model_executor/layers/rotary_embedding/base.py lines 58-63, 80-103",
    ),
    Float32Buffer(
        "e_score_correction_bias",
        "MoE routing bias (DeepSeek-V3, GLM-4.5, ...)",
        "vllm/model_executor/models/deepseek_v2.py lines 327-330",
    ),
)

_LOW = ("float16", "bfloat16")


@checked
def keeps_float32(name: str) -> bool:
    """True when the buffer called ``name`` (a dotted path or a bare name) stays float32."""
    leaf = name.rsplit(".", 1)[-1]
    return any(leaf.endswith(b.suffix) for b in FLOAT32_BUFFERS)


def _named_float32_buffers(model: Any) -> list[tuple[str, Any, str]]:
    """``(dotted name, owning module, buffer name)`` of every table buffer of ``model``."""
    found = []
    for prefix, module in model.named_modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.is_floating_point() and keeps_float32(name):
                found.append((f"{prefix}.{name}" if prefix else name, module, name))
    return found


@checked(model=torch_module)
def float32_buffers(model: Any) -> dict[str, Any]:
    """Float32 copies of the table's buffers that are float32 now (save them before a cast)."""
    import torch

    return {
        dotted: module._buffers[name].detach().clone()
        for dotted, module, name in _named_float32_buffers(model)
        if module._buffers[name].dtype == torch.float32
    }


@checked(model=torch_module)
def keep_float32_buffers(model: Any, saved: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Put every table buffer of ``model`` back in float32 after a cast; ``{name: how}``.

    ``how`` is ``"saved"`` (the float32 value from ``saved``, taken before the cast: exact),
    ``"recomputed"`` (a RoPE frequency buffer recomputed in float32 by the module's own RoPE
    function: exact, for frequencies that were never float32 here) or ``"upcast"`` (its rounded
    values widened: the best left). Buffers already float32 are left alone and not listed. A
    saved value that is no finite floating-point tensor of the buffer's shape is refused, naming
    its entry, before any buffer changes.
    """
    import torch

    saved = saved or {}
    named = [
        (dotted, module, name)
        for dotted, module, name in _named_float32_buffers(model)
        if module._buffers[name].dtype != torch.float32
    ]
    # Every saved value is checked before any buffer changes: a refusal leaves the model as it was.
    kept = {
        dotted: _saved_value(saved, dotted, module._buffers[name]) for dotted, module, name in named
    }
    done: dict[str, str] = {}
    for dotted, module, name in named:
        buf = module._buffers[name]
        value, how = kept[dotted], "saved"
        if value is None and name.endswith("inv_freq"):
            value, how = _recompute_rope(module, name), "recomputed"
        if value is None:
            value, how = buf.detach().float(), "upcast"
        module._buffers[name] = value.to(device=buf.device, dtype=torch.float32)
        done[dotted] = how
    if any(how != "saved" for how in done.values()):
        log.debug("precision_plugin: float32 buffers restored: %s", done)
    return done


def _saved_value(saved: Mapping[str, Any], dotted: str, buf: Any) -> Any:
    """``saved[dotted]`` when it can stand for buffer ``buf`` (a tensor of its shape, every
    value finite), else refused naming the entry: restored as "saved" it would put a NaN, or
    another buffer's values, into every position computed from it."""
    import torch

    value = saved.get(dotted)
    if value is None:
        return None
    where = f"keep_float32_buffers(): saved[{dotted!r}]"
    fix = (
        "save the buffers with precision_plugin._core.buffers.float32_buffers(model) before "
        "the cast"
    )
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise PrecisionConfigError(
            f"{where} is {type(value).__name__}, not a floating-point tensor; {fix}."
        )
    if tuple(value.shape) != tuple(buf.shape):
        raise PrecisionConfigError(
            f"{where} has shape {tuple(value.shape)}, the buffer {tuple(buf.shape)}; {fix}."
        )
    if not bool(torch.isfinite(value).all()):
        raise PrecisionConfigError(f"{where} holds NaN or infinite values; {fix}.")
    return value


@checked(model=torch_module, dtype=dtype_name, device=torch_device)
def cast_model(model: Any, dtype: Any, device: Any = None, *, float32: bool = True) -> Any:
    """``model.to(device, dtype)`` keeping the table's buffers in float32, as vLLM does.

    ``dtype`` is a ``torch.dtype`` or a dtype name. With ``float32=False`` it is a plain
    ``.to()`` (every buffer rounded): what a copy without this treatment computes.
    """
    from precision_plugin.policy import torch_dtype

    wanted = dtype if not isinstance(dtype, str) else torch_dtype(dtype)
    saved = float32_buffers(model) if float32 else {}
    model = model.to(device=device, dtype=wanted)
    if float32 and str(wanted).removeprefix("torch.") in _LOW:
        keep_float32_buffers(model, saved)
    return model


@checked(model=torch_module)
def buffer_dtypes(model: Any) -> dict[str, str]:
    """``{dtype name: element count}`` of the table's buffers of ``model`` (the audit's view)."""
    counts: dict[str, int] = {}
    for _, module, name in _named_float32_buffers(model):
        buf = module._buffers[name]
        key = str(buf.dtype).removeprefix("torch.")
        counts[key] = counts.get(key, 0) + buf.numel()
    return dict(sorted(counts.items()))


def _recompute_rope(module: Any, name: str) -> Any:
    """The initial value of RoPE buffer ``name`` of a transformers rotary module, in float32.

    transformers >= 4.46 keeps the RoPE function as ``module.rope_init_fn`` or (5.x) as
    ``compute_default_rope_parameters`` / ``ROPE_INIT_FUNCTIONS[rope_type]``; Gemma-3 keeps one
    set per layer type (``{layer_type}_inv_freq``). ``None`` when the module is not one of those.
    A dynamic RoPE is reset to its original length, where its next forward recomputes it.
    """
    config = getattr(module, "config", None)
    rope_type = getattr(module, "rope_type", None)
    if config is None or rope_type is None:
        return None
    base = name.removesuffix("inv_freq").removesuffix("original_")
    layer_type = base.removesuffix("_") or None
    try:
        kind = rope_type[layer_type] if isinstance(rope_type, Mapping) else rope_type
        fn = getattr(module, "rope_init_fn", None)
        if fn is None or layer_type is not None:
            if kind == "default":
                fn = module.compute_default_rope_parameters
            else:
                from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

                fn = ROPE_INIT_FUNCTIONS[kind]
        extra = {"layer_type": layer_type} if layer_type is not None else {}
        inv_freq = fn(config, **extra)[0]
    except Exception as exc:  # a custom rotary module: its values are only widened
        log.debug("precision_plugin: cannot recompute %s (%s)", name, exc)
        return None
    if "dynamic" in str(kind):
        prefix = f"{layer_type}_" if layer_type else ""
        original = getattr(module, "original_max_seq_len", None)
        if original is not None and hasattr(module, f"{prefix}max_seq_len_cached"):
            setattr(module, f"{prefix}max_seq_len_cached", original)
    return inv_freq.detach()
