"""The probe's embedded default model: a small Llama built deterministically in code.

No download and no network: the weights come from a fixed seed, and the tokenizer is a byte-level
tokenizer (256 byte tokens plus ``<pad>``, ``<bos>``, ``<eos>``) made with ``tokenizers``.

A random-init model's next-token distribution is nearly flat (no sampled token above
probability ~0.05), unlike any trained LM, whose sampled tokens usually carry most of the mass.
The mismatch depends on that shape (a flat distribution hides it), so the output projection is
scaled by :data:`LOGIT_SCALE` after the random init: the logits get a spread like a trained LM's
(standard deviation ~5 over the vocabulary) and the distribution is peaked by construction. On the
probe's prompts the median sampled token has probability ~0.45 and ~60 % of sampled tokens have
p > 0.3 (``tests/unit/test_tiny_model.py`` checks the shape).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Name the probe reports for the embedded model.
DEFAULT_MODEL_NAME = "embedded:tiny-llama-4x256"

#: Seed that fixes the default model's weights.
DEFAULT_SEED = 1234

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"

#: Factor on the output projection (``lm_head``) after the random init: the final logit scale
#: that gives the default model a peaked next-token distribution (see the module docstring).
LOGIT_SCALE = 6.0

#: Architecture of the default model: 4 layers, hidden 256, 3.3 M parameters.
DEFAULT_CONFIG: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    # Wider than HF's 0.02 default: less uniform next-token distributions, and the mismatch
    # lands at the order of magnitude of the reference run (fp16 k3 ~1e-6, bf16 ~1e-4).
    "initializer_range": 0.05,
    "tie_word_embeddings": False,
}


def build_tokenizer() -> Any:
    """Return the byte-level ``PreTrainedTokenizerFast`` of the default model (259 tokens).

    Ids 0, 1, 2 are ``<pad>``, ``<bos>``, ``<eos>``; ids 3..258 are the 256 bytes, so any text
    round-trips and no ordinary text ever encodes to the pad id.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for i, char in enumerate(sorted(alphabet)):
        vocab[char] = 3 + i
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
        model_max_length=DEFAULT_CONFIG["max_position_embeddings"],
    )


def build_default_model(seed: int = DEFAULT_SEED) -> tuple[Any, Any]:
    """Return ``(model, tokenizer)``: the default Llama in float32, in eval mode.

    The weights depend only on ``seed`` (the global torch RNG is left untouched), so every call
    returns bit-identical weights.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **DEFAULT_CONFIG,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    model = model.to(torch.float32).eval()
    return model, tokenizer


def save_default_model(path: str | Path, seed: int = DEFAULT_SEED) -> Path:
    """Save the default model and its tokenizer to ``path`` (a normal HF checkpoint folder).

    Returns the folder; ``precision-plugin probe --model PATH`` and ``from_pretrained`` read it.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = build_default_model(seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
