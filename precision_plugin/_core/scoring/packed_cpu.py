"""Linear layers of an inference copy on CPU, multiplied with weights prepacked for oneDNN.

A decode step multiplies a few rows (one per sequence) by every weight matrix. PyTorch's
``F.linear`` hands that to a general GEMM that re-reads the weight in its stored layout at every
call: on a SmolLM2-135M decode step (8 rows, one thread) it read the float32 weights at about
5 GB/s. oneDNN can lay a weight out once for its own kernel (``torch.ops.mkldnn``, what
``torch.compile`` uses for CPU linears), and the same products then ran 1.8-3.4x faster (float32,
and float16 computed in float32) and 2.5x faster in bfloat16. The product is the same contract
(float32 accumulation; in bfloat16 one rounding of the output, bit for bit what ``F.linear``
gives, which already calls oneDNN), in another summation order for float32.

A row's value must not depend on how many rows share the product (the probe's ``batch`` cause
and the canary's batch-invariance check read it). oneDNN's packed kernel keeps that from one row
on AVX2 and AVX512 CPUs, not on older ones; :func:`rows_for` finds out once per weight shape,
and a product with fewer rows than it needs is padded with zero rows, as
:data:`MIN_ROWS` pads the plain float32 GEMM.

Used for inference copies only (the rollout engine's model): a layer whose weight records a
gradient, lives on another device or meets an input of another dtype runs ``nn.Linear``'s own
forward; so does every layer where this PyTorch has no oneDNN or this CPU cannot pack the dtype
(bfloat16 needs AVX512-BW or AVX-NE-CONVERT).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

# and PackedLinear (built on first use, __getattr__)
__all__ = [
    "MIN_ROWS",
    "PACK_ROWS",
    "pack_linears",
    "packed_product",
    "packs",
    "rows_for",
    "trainer_kernels",
]

#: The batch size the weights are laid out for (a decode step's rows; any row count works).
PACK_ROWS = 8

#: Fewest rows a product is computed with where the kernel needs padding. The float32 GEMM
#: takes another path for a few rows (on an AVX512 CPU: under 4 rows with one thread, under 12
#: rows not a multiple of 4 with two), and there a row's value depends on how many rows share
#: the call; padded to this many, a row's value is the same alone, in a batch or in any chunk
#: of the LM head (``float16_cpu`` pads its float32 products to it too).
MIN_ROWS = 16


_TRAINER_KERNELS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "precision_plugin_trainer_kernels", default=False
)


@contextlib.contextmanager
def trainer_kernels() -> Iterator[None]:
    """While open, packed layers (and float16 layers, and their fused groups) multiply with the
    kernels a trainer's forward runs (``F.linear``; for float16 the product of the widened
    operands, weight widened at each call): a rollout copy scored "like the trainer" then
    differs from the trainer only by its weights' and activations' dtype, not by a GEMM's
    summation order (the attribution's ``dtype`` row is exactly 0 in float32)."""
    token = _TRAINER_KERNELS.set(True)
    try:
        yield
    finally:
        _TRAINER_KERNELS.reset(token)


def packing() -> bool:
    """Whether packed layers may use their packed weights now (not inside
    :func:`trainer_kernels`)."""
    return not _TRAINER_KERNELS.get()


@functools.cache
def _available() -> bool:
    import torch

    ops = getattr(torch.ops, "mkldnn", None)
    return bool(
        torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


@contextlib.contextmanager
def outside_dispatch_modes() -> Iterator[None]:
    """While open, the caller's ``TorchDispatchMode``s (a memory tracker, a FLOP counter) are
    set aside. Packing is a layout of the plugin's own copy, and :func:`rows_for` (and
    ``fused_cpu.fusable``) a check of the CPU's kernel on random values: under a mode that
    cannot handle oneDNN's opaque packed tensor they failed, and the failure was read as "this
    CPU cannot pack" and cached for the whole process, so every later rollout multiplied
    unpacked (other kernels, other numbers)."""
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:  # a PyTorch without it (it is internal): the modes stay
        yield
        return
    with _disable_current_modes():
        yield


def pack(weight: Any) -> Any | None:
    """``weight`` (``[out, in]``, CPU) laid out for oneDNN's kernel, or ``None`` where this
    PyTorch or CPU cannot pack its dtype."""
    import torch

    if not _available() or weight.device.type != "cpu":
        return None
    try:
        with outside_dispatch_modes():
            return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)
    except RuntimeError:  # e.g. bfloat16 on a CPU without AVX512-BW
        return None


@functools.cache
def packs(dtype: Any) -> bool:
    """Whether oneDNN can lay out ``dtype`` weights on this CPU (checked once per dtype on a
    small weight); ``float16_cpu.widened_dtypes`` reads it for bfloat16."""
    import torch

    return pack(torch.zeros(PACK_ROWS, PACK_ROWS, dtype=dtype)) is not None


def _product(rows: Any, packed: Any, bias: Any) -> Any:
    import torch

    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


@functools.cache
def rows_for(in_features: int, out_features: int, dtype: Any) -> int | None:
    """Fewest rows a packed product of this shape needs for a row's value not to depend on the
    row count: 1 where the kernel is batch-invariant (AVX2, AVX512), :data:`MIN_ROWS`
    where it is so only from there (older CPUs), ``None`` where not even then or not packable
    (the caller keeps ``F.linear``). Checked once per shape on seeded random values, outside
    the caller's dispatch modes."""
    import torch

    with outside_dispatch_modes():
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
        rows = torch.randn(2 * MIN_ROWS + 3, in_features, generator=generator).to(dtype)
        packed = pack(weight)
        if packed is None:
            return None
        full = _product(rows, packed, None)
        for fewest in (1, MIN_ROWS):
            if all(
                torch.equal(_product(rows[:count], packed, None), full[:count])
                for count in range(fewest, MIN_ROWS + 2)
            ):
                return fewest
    return None


def packed_weight(weight: Any) -> tuple[Any, int] | None:
    """``weight`` packed (:func:`pack`) with the fewest rows its products need
    (:func:`rows_for`), or ``None`` where the caller keeps ``F.linear``."""
    fewest = rows_for(weight.shape[1], weight.shape[0], weight.dtype)
    packed = pack(weight) if fewest is not None else None
    return None if packed is None else (packed, fewest)


def recording(*tensors: Any) -> bool:
    """Whether autograd records an operation on any of ``tensors`` (``None`` entries allowed):
    then a layer runs PyTorch's own kernel, so gradients flow."""
    import torch

    return torch.is_grad_enabled() and any(
        t is not None and getattr(t, "requires_grad", False) for t in tensors
    )


def swap_linears(model: Any, layer: type, dtypes: tuple[Any, ...]) -> int:
    """Make every plain ``torch.nn.Linear`` of ``model`` on CPU whose weight dtype is in
    ``dtypes`` a ``layer`` (same parameters, same state dict), in place; returns how many.
    Subclasses (LoRA, quantised layers) keep their own forward."""
    import torch

    count = 0
    for module in model.modules():
        if (
            type(module) is torch.nn.Linear
            and module.weight.dtype in dtypes
            and module.weight.device.type == "cpu"
        ):
            module.__class__ = layer
            count += 1
    return count


def packed_product(x: Any, packed: Any, bias: Any, fewest: int) -> Any:
    """``F.linear(x, weight, bias)`` with ``weight`` packed (:func:`pack`), its rows padded with
    zeros to at least ``fewest`` (:func:`rows_for`); ``x``'s dtype is the weight's."""
    rows = x.reshape(-1, x.shape[-1])
    count = rows.shape[0]
    if count < fewest:
        rows = rows.new_zeros(fewest, rows.shape[1])
        rows[:count] = x.reshape(-1, x.shape[-1])
    out = _product(rows.contiguous(), packed, bias)
    return out[:count].reshape(*x.shape[:-1], out.shape[-1])


def version(tensor: Any) -> int | None:
    """``tensor``'s in-place version; ``None`` for an inference-mode tensor, which keeps none
    (nor may it change outside that mode): the same object is then taken as the same values."""
    return None if tensor.is_inference() else tensor._version


def stamp(weight: Any) -> tuple[int, int | None]:
    """What identifies ``weight``'s values: its storage and in-place version (a weight synced in
    place, as a rollout copy is each step, gets a new version and is packed again)."""
    return (weight.data_ptr(), version(weight))


@functools.cache
def _linear_class() -> type:
    import torch

    class PackedLinear(torch.nn.Linear):
        """A ``torch.nn.Linear`` that multiplies with its weight packed for oneDNN (module
        docstring) when it computes inference on CPU in the weight's own dtype (float32 or
        bfloat16); anything else runs ``nn.Linear``'s own forward. The packed copy is kept
        while the weight is unchanged (same storage, same version counter): update weights
        in place through the parameter (``param.copy_`` under ``no_grad``, an optimiser step,
        ``load_state_dict``) or by assigning new data; ``param.data.copy_(...)`` does not move
        the version counter, so the old packed copy would be used."""

        _packed: tuple[tuple[int, int], tuple[Any, int] | None] | None = None
        _shared: Any = None

        def forward(self, input: Any) -> Any:
            weight = self.weight
            if (
                weight.device.type != "cpu"
                or input.dtype != weight.dtype
                or weight.dtype not in (torch.float32, torch.bfloat16)
                or recording(input, weight, self.bias)
                or not packing()
            ):
                return super().forward(input)
            if self._shared is not None:  # layers reading the same input (fused_cpu)
                out = self._shared(self, input)
                if out is not None:
                    return out
            if self._packed is None or self._packed[0] != stamp(weight):
                self._packed = (stamp(weight), packed_weight(weight))
            kept = self._packed[1]
            if kept is None:
                return super().forward(input)
            packed, fewest = kept
            bias = None if self.bias is None else self.bias.detach()
            return packed_product(input, packed, bias, fewest)

    return PackedLinear


def __getattr__(name: str) -> Any:
    """``PackedLinear``: the layer class, built on first use."""
    if name == "PackedLinear":
        return _linear_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pack_linears(model: Any) -> int:
    """Make every plain ``torch.nn.Linear`` of ``model`` on CPU with float32 or bfloat16 weights
    a :class:`PackedLinear` (same parameters, same state dict), in place; returns how many.
    Subclasses (LoRA, quantised or float16 layers) keep their own forward; a PyTorch without
    oneDNN changes nothing."""
    import torch

    if not _available():
        return 0
    return swap_linears(model, _linear_class(), (torch.float32, torch.bfloat16))
