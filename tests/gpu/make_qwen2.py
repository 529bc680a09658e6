"""Save a random-init Qwen2-architecture checkpoint (bf16 weights, byte tokenizer) locally.

No download: the weights come from a fixed seed, the tokenizer is the probe's byte tokenizer.
    python -m tests.gpu.make_qwen2 OUT_DIR                      # 4 layers, hidden 512
    python -m tests.gpu.make_qwen2 OUT_DIR --shape qwen2.5-1.5b  # Qwen2.5-1.5B's shape, 1.5 B
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


#: Qwen2.5-1.5B's architecture (its config.json), with random weights.
QWEN25_1P5B: dict[str, object] = {
    "vocab_size": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def wide_tokenizer(vocab_size: int) -> object:
    """The byte tokenizer with placeholder tokens up to ``vocab_size`` entries, so every id a
    large-vocabulary model samples decodes (vLLM detokenizes); text still encodes to bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from precision_plugin.probe.tiny_model import BOS, EOS, PAD

    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<t{len(vocab)}>"] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, padding_side="left"
    )


def save_qwen25_shaped(path: str | Path, seed: int = 1234) -> Path:
    """Write a random-init model of Qwen2.5-1.5B's shape, stored in bfloat16, to ``path``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = wide_tokenizer(int(QWEN25_1P5B["vocab_size"]))  # type: ignore[call-overload]
    config = Qwen2Config(
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        **QWEN25_1P5B,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)  # type: ignore[attr-defined]
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--shape" in args:
        shape = args[args.index("--shape") + 1]
        if shape != "qwen2.5-1.5b":
            sys.exit(f"make_qwen2: unknown --shape {shape!r}; known: qwen2.5-1.5b")
        print(save_qwen25_shaped(args[0]))
    else:
        print(save_tiny_qwen2(args[0]))
