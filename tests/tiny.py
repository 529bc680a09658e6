"""Tiny, seeded causal LMs built in code for the tests (nothing is downloaded)."""

from __future__ import annotations

from typing import Any

import torch


def tiny_llama(**overrides: Any) -> Any:
    """A 1-layer Llama (hidden 32, vocab 64) with seed-0 weights; ``overrides`` go to the config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    settings: dict[str, Any] = {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
    }
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**settings, **overrides}))


#: The module :func:`overflowing_llama` pushes past float16's range.
OVERFLOW_MODULE = "model.layers.1.mlp.down_proj"


def overflowing_llama(target: float = 1e6, layers: int = 2) -> Any:
    """A :func:`tiny_llama` with ``layers`` layers whose layer-1 MLP outputs up to ``target``
    (float32) on :func:`sample_ids`: gate/up projections scaled by 300, then down_proj scaled to
    hit the target (so no weight itself leaves float16's range). With the default target, an
    fp16 forward of :data:`OVERFLOW_MODULE` overflows."""
    from precision_plugin._core.overflow import headroom

    model = tiny_llama(num_hidden_layers=layers)
    mlp = model.get_submodule("model.layers.1.mlp")
    with torch.no_grad():
        mlp.gate_proj.weight.mul_(300)
        mlp.up_proj.weight.mul_(300)
    measured = {m.path: m.max_abs for m in headroom(model, sample_ids(), margin_bits=3).modules}
    with torch.no_grad():
        model.get_submodule(OVERFLOW_MODULE).weight.mul_(target / measured[OVERFLOW_MODULE])
    return model


def sample_ids(seed: int = 1, batch: int = 2, length: int = 16) -> torch.Tensor:
    """Seeded random token ids for :func:`tiny_llama` (vocab 64)."""
    return torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(seed))
