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
