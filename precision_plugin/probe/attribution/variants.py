"""Rollout-side copies of a model with exactly one component changed, as the engines change it.

Each switch is applied to a copy of the float32 master weights cast to the compute dtype
(``precision_plugin._core.buffers.cast_model``: RoPE frequencies in float32, as vLLM keeps them):

- ``rope_dtype``: every RoPE ``inv_freq`` buffer rounded to that dtype (what a plain
  ``.to(dtype)`` or DeepSpeed's ``zero.Init`` does);
- ``head_dtype``: the LM head's weight and input in that dtype (float32: SGLang's
  ``--enable-fp32-lm-head``, TRL's ``cast_lm_head_to_fp32``; float32 weights come from the
  master copy, not from the rounded ones);
- ``kv_format``: keys (after RoPE) and values rounded to a float8 format before attention, with
  scale 1 and saturation at the format's largest value (vLLM's fp8 KV cache with its default
  ``k_scale = v_scale = 1.0``); an attention function registered with transformers'
  ``AttentionInterface`` does it, wrapping the model's own (and its mask function, registered
  under the same name with ``AttentionMaskInterface``, so padding stays masked);
- ``router_dtype``: each MoE router (``*TopKRouter``) computed with its weight and input in that
  dtype, its routing weights handed on in the compute dtype;

[`stepped_weights`][precision_plugin.probe.attribution.variants.stepped_weights] gives the
weights one optimiser step ahead (the stale-weights cause).

Everything here uses torch's and transformers' extension points (module hooks, the attention
registry); nothing is patched.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Iterator, Sequence
from typing import Any


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


@contextlib.contextmanager
def _no_grad_copy() -> Iterator[None]:
    import torch

    with torch.no_grad():
        yield


def apply_switches(
    model: Any,
    master: Any,
    dtype: str,
    *,
    rope_dtype: str | None = None,
    head_dtype: str | None = None,
    kv_format: str | None = None,
    router_dtype: str | None = None,
) -> Any:
    """Change the given components of ``model`` (a copy of ``master`` cast to ``dtype``) in
    place; float32 weights come from ``master``. Returns ``model``."""
    with _no_grad_copy():
        if rope_dtype is not None:
            round_rope(model, rope_dtype)
        if head_dtype is not None:
            head_in(model, master, head_dtype)
        if kv_format is not None:
            quantized_kv_cache(model, kv_format)
        if router_dtype is not None:
            router_in(model, master, router_dtype, dtype)
    return model


def _rope_buffers(model: Any) -> list[tuple[Any, str]]:
    """``(module, name)`` of every RoPE ``inv_freq`` buffer of ``model`` (floating point)."""
    return [
        (module, name)
        for module in model.modules()
        for name, buf in module._buffers.items()
        if buf is not None and name.endswith("inv_freq") and buf.is_floating_point()
    ]


def has_rope(model: Any) -> bool:
    """Whether ``model`` keeps RoPE frequencies (``inv_freq`` buffers); False for learned or
    ALiBi positions (GPT-2, OPT, BLOOM), which have nothing for the ``rope`` cause to round."""
    return bool(_rope_buffers(model))


def round_rope(model: Any, rounding: str) -> int:
    """Round every RoPE ``inv_freq`` buffer of ``model`` to ``rounding`` (kept in its dtype);
    returns how many buffers."""
    found = _rope_buffers(model)
    for module, name in found:
        buf = module._buffers[name]
        module._buffers[name] = buf.to(_torch_dtype(rounding)).to(buf.dtype)
    return len(found)


def head_in(model: Any, master: Any, dtype: str) -> None:
    """The LM head of ``model`` in ``dtype``: weights from ``master``, input cast to ``dtype``."""
    head = model.get_output_embeddings()
    source = master.get_output_embeddings()
    wanted = _torch_dtype(dtype)
    head.weight = type(head.weight)(source.weight.detach().to(wanted).clone(), False)
    if getattr(head, "bias", None) is not None:
        head.bias = type(head.bias)(source.bias.detach().to(wanted).clone(), False)

    def cast_input(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0].to(wanted), *args[1:]) if args else args

    head.register_forward_pre_hook(cast_input)


def fake_quantize(x: Any, fmt: str) -> Any:
    """``x`` rounded to the float8 format ``fmt`` (saturating, scale 1) and back to its dtype."""
    import torch

    f8 = _torch_dtype(fmt)
    top = torch.finfo(f8).max
    return x.clamp(-top, top).to(f8).to(x.dtype)


#: Per attention module: the cache memory its last call rounded (key and value addresses,
#: strides and leading shape) and how many positions of it.
_ROUNDED: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], int]] = weakref.WeakKeyDictionary()


def _writable(t: Any) -> bool:
    """Whether writing into ``t`` in place writes each element once (no expanded dimension)."""
    return all(stride != 0 or size == 1 for size, stride in zip(t.shape, t.stride(), strict=True))


def quantized_entries(module: Any, key: Any, value: Any, new: int, fmt: str) -> tuple[Any, Any]:
    """``key`` and ``value`` (``[..., positions, head_dim]``, the cache's filled part, seen by
    ``module``'s attention with ``new`` new positions last) with every entry rounded to ``fmt``,
    as an fp8 KV cache stores them.

    Rounding is idempotent (every float8 value is exact in float16, bfloat16 and float32), so
    outside autograd the entries are rounded in place, into the cache itself, and an entry
    rounded once is not rounded again: when ``key`` and ``value`` are the same memory this
    module's last call rounded, now exactly ``new`` positions longer (a cache that appends in
    place, as the probe's preallocated one does), only those positions are rounded, so a decode
    step costs one position per layer instead of the whole cache. Any other cache (one that
    copies on append, keeps a sliding window, or was reallocated) is rounded whole, which is
    correct for any layout. The same values bit for bit as rounding the whole cache at every
    call (``tests/unit/test_attribution.py``). Tensors that record gradients, and tensors whose
    elements share memory (an expanded view), are rounded whole, into new tensors."""
    if key.requires_grad or value.requires_grad or not (_writable(key) and _writable(value)):
        return fake_quantize(key, fmt), fake_quantize(value, fmt)
    length = key.shape[-2]
    new = min(new, length)
    memory = (key.data_ptr(), value.data_ptr(), key.stride(), value.stride(), key.shape[:-2])
    last = _ROUNDED.get(module)
    start = length - new if last is not None and last == (memory, length - new) else 0
    for t in (key, value):
        t[..., start:, :] = fake_quantize(t[..., start:, :], fmt)
    _ROUNDED[module] = (memory, length)
    return key, value


def quantized_kv_cache(model: Any, fmt: str) -> str:
    """Make ``model``'s attention see keys and values rounded to ``fmt``; returns the name of
    the attention implementation registered for it."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config = model.config
    inner = getattr(config, "_attn_implementation", None) or "sdpa"
    if inner.startswith("precision_plugin_kv_"):
        inner = inner.split("__", 1)[1]
    name = f"precision_plugin_kv_{fmt}__{inner}"
    if name not in ALL_ATTENTION_FUNCTIONS:
        if inner == "eager":
            from transformers.models.llama.modeling_llama import eager_attention_forward as wrapped
        else:
            wrapped = ALL_ATTENTION_FUNCTIONS[inner]

        def attention(module: Any, query: Any, key: Any, value: Any, *args: Any, **kw: Any) -> Any:
            key, value = quantized_entries(module, key, value, query.shape[-2], fmt)
            return wrapped(module, query, key, value, *args, **kw)

        AttentionInterface.register(name, attention)
        # The mask is built per implementation: the same as the wrapped one's (else none is).
        from transformers.masking_utils import (
            ALL_MASK_ATTENTION_FUNCTIONS,
            AttentionMaskInterface,
        )

        if inner in ALL_MASK_ATTENTION_FUNCTIONS:
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[inner])
    for sub in model.modules():
        sub_config = getattr(sub, "config", None)
        if sub_config is not None and hasattr(sub_config, "_attn_implementation"):
            sub_config._attn_implementation = name
    return name


def routers(model: Any) -> list[tuple[str, Any]]:
    """``(name, module)`` of each MoE router (transformers' ``*TopKRouter``); empty when dense."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if type(m).__name__.endswith("TopKRouter") and hasattr(m, "weight")
    ]


def router_in(model: Any, master: Any, dtype: str, compute: str) -> int:
    """Compute each router of ``model`` in ``dtype`` (weights from ``master``), routing weights
    handed on in ``compute``; returns how many routers."""
    wanted, out_dtype = _torch_dtype(dtype), _torch_dtype(compute)
    masters = dict(routers(master))
    found = routers(model)
    for name, router in found:
        router.weight = type(router.weight)(masters[name].weight.detach().to(wanted).clone(), False)

        def cast_input(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            return (args[0].to(wanted), *args[1:]) if args else args

        def cast_output(module: Any, args: tuple[Any, ...], output: Any) -> Any:
            logits, scores, indices = output
            return logits.to(out_dtype), scores.to(out_dtype), indices

        router.register_forward_pre_hook(cast_input)
        router.register_forward_hook(cast_output)
    return len(found)


def outside_autocast(module: Any) -> None:
    """Run ``module``'s forward with torch's autocast off (a component computed in its own
    dtype inside a model scored under autocast: the trainer's side with the rollout's fp32 LM
    head or router switched on). A forward pre-hook turns autocast off, a forward hook turns it
    back on."""
    import torch

    entered: list[Any] = []

    def off(mod: Any, args: tuple[Any, ...]) -> None:
        device = args[0].device.type if args and hasattr(args[0], "device") else "cpu"
        context = torch.autocast(device_type=device, enabled=False)
        context.__enter__()
        entered.append(context)

    def on(mod: Any, args: tuple[Any, ...], output: Any) -> None:
        if entered:
            entered.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(off)
    module.register_forward_hook(on)


@contextlib.contextmanager
def recorded_routes(model: Any) -> Iterator[list[Any]]:
    """While open, each router call appends its chosen experts (sorted, ``[tokens, top_k]``)."""
    seen: list[Any] = []

    def record(module: Any, args: tuple[Any, ...], output: Any) -> None:
        seen.append(output[2].sort(dim=-1).values.detach().clone())

    handles = [m.register_forward_hook(record) for _, m in routers(model)]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def stepped_weights(
    master: Any, sequences: Sequence[Any], learning_rate: float, seed: int
) -> dict[str, Any]:
    """``master``'s state dict after one Adam step on a policy-gradient surrogate.

    The surrogate is ``-mean_i(A_i * mean_t log pi(token_t))`` over the sequences, with
    advantages ``A_i = +-1`` drawn with ``seed``; the step is ``torch.optim.Adam(lr=
    learning_rate)``'s first (each weight moves by about ``learning_rate``). ``master`` is left
    unchanged (the returned tensors belong to a copy nobody else holds).
    """
    import torch

    model = copy.deepcopy(master).train()
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (len(sequences),), generator=generator) * 2 - 1
    device = next(model.parameters()).device
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    optimizer.zero_grad()
    loss = torch.zeros((), device=device)
    for sign, s in zip(signs.tolist(), sequences, strict=True):
        if not s.completion_ids:
            continue
        ids = torch.tensor([list(s.prompt_ids) + list(s.completion_ids)], device=device)
        logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1].float()
        target = ids[0, len(s.prompt_ids) :]
        logp = logits.log_softmax(-1).gather(-1, target[:, None]).mean()
        loss = loss - sign * logp / len(sequences)
    loss.backward()
    optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items()}
