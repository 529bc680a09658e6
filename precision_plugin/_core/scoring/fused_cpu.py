"""Linear layers of an inference copy on CPU that read the same input, multiplied as one product.

A decoder layer multiplies one hidden state by several weights: the query, key and value
projections, the gate and up projections. On a decode step's few rows each of those products is
small, and oneDNN's packed kernel ([`packed_cpu`][precision_plugin._core.scoring.packed_cpu]) runs
one call over the stacked weight faster than one call per weight, most of all once finished
sequences have left the batch (one to four rows). Every output column is the same dot product
in the same order either way, so the values are the same bit for bit; :func:`fusable` checks
that once per shape on seeded random values, and a group whose kernel disagrees is not formed.

Which layers share an input is read off the model as it runs, not off its layer names:
:func:`fuse_shared_inputs` runs one forward with a forward pre-hook on every packed layer, and
layers that received the same input tensor become a :class:`SharedInputProduct`. The first of
them called at a later step computes all their products and keeps the others' outputs for
that input; the others take theirs when called with the same tensor (same object, unchanged
since). A layer called with another input computes the whole group's product again (correct,
only slower). The stacked weight is packed again when any member's weight changes (the same
stamp as ``packed_cpu``), so a rollout copy synced in place stays right.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from precision_plugin._core.scoring import packed_cpu
from precision_plugin._core.scoring.packed_cpu import MIN_ROWS

__all__ = ["SharedInputProduct", "fusable", "fuse_shared_inputs"]

T = TypeVar("T")


def _compute_dtype(dtype: Any) -> Any:
    """The dtype a packed product runs in: the widened float32 of a float16 layer (or a
    bfloat16 one where ``float16_cpu`` widens bfloat16), else the layer's own."""
    import torch

    from precision_plugin._core.scoring.float16_cpu import widened_dtypes

    return torch.float32 if dtype in widened_dtypes() else dtype


@functools.cache
def fusable(in_features: int, sizes: tuple[int, ...], dtype: Any, bias: bool) -> bool:
    """Whether one packed product over weights of ``sizes`` output rows stacked gives, split,
    each weight's own packed product bit for bit (``dtype``: the layers' weight dtype; checked
    once per shape on seeded random values, for 1 to ``MIN_ROWS + 1`` rows and a prefill's 40,
    outside the caller's dispatch modes)."""
    with packed_cpu.outside_dispatch_modes():
        return _fuses(in_features, sizes, dtype, bias)


def _fuses(in_features: int, sizes: tuple[int, ...], dtype: Any, bias: bool) -> bool:
    import torch

    generator = torch.Generator().manual_seed(0)
    compute = _compute_dtype(dtype)
    weights = [
        torch.randn(n, in_features, generator=generator).to(dtype).to(compute) for n in sizes
    ]
    biases = [
        torch.randn(n, generator=generator).to(dtype).to(compute) if bias else None for n in sizes
    ]
    rows = torch.randn(40, in_features, generator=generator).to(dtype).to(compute)
    stacked = packed_cpu.packed_weight(torch.cat(weights))
    single = [packed_cpu.packed_weight(w) for w in weights]
    if stacked is None or any(s is None for s in single):
        return False
    joint_bias = torch.cat(biases) if bias else None  # type: ignore[arg-type]
    packed, fewest = stacked
    for count in (*range(1, MIN_ROWS + 2), 40):
        x = rows[:count]
        parts = packed_cpu.packed_product(x, packed, joint_bias, fewest).split(list(sizes), -1)
        for part, alone, b in zip(parts, single, biases, strict=True):
            if not torch.equal(part, packed_cpu.packed_product(x, alone[0], b, alone[1])):
                return False
    return True


class SharedInputProduct:
    """Layers that read one input, multiplied as one packed product (module docstring).

    Called by a member's forward as ``group(member, input)``; returns the member's output, or
    ``None`` where the member should compute alone (a weight that records gradients, or a
    stacked weight that cannot be packed)."""

    def __init__(self, members: list[Any]) -> None:
        self.members = members
        self.sizes = [m.out_features for m in members]
        self._packed: tuple[tuple[tuple[int, int], ...], tuple[Any, int], Any] | None = None
        self._kept: tuple[Any, int, dict[Any, Any]] | None = None

    def _stacked(self) -> tuple[tuple[Any, int], Any] | None:
        import torch

        stamps = tuple(packed_cpu.stamp(m.weight) for m in self.members)
        if self._packed is None or self._packed[0] != stamps:
            compute = _compute_dtype(self.members[0].weight.dtype)
            weight = torch.cat([m.weight.detach().to(compute) for m in self.members])
            packed = packed_cpu.packed_weight(weight)
            if packed is None:
                return None
            biases = [m.bias for m in self.members]
            bias = None
            if biases[0] is not None:
                bias = torch.cat([b.detach().to(compute) for b in biases])
            self._packed = (stamps, packed, bias)
        return self._packed[1], self._packed[2]

    def __call__(self, member: Any, input: Any) -> Any | None:
        kept = self._kept
        if kept is not None and kept[0] is input and kept[1] == packed_cpu.version(input):
            out = kept[2].pop(member, None)
            if out is not None:
                return out
        if any(packed_cpu.recording(input, m.weight, m.bias) for m in self.members):
            return None
        stacked = self._stacked()
        if stacked is None:
            return None
        (packed, fewest), bias = stacked
        weight_dtype = self.members[0].weight.dtype
        rows = input.to(_compute_dtype(weight_dtype))
        out = packed_cpu.packed_product(rows, packed, bias, fewest).to(input.dtype)
        parts = dict(
            zip(self.members, (p.contiguous() for p in out.split(self.sizes, -1)), strict=True)
        )
        mine = parts.pop(member)
        self._kept = (input, packed_cpu.version(input), parts)
        return mine


def _groups(calls: list[tuple[Any, Any]]) -> list[list[Any]]:
    """Layers that received the same input tensor, in call order, two or more per group, all
    of one class, weight dtype, input size and bias presence."""
    by_input: dict[int, list[Any]] = {}
    for module, tensor in calls:
        members = by_input.setdefault(id(tensor), [])
        if module not in members:
            members.append(module)
    groups = []
    for members in by_input.values():
        first = members[0]
        if len(members) >= 2 and all(
            type(m) is type(first)
            and m.weight.dtype == first.weight.dtype
            and m.in_features == first.in_features
            and (m.bias is None) == (first.bias is None)
            for m in members
        ):
            groups.append(members)
    return groups


def fuse_shared_inputs(model: Any, forward: Callable[[], T], layers: tuple[type, ...]) -> T:
    """Run ``forward()`` once (a forward of ``model``) and return its result; the ``layers``
    (packed linear classes) of ``model`` that received the same input tensor then multiply as
    one :class:`SharedInputProduct` where :func:`fusable` says the values stay the same. A model
    fused once is not traced again."""
    import torch

    if getattr(model, "_precision_plugin_fused", False) or not layers:
        return forward()
    calls: list[tuple[Any, Any]] = []

    def note(module: Any, args: tuple[Any, ...]) -> None:
        if args:
            calls.append((module, args[0]))

    handles = [
        module.register_forward_pre_hook(note)
        for module in model.modules()
        if isinstance(module, layers)
    ]
    try:
        result = forward()
    finally:
        for handle in handles:
            handle.remove()
    for members in _groups(calls):
        first = members[0]
        if first.weight.device.type != "cpu" or first.weight.dtype not in (
            torch.float32,
            torch.float16,
            torch.bfloat16,
        ):
            continue
        sizes = tuple(m.out_features for m in members)
        if fusable(first.in_features, sizes, first.weight.dtype, first.bias is not None):
            group = SharedInputProduct(members)
            for m in members:
                m._shared = group
                # The group's stacked weight replaces each member's own packed copy.
                for own in ("_packed", "_wide"):
                    if own in vars(m):
                        setattr(m, own, None)
    model._precision_plugin_fused = True
    return result
