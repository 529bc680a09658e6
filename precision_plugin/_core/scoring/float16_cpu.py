"""float16 linear layers and attention on CPU, computed the way a GPU computes them.

A GPU multiplies float16 matrices with float32 accumulation and rounds the result once to
float16. PyTorch's CPU float16 kernel means the same thing (float32 accumulation, one rounding)
but, on CPUs without AVX512-FP16, runs 2-4x slower than float32 (a 135M model's decode step read
its float16 weights at about 1.2 GB/s, float32 at 3-4 GB/s), which made float16 half of the
probe's time. Here a float16 linear layer on CPU computes ``F.linear`` in float32 on its exactly
widened float16 operands (every float16 value is a float32 value) and rounds the output once to
float16: the same contract, a different summation order (on SmolLM2-135M 99.8 % of output
elements equal the CPU kernel's, the rest one float16 ulp apart, which is the size of the
difference between two GEMM kernels, not a change of precision).

Attention likewise: PyTorch's CPU float16 flash-attention kernel took 3-5 ms per layer and
decode step at 500-1,000 cached tokens against 0.5-1 ms in float32, so at 1,024 tokens it was
half of a float16 decode. Here :func:`sdpa_float16` computes attention as a GPU's flash kernel
does on the exactly widened float16 query, keys and values: scores and softmax statistics in
float32, the unnormalised probabilities rounded to float16 before they multiply the values
(float32 accumulation), the output normalised in float32 and rounded once to float16. A
decode step and a prefill pass round their probabilities from slightly different scores, so
that rounding is part of the probe's ``decode`` cause: a first version without it made
float16's ``decode`` row smaller than PyTorch's float16 kernel gave. bfloat16 attention runs
the same way with its roundings in bfloat16: PyTorch's CPU bfloat16 flash kernel took 8 ms per
layer and decode step at 900 cached tokens (SmolLM2-135M, 8 rows, one thread) against 1.5-2.6
ms here, and a GPU's bfloat16 flash kernel rounds its probabilities the same way. A long query
(a prefill) runs in blocks of rows that keep at most :data:`CHUNK_SCORES` scores, so a block
stays in the CPU's cache (one 1,100-token layer's float16 prefill: 0.31 s as one block, 0.12 s
in blocks); each row's arithmetic is its own, so the blocks change no bit. A block multiplies
by tiles of :data:`KEY_TILE` keys at fixed positions, as a flash kernel does (the scores tile
by tile, the product with the values summed tile after tile), and skips, with the elementwise
steps, the tiles no row of it may see (a causal prefill's upper triangle): a skipped tile
would have added an exact 0 and every tile has the same shape in any block, so the output is
the same bit for bit as over every key (one 1,100-token layer's causal float16 prefill: about
three quarters of the time over every key). The KV cache of a widened model keeps its float16
or bfloat16 keys and values in float32 buffers (the same values, so no step widens the whole
cache again).

Entry points, all for inference only (anything that records gradients runs PyTorch's own
kernel):

- :func:`widen_float16` for a model whose weights are float16 (a rollout copy): its
  ``torch.nn.Linear`` layers become :class:`Float16Linear` (same parameters, same state dict),
  which keeps a float32 copy of the weight for as long as the weight is unchanged (a rollout
  copy then takes three times its float16 size), and a model on transformers' ``sdpa``
  attention switches to :data:`ATTENTION` (registered with transformers' ``AttentionInterface``
  and ``AttentionMaskInterface``, its own extension points);
- :func:`float16_autocast_linears`, entered by ``trainer_precision`` for float16 on CPU: under
  ``torch.autocast(float16)`` every ``F.linear`` and ``F.scaled_dot_product_attention`` rounds
  its operands to float16 as autocast does, then computes as above (the weight is widened at
  each call: a prefill's product is large enough that this costs little, and the trainer's
  weights get no second copy).

bfloat16 products take the same path on a CPU where oneDNN cannot lay out bfloat16 weights
(no AVX512-BW or AVX-NE-CONVERT, e.g. AVX2 only; :func:`widened_dtypes`): PyTorch's bfloat16
product falls back there to a generic GEMM that took 4-7x the time of the float32 product of
the same values, with the same contract. A CPU that packs bfloat16 keeps PyTorch's own
bfloat16 products.

On a GPU neither applies: its float16 GEMM already is this contract.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from typing import Any

# MIN_ROWS: fewest rows a product is computed with (defined with the packed products, which
# it also pads; float16_cpu.MIN_ROWS is the same object).
from precision_plugin._core.scoring import packed_cpu
from precision_plugin._core.scoring.packed_cpu import MIN_ROWS
from precision_plugin._core.scoring.packed_cpu import recording as _recording

__all__ = [
    "ATTENTION",
    "float16_autocast_linears",
    "sdpa_float16",
    "widen_float16",
    "widen_float16_attention",
    "widen_float16_linears",
    "widened_dtypes",
]  # and Float16Linear

#: The attention implementation name a widened model runs (:func:`sdpa_float16` for float16).
ATTENTION = "precision_plugin_float16_sdpa"

#: Most attention scores (query rows x keys x heads x batch) :func:`sdpa_float16` holds at once
#: (8 MiB of float32); a longer query runs in blocks of rows.
CHUNK_SCORES = 1 << 21


@functools.cache
def widened_dtypes() -> tuple[Any, ...]:
    """The dtypes whose CPU products run here in float32 on exactly widened operands: float16
    always, bfloat16 where oneDNN cannot lay out bfloat16 weights (a CPU without AVX512-BW or
    AVX-NE-CONVERT, e.g. AVX2 only). There PyTorch's bfloat16 product falls back to a generic
    GEMM that took 4-7x the time of the float32 product of the same values, with the same
    contract (float32 accumulation, one rounding; on SmolLM2-shaped products 99.99 % of the
    output elements equal, the rest a summation order apart); a CPU that packs bfloat16 keeps
    PyTorch's own bfloat16 kernels."""
    import torch

    return (torch.float16,) if packed_cpu.packs(torch.bfloat16) else (torch.float16, torch.bfloat16)


def widened(tensor: Any, low: Any = None) -> Any:
    """``tensor`` rounded to ``low`` (float16 when ``None``; or bfloat16) and widened back to
    float32 (exact for float16 and bfloat16 values)."""
    import torch

    return tensor.detach().to(low or torch.float16).to(torch.float32)


def _linear(x: Any, weight: Any, bias: Any, wide: Any = None, low: Any = None) -> Any:
    """``F.linear`` of ``low`` values (float16 when ``None``; or bfloat16) in float32, rounded
    once to ``low`` (``wide``: the widened weight when the caller keeps it)."""
    import torch
    import torch.nn.functional as F

    low = low or torch.float16
    rows = x.reshape(-1, x.shape[-1]).to(low).to(torch.float32)
    count = rows.shape[0]
    if count < MIN_ROWS:
        rows = torch.cat([rows, rows.new_zeros(MIN_ROWS - count, rows.shape[1])])
    with torch.autocast("cpu", enabled=False):
        out = F.linear(
            rows,
            widened(weight, low) if wide is None else wide,
            None if bias is None else widened(bias, low),
        )
    return out[:count].to(low).reshape(*x.shape[:-1], out.shape[-1])


@functools.cache
def _linear_class() -> type:
    # Built on first use, so importing this module does not import torch.
    import torch

    class Float16Linear(torch.nn.Linear):
        """A ``torch.nn.Linear`` whose float16 product on CPU runs in float32 (module
        docstring), and its bfloat16 product where :func:`widened_dtypes` says so; any other
        dtype, device or a recorded gradient runs ``nn.Linear``'s own.

        It keeps the widened weight (4 bytes per parameter) while the weight is unchanged
        (same storage, same version counter): widening it again at every decode step cost as
        much as the float16 kernel saved. Where oneDNN can pack it
        ([`packed_cpu`][precision_plugin._core.scoring.packed_cpu]), the widened weight is kept
        packed and multiplied by oneDNN's kernel (the same float32 product, 1.8x faster on a
        decode step's few rows).
        """

        _wide: tuple[tuple[int, int], Any] | None = None
        _shared: Any = None

        def forward(self, input: Any) -> Any:
            weight = self.weight
            low = weight.dtype
            if (
                low not in widened_dtypes()
                or weight.device.type != "cpu"
                or input.dtype != low
                or _recording(input, weight, self.bias)
            ):
                return super().forward(input)
            if not packed_cpu.packing():  # as a trainer's autocast computes it
                return _linear(input, weight, self.bias, low=low)
            if self._shared is not None:  # layers reading the same input (fused_cpu)
                out = self._shared(self, input)
                if out is not None:
                    return out
            if self._wide is None or self._wide[0] != packed_cpu.stamp(weight):
                wide = widened(weight, low)
                # The packed copy replaces the widened one (same 4 bytes per parameter).
                self._wide = (packed_cpu.stamp(weight), packed_cpu.packed_weight(wide) or wide)
            kept = self._wide[1]
            if isinstance(kept, tuple):
                packed, fewest = kept
                rows = input.to(torch.float32)
                bias = None if self.bias is None else widened(self.bias, low)
                out = packed_cpu.packed_product(rows, packed, bias, fewest)
                return out.to(low)
            return _linear(input, weight, self.bias, kept, low)

    return Float16Linear


def __getattr__(name: str) -> Any:
    """``Float16Linear``: the layer class, built on first use."""
    if name == "Float16Linear":
        return _linear_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def widen_float16_linears(model: Any) -> int:
    """Make every plain ``torch.nn.Linear`` of ``model`` (on CPU, weights in one of
    :func:`widened_dtypes`: float16, and bfloat16 on a CPU that cannot pack it) a
    :class:`Float16Linear`, in place; returns how many. Subclasses of ``nn.Linear`` (LoRA
    layers, quantised layers) are left alone: their forward is their own."""
    return packed_cpu.swap_linears(model, _linear_class(), widened_dtypes())


def sdpa_float16(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    exact_float32: bool = False,
    dtype: Any = None,
) -> Any:
    """``F.scaled_dot_product_attention`` of float16 values (any float input is rounded to
    float16 first) as a GPU flash kernel computes it, returned in float16: scores, their row
    maximum and the probability sums in float32, the unnormalised probabilities rounded to
    float16 before the product with the values (accumulated in float32), the output divided by
    the sums and rounded once. A query row with no key to attend gives zeros. Inference only
    (``dropout_p`` must be 0).

    ``dtype``: ``torch.bfloat16`` computes the same for bfloat16 (the roundings in bfloat16, as
    a bfloat16 flash kernel does); ``None`` means float16. ``exact_float32``: float32 keys and
    values already hold values of that dtype (a widened model's KV cache), so they are used as
    they are, not copied twice more. Grouped-query attention folds the query heads that share a
    key/value head into the rows of one product (each query head still meets only its own key
    head), so the keys and values are read once per layer rather than once per query head.
    """
    import math

    import torch

    if dropout_p:
        raise ValueError(
            f"sdpa_float16 computes inference attention; it was asked for dropout_p={dropout_p}."
            " Fix: call it with dropout_p=0 (training keeps PyTorch's own kernel)."
        )
    low = torch.float16 if dtype is None else dtype
    if low not in (torch.float16, torch.bfloat16):
        raise ValueError(
            f"sdpa_float16 rounds to float16 or bfloat16; it was asked for dtype={dtype}. "
            f"Fix: pass dtype=torch.float16, torch.bfloat16 or None."
        )

    def wide(t: Any) -> Any:
        if exact_float32 and t.dtype == torch.float32:
            return t.detach()
        return t.detach().to(low).to(torch.float32)

    with torch.autocast("cpu", enabled=False):
        q, k, v = wide(query), wide(key), wide(value)
        heads, kv_heads = q.shape[-3], k.shape[-3]
        groups = heads // kv_heads if enable_gqa and kv_heads != heads else 1
        rows, length = q.shape[-2], k.shape[-2]
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        mask = attn_mask
        if is_causal:
            mask = torch.ones(rows, length, dtype=torch.bool).tril()
        # A long query (a prefill) runs in blocks of rows, so each block's scores stay in the
        # CPU's cache instead of a [rows, length] matrix per head going through memory ten
        # times: every row's arithmetic is its own, so the output is the same bit for bit.
        block = max(MIN_ROWS, CHUNK_SCORES // max(1, q[..., :1, :1].numel() * length))
        # Every block has at least MIN_ROWS rows (a last short block joins the one before):
        # with fewer, the float32 GEMM may take another path and round a row differently.
        starts = list(range(0, rows, block))
        if len(starts) > 1 and rows - starts[-1] < MIN_ROWS:
            starts.pop()
        ends = [*starts[1:], rows]
        sliced = mask is not None and mask.dim() >= 2 and mask.shape[-2] == rows
        blocks = [
            _attend(
                q[..., first:end, :],
                k,
                v,
                mask[..., first:end, :] if sliced else mask,
                scale,
                groups,
                low,
            )
            for first, end in zip(starts, ends, strict=True)
        ]
        out = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-2)
    return out.to(low)


def _attend(q: Any, k: Any, v: Any, mask: Any, scale: float, groups: int, low: Any) -> Any:
    """:func:`sdpa_float16`'s arithmetic on widened float32 ``q``, ``k``, ``v`` (the result
    still in float32)."""
    import math

    import torch

    kv_heads = k.shape[-3]
    rows, length = q.shape[-2], k.shape[-2]
    # A prefill block (MIN_ROWS rows or more) multiplies by tiles of KEY_TILE keys at fixed
    # positions, as a flash kernel does: the scores tile by tile, the product with the values
    # summed tile after tile. Keys no row of the block may see (a causal prefill's upper
    # triangle) keep probability 0 and their tiles are skipped, with the elementwise steps
    # (mask, maximum, exponential, rounding): a skipped tile would have added an exact 0, and
    # every tile has the same shape in any block, so the output is the same bit for bit as over
    # every key. The sum runs over every key (a sum over fewer terms may group them
    # differently). A decode step's one row sees its own newest key: one product per side.
    tiled = rows >= MIN_ROWS
    seen = _keys_seen(mask, length) if tiled else length
    if seen < length:
        mask = mask[..., :seen]
    # A mask shared by all heads ([rows, length] or [..., 1, rows, length]) is applied to the
    # scores viewed per group, as it is; a mask per head follows the heads into the rows.
    shared = mask is not None and (mask.dim() < 3 or mask.shape[-3] == 1)
    if groups > 1:
        # Query head h reads key head h // groups (repeat_interleave's order): the heads of
        # one group become rows of one product.
        q = q.unflatten(-3, (kv_heads, groups)).flatten(-3, -2)
        if mask is not None and not shared:
            mask = mask.unflatten(-3, (kv_heads, groups))
            mask = mask.expand(*mask.shape[:-3], groups, rows, seen).flatten(-3, -2)
    # In place where the values are the same: fewer passes through memory.
    every = _tiled_scores(q, k, seen) if tiled else q @ k.transpose(-2, -1)
    scores = every[..., :seen].mul_(scale)
    if mask is not None:
        view = scores.unflatten(-2, (groups, rows)) if groups > 1 and shared else scores
        if view is not scores and mask.dim() >= 3:
            mask = mask.unsqueeze(-3)
        if mask.dtype == torch.bool:
            view.masked_fill_(~mask, -math.inf)
        else:
            view.add_(mask.to(torch.float32))
    top = scores.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    probabilities = scores.sub_(top).exp_()
    total = every.sum(-1, keepdim=True)  # the unseen keys hold 0, what exp(-inf) gives
    probabilities.copy_(probabilities.to(low))  # rounded as a flash kernel rounds them
    out = (_tiled_values(every, v, seen) if tiled else every @ v).div_(total)
    out = torch.where(total > 0, out, 0.0)
    if groups > 1:
        out = out.unflatten(-2, (groups, rows)).flatten(-4, -3)
    return out


#: Keys per tile of a prefill block's products (:func:`_attend`), at fixed positions (0-63,
#: 64-127, ...); the keys a block may see are rounded up to whole tiles, so its elementwise
#: steps also run whole vectors of the CPU's widest float32 registers (16 lanes, two at a time).
KEY_TILE = 64


def _tiled_scores(q: Any, k: Any, seen: int) -> Any:
    """``q @ k^T`` over the first ``seen`` keys, tile by tile (:data:`KEY_TILE` keys at fixed
    positions); the other keys' columns hold 0."""
    every = q.new_empty(*q.shape[:-1], k.shape[-2])
    every[..., seen:] = 0.0  # the tiles cover the first seen keys exactly (whole tiles or all)
    keys = k.transpose(-2, -1)
    for start in range(0, seen, KEY_TILE):
        every[..., start : start + KEY_TILE] = q @ keys[..., start : start + KEY_TILE]
    return every


def _tiled_values(probabilities: Any, v: Any, seen: int) -> Any:
    """``probabilities @ v`` over the first ``seen`` keys: one product per tile of
    :data:`KEY_TILE` keys at fixed positions, added in key order."""
    out = probabilities[..., :KEY_TILE] @ v[..., :KEY_TILE, :]
    for start in range(KEY_TILE, seen, KEY_TILE):
        end = start + KEY_TILE
        out += probabilities[..., start:end] @ v[..., start:end, :]
    return out


def _keys_seen(mask: Any, length: int) -> int:
    """How many leading keys any row of ``mask`` may attend, rounded up to whole tiles of
    :data:`KEY_TILE` (at most ``length``); ``length`` without a mask."""
    import torch

    if mask is None or mask.shape[-1] != length or length <= KEY_TILE:
        return length
    allowed = mask if mask.dtype == torch.bool else mask != -math.inf
    columns = allowed.reshape(-1, length).any(0).nonzero()
    if not len(columns):
        return length
    seen = -(-(int(columns[-1]) + 1) // KEY_TILE) * KEY_TILE
    return min(length, seen)


@functools.cache
def _sdpa_mode_class() -> type:
    from torch.overrides import TorchFunctionMode

    class SdpaFloat16(TorchFunctionMode):
        """``F.scaled_dot_product_attention`` as :func:`sdpa_float16` computes it."""

        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            import torch.nn.functional as F

            if func is F.scaled_dot_product_attention:
                # Inside a widened model's attention: float32 keys and values come from its
                # KV cache, which holds values of the query's dtype.
                return sdpa_float16(
                    *args, **(kwargs or {}), exact_float32=True, dtype=args[0].dtype
                )
            return func(*args, **(kwargs or {}))

    return SdpaFloat16


def float16_attention(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any
) -> tuple[Any, Any]:
    """transformers' SDPA attention; a float16 or bfloat16 query on CPU runs
    :func:`sdpa_float16` in its dtype (module docstring)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (
        query.dtype not in (torch.float16, torch.bfloat16)
        or query.device.type != "cpu"
        or _recording(query, key, value)
    ):
        # A layer of another dtype in the model (a planted one, a kept-float32 one): its keys
        # and values may come from the float32 cache, which holds them exactly.
        if key.dtype != query.dtype:
            key, value = key.to(query.dtype), value.to(query.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    with _sdpa_mode_class()():
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


@functools.cache
def _registered() -> bool:
    """Register :data:`ATTENTION` with transformers (once); False where it cannot be."""
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        from transformers.modeling_utils import AttentionInterface
    except ImportError:  # a transformers without the interfaces (before 4.48)
        return False
    AttentionInterface.register(ATTENTION, float16_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return True


def widen_float16_attention(model: Any) -> bool:
    """Switch ``model`` (float16 or bfloat16 weights on CPU, transformers' ``sdpa`` attention)
    to :data:`ATTENTION`, in place; False (nothing changed) for any other model."""
    import torch

    config = getattr(model, "config", None)
    weight = next(iter(model.parameters()), None)
    if (
        config is None
        or getattr(config, "_attn_implementation", None) != "sdpa"
        or weight is None
        or weight.dtype not in (torch.float16, torch.bfloat16)
        or weight.device.type != "cpu"
        or not _registered()
    ):
        return False
    config._attn_implementation = ATTENTION
    return True


def widens_cache(model: Any) -> bool:
    """Whether ``model`` runs :data:`ATTENTION`: its KV cache may keep float16 or bfloat16 keys
    and values in float32 (``precision_plugin._core.scoring.kvcache``)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == ATTENTION


def widen_float16(model: Any) -> Any:
    """:func:`widen_float16_linears` and :func:`widen_float16_attention`; returns ``model``."""
    widen_float16_linears(model)
    widen_float16_attention(model)
    return model


@functools.cache
def _mode_class() -> type:
    from torch.overrides import TorchFunctionMode

    class Float16AutocastLinears(TorchFunctionMode):
        """Under CPU float16 autocast, ``F.linear`` as :func:`_linear` computes it and
        ``F.scaled_dot_product_attention`` as :func:`sdpa_float16` does; under bfloat16
        autocast, the attention (in bfloat16), and ``F.linear`` too where
        :func:`widened_dtypes` holds bfloat16."""

        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            import torch
            import torch.nn.functional as F

            kwargs = kwargs or {}
            if func is F.linear and torch.is_autocast_enabled("cpu"):
                x, weight, *rest = args
                bias = rest[0] if rest else kwargs.get("bias")
                low = torch.get_autocast_dtype("cpu")
                if (
                    low in widened_dtypes()
                    and x.device.type == "cpu"
                    and {x.dtype, weight.dtype} <= {low, torch.float32}
                    and not _recording(x, weight, bias)
                ):
                    return _linear(x, weight, bias, low=low)
            if func is F.scaled_dot_product_attention and torch.is_autocast_enabled("cpu"):
                query, key, value, *rest = args
                mask = rest[0] if rest else kwargs.pop("attn_mask", None)
                low = torch.get_autocast_dtype("cpu")
                if (
                    low in (torch.float16, torch.bfloat16)
                    and query.device.type == "cpu"
                    and {query.dtype, key.dtype} <= {low, torch.float32}
                    and not _recording(query, key, value)
                ):
                    return sdpa_float16(query, key, value, mask, *rest[1:], **kwargs, dtype=low)
                if not rest and mask is not None:
                    kwargs["attn_mask"] = mask
            return func(*args, **kwargs)

    return Float16AutocastLinears


@contextlib.contextmanager
def float16_autocast_linears() -> Iterator[None]:
    """While open, CPU float16 autocast runs ``F.linear`` as :func:`_linear` does and attention
    as :func:`sdpa_float16` does, bfloat16 autocast its attention (inference only; see the
    module docstring)."""
    with _mode_class()():
        yield
