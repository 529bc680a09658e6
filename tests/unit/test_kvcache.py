"""The preallocated KV cache computes what transformers' own DynamicCache computes, bit for bit."""

from __future__ import annotations

import pytest
import torch

from precision_plugin._core.scoring.kvcache import PreallocatedLayer, preallocated_cache

pytestmark = pytest.mark.skipif(PreallocatedLayer is None, reason="transformers < 4.56")


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         pad_token_id=0)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _decode(model: torch.nn.Module, cache: object, steps: int) -> list[torch.Tensor]:
    """Left-padded prompts, then ``steps`` teacher-forced tokens one at a time."""
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    name = "cache" if "cache" in model.forward.__code__.co_varnames else "past_key_values"
    extra = {name: cache} if cache is not None else {}
    logits = []
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                    **extra)  # fmt: skip
        logits.append(out.logits[:, -1])
        position = positions[:, -1:]
        for t in range(steps):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            position = position + 1
            token = torch.tensor([[13 + t], [20 + t]])
            out = model(input_ids=token, attention_mask=mask, position_ids=position,
                        use_cache=True, **{name: out[name]})  # fmt: skip
            logits.append(out.logits[:, -1])
    return logits


@pytest.mark.parametrize("capacity", [5 + 12, 6])  # sized for the run; too small (grows)
def test_decoding_with_it_gives_the_dynamic_caches_logits_bit_for_bit(capacity: int) -> None:
    model = _model()
    cache = preallocated_cache(model, capacity)
    assert all(type(layer) is PreallocatedLayer for layer in cache.layers)
    ours = _decode(model, cache, 12)
    theirs = _decode(model, None, 12)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert cache.get_seq_length() == 5 + 12


def test_a_layer_hands_out_views_of_the_filled_part() -> None:
    layer = PreallocatedLayer(8)
    k, v = layer.update(torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    assert k.shape == v.shape == (1, 2, 3, 4) and layer.get_seq_length() == 3
    k, _ = layer.update(torch.full((1, 2, 1, 4), 2.0), torch.zeros(1, 2, 1, 4))
    assert k.shape == (1, 2, 4, 4) and k[0, 0, :, 0].tolist() == [1.0, 1.0, 1.0, 2.0]
