"""float16 linear layers on CPU, computed the way a GPU's float16 GEMM computes them.

A GPU multiplies float16 matrices with float32 accumulation and rounds the result once to
float16. PyTorch's CPU float16 kernel means the same thing (float32 accumulation, one rounding)
but, on CPUs without AVX512-FP16, runs 2-4x slower than float32 (a 135M model's decode step read
its float16 weights at about 1.2 GB/s, float32 at 3-4 GB/s), which made float16 half of the
probe's time. Here a float16 linear layer on CPU computes ``F.linear`` in float32 on its exactly
widened float16 operands (every float16 value is a float32 value) and rounds the output once to
float16: the same contract, a different summation order (on SmolLM2-135M 99.8 % of output
elements equal the CPU kernel's, the rest one float16 ulp apart, which is the size of the
difference between two GEMM kernels, not a change of precision).

Two entry points, both for inference only (anything that records gradients runs PyTorch's own
kernel):

- :func:`widen_float16_linears` for a model whose weights are float16 (a rollout copy): its
  ``torch.nn.Linear`` layers become :class:`Float16Linear` (same parameters, same state dict),
  which keeps a float32 copy of the weight for as long as the weight is unchanged (a rollout
  copy then takes three times its float16 size);
- :func:`float16_autocast_linears`, entered by ``trainer_precision`` for float16 on CPU: under
  ``torch.autocast(float16)`` every ``F.linear`` rounds its operands to float16 as autocast
  does, then multiplies them as above (the weight is widened at each call: a prefill's product
  is large enough that this costs little, and the trainer's weights get no second copy).

On a GPU neither applies: its float16 GEMM already is this contract.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

__all__ = ["float16_autocast_linears", "widen_float16_linears"]  # and Float16Linear


def _recording(*tensors: Any) -> bool:
    import torch

    return torch.is_grad_enabled() and any(
        t is not None and getattr(t, "requires_grad", False) for t in tensors
    )


def widened(tensor: Any) -> Any:
    """``tensor`` rounded to float16 and widened back to float32 (exact for float16 values)."""
    import torch

    return tensor.detach().to(torch.float16).to(torch.float32)


#: Fewest rows a product is computed with. The float32 GEMM takes another path for a few rows
#: (on an AVX512 CPU: under 4 rows with one thread, under 12 rows not a multiple of 4 with
#: two), and there a row's value depends on how many rows share the call; padded to this many,
#: a row's value is the same alone, in a batch or in any chunk of the LM head.
MIN_ROWS = 16


def _linear(x: Any, weight: Any, bias: Any, wide: Any = None) -> Any:
    """``F.linear`` of float16 values in float32, rounded once to float16 (``wide``: the
    widened weight when the caller keeps it)."""
    import torch
    import torch.nn.functional as F

    rows = x.reshape(-1, x.shape[-1]).to(torch.float16).to(torch.float32)
    count = rows.shape[0]
    if count < MIN_ROWS:
        rows = torch.cat([rows, rows.new_zeros(MIN_ROWS - count, rows.shape[1])])
    with torch.autocast("cpu", enabled=False):
        out = F.linear(
            rows,
            widened(weight) if wide is None else wide,
            None if bias is None else widened(bias),
        )
    return out[:count].to(torch.float16).reshape(*x.shape[:-1], out.shape[-1])


@functools.cache
def _linear_class() -> type:
    # Built on first use, so importing this module does not import torch.
    import torch

    class Float16Linear(torch.nn.Linear):
        """A ``torch.nn.Linear`` whose float16 product on CPU runs in float32 (module
        docstring); any other dtype, device or a recorded gradient runs ``nn.Linear``'s own.

        It keeps the widened weight (4 bytes per parameter) while the weight is unchanged
        (same storage, same version counter): widening it again at every decode step cost as
        much as the float16 kernel saved.
        """

        _wide: tuple[tuple[int, int], Any] | None = None

        def forward(self, input: Any) -> Any:
            weight = self.weight
            if (
                weight.dtype != torch.float16
                or weight.device.type != "cpu"
                or input.dtype != torch.float16
                or _recording(input, weight, self.bias)
            ):
                return super().forward(input)
            stamp = (weight.data_ptr(), weight._version)
            if self._wide is None or self._wide[0] != stamp:
                self._wide = (stamp, widened(weight))
            return _linear(input, weight, self.bias, self._wide[1])

    return Float16Linear


def __getattr__(name: str) -> Any:
    """``Float16Linear``: the layer class, built on first use."""
    if name == "Float16Linear":
        return _linear_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def widen_float16_linears(model: Any) -> int:
    """Make every plain ``torch.nn.Linear`` of ``model`` (on CPU, weights in float16) a
    :class:`Float16Linear`, in place; returns how many. Subclasses of ``nn.Linear`` (LoRA
    layers, quantised layers) are left alone: their forward is their own."""
    import torch

    layer = _linear_class()
    count = 0
    for module in model.modules():
        if (
            type(module) is torch.nn.Linear
            and module.weight.dtype == torch.float16
            and module.weight.device.type == "cpu"
        ):
            module.__class__ = layer
            count += 1
    return count


@functools.cache
def _mode_class() -> type:
    from torch.overrides import TorchFunctionMode

    class Float16AutocastLinears(TorchFunctionMode):
        """Under CPU float16 autocast, ``F.linear`` as :func:`_linear` computes it."""

        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            import torch
            import torch.nn.functional as F

            kwargs = kwargs or {}
            if func is F.linear and torch.is_autocast_enabled("cpu"):
                x, weight, *rest = args
                bias = rest[0] if rest else kwargs.get("bias")
                if (
                    torch.get_autocast_dtype("cpu") == torch.float16
                    and x.device.type == "cpu"
                    and {x.dtype, weight.dtype} <= {torch.float16, torch.float32}
                    and not _recording(x, weight, bias)
                ):
                    return _linear(x, weight, bias)
            return func(*args, **kwargs)

    return Float16AutocastLinears


@contextlib.contextmanager
def float16_autocast_linears() -> Iterator[None]:
    """While open, CPU float16 autocast runs ``F.linear`` as :func:`_linear` does (inference
    only; see the module docstring)."""
    with _mode_class()():
        yield
