"""A KV cache allocated once per generation, for the token-by-token loops (rollout, decode scoring).

transformers' ``DynamicCache`` appends each step's keys and values with ``torch.cat``, which
copies the whole cache every step: at 1,000 cached tokens that copy was 70 % of a SmolLM2-135M
decode step on CPU. :func:`preallocated_cache` builds the ``DynamicCache`` the model would build
and swaps each plain full-attention layer for :class:`PreallocatedLayer`, which writes into a
buffer sized for the whole generation and hands attention a view of the filled part: the same
values in the same shape as ``DynamicCache`` returns (only the strides differ), so attention
computes the same numbers. Sliding-window or other special layers are left as the model made
them; a transformers without per-layer caches (before 4.56) gets ``None`` (its own cache).
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["decode_buffers", "drop_rows", "preallocated_cache"]  # and PreallocatedLayer


@functools.cache
def _layer_class() -> type | None:
    # Built on first use: importing transformers here would make ``import precision_plugin``
    # (and ``enable()``) import it.
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # transformers < 4.56: one DynamicCache without layers
        return None

    class PreallocatedLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values live in a buffer of ``capacity`` positions
        (grown by doubling if a generation outlasts it); ``keys``/``values`` are views of the
        filled part. ``store``: the buffers' dtype when it is not the keys' own (float32 for a
        float16 model whose attention widens them anyway: the same values, widened once)."""

        def __init__(self, capacity: int, store: Any = None, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.capacity = max(1, int(capacity))
            self.store = store  # the buffers' dtype (None: the keys' own)
            self._buffers: tuple[Any, Any] | None = None
            self._length = 0

        def update(
            self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any
        ) -> tuple[Any, Any]:
            """Write the new positions after the filled ones; return the filled views."""
            import torch

            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self._length + key_states.shape[-2]
            if self._buffers is None or end > self._buffers[0].shape[-2]:
                size = max(end, self.capacity if self._buffers is None else 2 * end)
                grown = []
                for new in (key_states, value_states):
                    shape = (*new.shape[:-2], size, new.shape[-1])
                    dtype = self.store or new.dtype
                    grown.append(torch.empty(shape, dtype=dtype, device=new.device))
                if self._buffers is not None:
                    for old, buffer in zip(self._buffers, grown, strict=True):
                        buffer[..., : self._length, :] = old[..., : self._length, :]
                self._buffers = (grown[0], grown[1])
            keys, values = self._buffers
            keys[..., self._length : end, :] = key_states
            values[..., self._length : end, :] = value_states
            self._length = end
            self.keys, self.values = keys[..., :end, :], values[..., :end, :]
            return self.keys, self.values

        def batch_select_indices(self, indices: Any) -> None:
            """Keep only the batch rows ``indices`` (finished sequences leave the batch)."""
            if self._buffers is not None:
                keys, values = (b[indices] for b in self._buffers)
                self._buffers = (keys, values)
                self.keys = keys[..., : self._length, :]
                self.values = values[..., : self._length, :]

        def reset(self) -> None:
            """Forget the cached positions (the buffer is kept for reuse)."""
            self._length = 0
            super().reset()

        def crop(self, tokens_to_remove: int) -> None:
            """Drop the last ``-tokens_to_remove`` positions."""
            super().crop(tokens_to_remove)
            if self.keys is not None and self.is_initialized:
                self._length = self.keys.shape[-2]

    return PreallocatedLayer


def __getattr__(name: str) -> Any:
    """``PreallocatedLayer``: the layer class (``None`` on a transformers without per-layer
    caches), built on first use."""
    if name == "PreallocatedLayer":
        return _layer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def preallocated_cache(model: Any, capacity: int) -> Any | None:
    """The ``DynamicCache`` ``model`` would build, its full-attention layers preallocated for
    ``capacity`` positions (prompt plus every token to come); ``None`` where this transformers
    or this model's cache has no per-layer layout (the caller passes no cache then). A model on
    the widened float16 attention (``float16_cpu.ATTENTION``) keeps its keys and values in
    float32 buffers."""
    layer_class = _layer_class()
    if layer_class is None:
        return None
    import torch
    from transformers.cache_utils import DynamicCache, DynamicLayer

    from precision_plugin._core.scoring.float16_cpu import widens_cache

    config = getattr(model, "config", None)
    try:
        cache = DynamicCache(config=config)
    except Exception:  # an exotic config transformers cannot lay out: its own cache then
        return None
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or not layers:
        return None
    store = torch.float32 if widens_cache(model) else None
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[i] = layer_class(capacity, store)
    return cache


def decode_buffers(model: Any, mask: Any, steps: int) -> tuple[Any, Any | None]:
    """The attention mask and KV cache of a token-by-token loop over ``steps`` more tokens after
    a prompt batch with attention ``mask`` (``[batch, width]``), both allocated once: the mask
    ``[batch, width + steps]`` (``mask``, then ones; step ``t`` uses its first ``width + t + 1``
    columns, the same values growing it by ``torch.cat`` gives) and
    :func:`preallocated_cache` for ``width + steps`` positions."""
    import torch

    batch, width = mask.shape
    full = torch.ones((batch, width + steps), dtype=mask.dtype, device=mask.device)
    full[:, :width] = mask
    return full, preallocated_cache(model, width + steps)


def drop_rows(cache: Any, keep: Any) -> bool:
    """Keep only the batch rows ``keep`` of a decode loop's KV cache, in place (finished
    sequences leave the batch); False, nothing changed, for a cache that cannot select rows
    (``None`` or a legacy tuple): the loop then runs every row on."""
    select = getattr(cache, "batch_select_indices", None)
    if select is None:
        return False
    select(keep)
    return True
