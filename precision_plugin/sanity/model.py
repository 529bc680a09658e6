"""The sanity model: a small Llama and a character tokenizer for a task, built in code.

Nothing is downloaded: the tokenizer has one token per task letter and the separator, plus
``<pad>``, ``<bos>`` and ``<eos>``, and the weights come from a fixed seed (the global RNG is
untouched).
"""

from __future__ import annotations

from typing import Any

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.sanity.task import REVERSE, Task

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"

#: ``--model-size`` choices -> Llama dimensions (hidden, intermediate, layers, heads).
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
             "num_attention_heads": 4},
    "small": {"hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 3,
              "num_attention_heads": 4},
    "base": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
             "num_attention_heads": 4},
}  # fmt: skip
DEFAULT_SIZE = "small"


def build_tokenizer(task: Task = REVERSE) -> Any:
    """A character-level ``PreTrainedTokenizerFast``: ids 0-2 special, then ``task.vocabulary``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, BOS: 1, EOS: 2, **{c: i + 3 for i, c in enumerate(task.vocabulary)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()  # "cba", not "c b a"
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
        model_max_length=task.max_positions,
    )


def build_model(size: str = DEFAULT_SIZE, seed: int = 0, task: Task = REVERSE) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a float32 Llama of ``size`` for ``task``, weights from ``seed``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if size not in MODEL_SIZES:
        raise PrecisionConfigError(
            f"--model-size: {size!r} is not a sanity model size; use one of "
            f"{', '.join(MODEL_SIZES)}."
        )
    dims = MODEL_SIZES[size]
    tokenizer = build_tokenizer(task)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        num_key_value_heads=dims["num_attention_heads"],
        max_position_embeddings=max(64, task.max_positions),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        **dims,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(torch.float32), tokenizer


def parameter_count(model: Any) -> int:
    """Number of parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())
