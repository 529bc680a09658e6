"""Save a small random-init Qwen2-architecture checkpoint (bf16 weights, byte tokenizer) locally.

No download: the weights come from a fixed seed, the tokenizer is the probe's byte tokenizer.
    python -m tests.gpu.make_qwen2 OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path


def save_tiny_qwen2(path: str | Path, seed: int = 1234) -> Path:
    """Write a 4-layer Qwen2 (hidden 512, head_dim 64, GQA 8/2) stored in bfloat16 to ``path``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from precision_plugin.probe.tiny_model import build_tokenizer

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(save_tiny_qwen2(sys.argv[1]))
