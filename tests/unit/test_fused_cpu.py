"""Layers that read one input, multiplied as one packed product
(``precision_plugin._core.scoring.fused_cpu``): the groups are the layers that really share an input
(query/key/value, gate/up; never the output or down projection), the rollout is the same bit for
bit with and without them, weights synced in place are packed again, and a member called with
another input still gets its own product."""

from __future__ import annotations

import pytest
import torch

from precision_plugin._core.hf_engine import HFRolloutEngine
from precision_plugin._core.scoring import fused_cpu, packed_cpu
from tests.tiny import tiny_llama

pytestmark = pytest.mark.skipif(
    packed_cpu.pack(torch.zeros(2, 2)) is None, reason="this PyTorch has no oneDNN linear"
)

DTYPES = ["float32", "float16", "bfloat16"]
PROMPTS = [[1, 5, 9, 2], [3, 3], [7, 8, 9, 10, 11, 12], [4]]


def _engine(dtype: str, fuse: bool) -> HFRolloutEngine:
    # Grouped-query attention (4 query heads on 2 key/value heads), two layers.
    model = tiny_llama(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    engine = HFRolloutEngine(model, dtype, "cpu")
    if not fuse:
        engine.model._precision_plugin_fused = True  # as if traced already: no groups
    return engine


def _groups(model: torch.nn.Module) -> list[list[str]]:
    names = {module: name for name, module in model.named_modules()}
    seen: dict[int, list[str]] = {}
    for module in model.modules():
        group = getattr(module, "_shared", None)
        if group is not None:
            seen[id(group)] = [names[m] for m in group.members]
    return sorted(seen.values())


def _rollout(engine: HFRolloutEngine) -> tuple[list[list[int]], list[list[float]]]:
    samples = engine.generate(PROMPTS, 12, 3, min_new_tokens=12, budgets=[12, 3, 7, 12])
    return [s.completion_ids for s in samples], [s.logprobs for s in samples]


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_rollout_is_the_same_bit_for_bit_with_the_layers_fused(dtype) -> None:
    fused, plain = _engine(dtype, True), _engine(dtype, False)
    expected = _rollout(plain)
    assert _rollout(fused) == expected
    assert _rollout(fused) == expected  # a second generate reuses the groups
    if fused_cpu.fusable(32, (32, 16, 16), getattr(torch, dtype), False):
        # Found from what each layer read in the first forward, not from layer names.
        assert _groups(fused.model) == sorted(
            [[f"model.layers.{i}.mlp.{p}_proj" for p in ("gate", "up")] for i in (0, 1)]
            + [[f"model.layers.{i}.self_attn.{p}_proj" for p in "qkv"] for i in (0, 1)]
        )
        members = [m for m in fused.model.modules() if getattr(m, "_shared", None) is not None]
        # The group's stacked weight replaces each member's own packed copy.
        assert all(
            getattr(m, "_packed", None) is None and getattr(m, "_wide", None) is None
            for m in members
        )
    assert _groups(plain.model) == []


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_weights_synced_in_place_are_packed_again(dtype) -> None:
    fused, plain = _engine(dtype, True), _engine(dtype, False)
    _rollout(fused), _rollout(plain)
    for engine in (fused, plain):
        with torch.no_grad():
            for name, param in engine.model.named_parameters():
                if name.endswith(("k_proj.weight", "up_proj.weight")):
                    param.mul_(1.5)  # an optimiser step's in-place update
    assert _rollout(fused) == _rollout(plain)


def test_a_member_called_with_another_input_gets_its_own_product() -> None:
    engine = _engine("float32", True)
    _rollout(engine)
    attention = engine.model.model.layers[0].self_attn
    if getattr(attention.k_proj, "_shared", None) is None:
        pytest.skip("this CPU's kernel does not fuse these shapes")
    generator = torch.Generator().manual_seed(4)
    x, y = torch.randn(3, 32, generator=generator), torch.randn(3, 32, generator=generator)
    with torch.inference_mode():
        attention.q_proj(x)  # keeps k's and v's products of x
        k_of_y = attention.k_proj(y)  # another input: computed, not the kept one
        v_of_x = attention.v_proj(x)
    group = attention.k_proj._shared
    alone = [packed_cpu.packed_weight(m.weight.detach()) for m in group.members]
    assert torch.equal(k_of_y, packed_cpu.packed_product(y, *alone[1][:1], None, alone[1][1]))
    assert torch.equal(v_of_x, packed_cpu.packed_product(x, *alone[2][:1], None, alone[2][1]))


def test_no_group_where_the_stacked_product_would_differ(monkeypatch) -> None:
    monkeypatch.setattr(fused_cpu, "fusable", lambda *args: False)
    engine = _engine("float32", True)
    _rollout(engine)
    assert _groups(engine.model) == []


def test_gradients_run_each_layers_own_forward() -> None:
    engine = _engine("float32", True)
    _rollout(engine)
    attention = engine.model.model.layers[0].self_attn
    for param in attention.parameters():
        param.requires_grad_(True)
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(5))
    out = attention.k_proj(x)
    assert out.grad_fn is not None  # nn.Linear's own forward, recorded
    out.sum().backward()
    assert attention.k_proj.weight.grad is not None
