"""Linear layers with weights prepacked for oneDNN (``precision_plugin._core.scoring.packed_cpu``): the
same product as ``F.linear`` (bit for bit in bfloat16, within float32's rounding in float32), a
row's value independent of the rows beside it, and ``nn.Linear``'s own forward wherever the
fast path does not apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from precision_plugin._core.scoring import packed_cpu
from precision_plugin._core.scoring.packed_cpu import pack_linears, rows_for

pytestmark = pytest.mark.skipif(
    packed_cpu.pack(torch.zeros(2, 2)) is None, reason="this PyTorch has no oneDNN linear"
)


def _layer(dtype: torch.dtype, features: tuple[int, int] = (96, 200)) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(*features).to(dtype).eval()


@pytest.mark.parametrize("features", [(96, 200), (1536, 576), (576, 1536)])
def test_a_packed_float32_product_is_f_linear_to_float32_rounding(features) -> None:
    layer = _layer(torch.float32, features)
    x = torch.randn(8, features[0], generator=torch.Generator().manual_seed(1))
    expected = F.linear(x.double(), layer.weight.double(), layer.bias.double())
    assert pack_linears(layer) == 1 and type(layer).__name__ == "PackedLinear"
    with torch.inference_mode():
        out = layer(x)
    assert out.dtype == torch.float32
    # Each of the 8 x out values is a sum of `in` float32 products: within a few float32
    # roundings of the exact (float64) sum, scaled by the sum of the products' magnitudes.
    bound = (x.double().abs() @ layer.weight.double().abs().T) * features[0] * 2**-24
    assert ((out.double() - expected).abs() <= bound + 1e-6).all()


def test_a_rows_value_does_not_depend_on_the_rows_beside_it() -> None:
    layer = _layer(torch.float32, (1536, 576))  # the shape that needs padding on older CPUs
    pack_linears(layer)
    x = torch.randn(40, 1536, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        full = layer(x)
        for count in (1, 2, 3, 7, 8, 16, 17, 33):
            assert torch.equal(layer(x[:count]), full[:count]), count
        assert torch.equal(layer(x[:5, None, :]), full[:5, None, :])  # [batch, 1, in] too
    assert rows_for(1536, 576, torch.float32) in (1, 16)


def test_bfloat16_packed_is_f_linear_bit_for_bit_where_the_cpu_packs_it() -> None:
    layer = _layer(torch.bfloat16)
    x = torch.randn(8, 96, generator=torch.Generator().manual_seed(3)).bfloat16()
    with torch.inference_mode():
        expected = F.linear(x, layer.weight, layer.bias)
        pack_linears(layer)
        out = layer(x)
    assert torch.equal(out, expected)  # packed or not (a CPU without AVX512-BW: F.linear)


def test_outside_inference_it_is_nn_linear() -> None:
    layer = _layer(torch.float32)
    pack_linears(layer)
    x = torch.randn(4, 96, requires_grad=True)
    out = layer(x)  # a recorded gradient: nn.Linear's own forward, and its gradient flows
    assert torch.equal(out, F.linear(x, layer.weight, layer.bias))
    out.sum().backward()
    assert x.grad is not None and layer._packed is None
    # another input dtype: nn.Linear's own forward (which refuses it)
    with torch.inference_mode(), pytest.raises(RuntimeError):
        layer(x.detach().double())


def test_a_weight_changed_in_place_is_packed_again() -> None:
    layer = _layer(torch.float32)
    pack_linears(layer)
    x = torch.randn(3, 96)
    with torch.inference_mode():
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)  # a rollout copy synced in place
    with torch.inference_mode():
        after = layer(x)
    assert not torch.equal(after, before)
    assert torch.allclose(after - layer.bias, 2 * (before - layer.bias), rtol=1e-5, atol=1e-5)


def test_only_plain_float32_and_bfloat16_cpu_linears_are_packed() -> None:
    class Lora(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4), Lora(4, 4), torch.nn.Linear(4, 4).half(),
        torch.nn.Linear(4, 4).bfloat16(), torch.nn.Linear(4, 4).double(),
    )  # fmt: skip
    assert pack_linears(model) == 2
    assert [type(m).__name__ for m in model] == [
        "PackedLinear", "Lora", "Linear", "PackedLinear", "Linear"
    ]  # fmt: skip
    assert set(model.state_dict()) == {f"{i}.{p}" for i in range(5) for p in ("weight", "bias")}


def test_trainer_kernels_multiply_as_the_trainer_does() -> None:
    """Inside ``trainer_kernels`` a packed float32 layer is ``F.linear`` bit for bit, and a
    float16 rollout layer is what the trainer's float16 autocast computes from the float32
    master weights (40 rows; outside, the packed product sums in its own order)."""
    import copy

    from precision_plugin._core.scoring import trainer_precision
    from precision_plugin._core.scoring.float16_cpu import widen_float16_linears
    from precision_plugin._core.scoring.packed_cpu import trainer_kernels

    layer = _layer(torch.float32, (576, 192))
    pack_linears(layer)
    x = torch.randn(40, 576, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        with trainer_kernels():
            assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
        assert layer._packed is None  # nothing was packed inside
        layer(x)
        assert layer._packed is not None
    master = _layer(torch.float32, (96, 200))
    rollout = copy.deepcopy(master).half()
    widen_float16_linears(rollout)
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        with trainer_precision("float16", "cpu"):
            expected = master(x)
        with trainer_kernels():
            out = rollout(x.half())
    assert out.dtype == torch.float16 and torch.equal(out, expected)


class _StorageReadingMode(TorchDispatchMode):
    """Reads every output's storage, as a memory tracker does: oneDNN's opaque packed tensor
    has none, so a pack run under this mode raises."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                tensor.untyped_storage()
        return out


def test_a_callers_dispatch_mode_does_not_turn_packing_off() -> None:
    """A layer first run under the caller's dispatch mode still packs, multiplies as the same
    layer run without it, bit for bit, and leaves the process-wide kernel check intact (a shape
    no other test uses, so the check runs under the mode)."""
    features = (48, 112)
    x = torch.randn(5, features[0], generator=torch.Generator().manual_seed(4))
    plain = _layer(torch.float32, features)
    pack_linears(plain)
    watched = _layer(torch.float32, features)
    pack_linears(watched)
    with torch.inference_mode():
        with _StorageReadingMode():
            out = watched(x)
        expected = plain(x)
    assert watched._packed is not None and watched._packed[1] is not None
    assert rows_for(*features, torch.float32) in (1, 16)
    assert torch.equal(out, expected)
