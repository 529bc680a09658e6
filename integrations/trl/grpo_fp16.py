"""GRPO in consistent FP16 with precision_plugin: a runnable recipe (CPU is enough).

    python integrations/trl/grpo_fp16.py --max-steps 3

Everything is built in code (a tiny Llama, a character tokenizer, a toy prompt set and reward),
so nothing is downloaded. For a real run, replace ``build_model_and_tokenizer`` with
``from_pretrained`` (load in float32: the plugin keeps master weights fp32 and autocast computes
in fp16) and set ``use_vllm=True``; ``precision_plugin.enable()`` then also starts vLLM in fp16.
Prints one JSON line with the loss scale and what ran.
"""

from __future__ import annotations

import argparse
import json
import string
import tempfile
from typing import Any

import torch

import precision_plugin as pp
from precision_plugin import PrecisionCallback

ALPHABET = string.ascii_lowercase + " "


def build_model_and_tokenizer(seed: int = 0) -> tuple[Any, Any]:
    """A 1-layer Llama and a character-level tokenizer, built in code."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, **{c: i + 3 for i, c in enumerate(ALPHABET)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(config), tokenizer


def reward_vowels(completions: list[str], **_: Any) -> list[float]:
    """Toy reward: the share of vowels in the completion."""
    return [sum(c in "aeiou" for c in text) / max(len(text), 1) for text in completions]


def build_trainer(output_dir: str, max_steps: int = 3, **config: Any) -> Any:
    """A ``GRPOTrainer`` on the toy task with ``PrecisionCallback`` (call after ``enable()``)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = build_model_and_tokenizer()
    prompts = ["say a word", "abc", "hello there", "count to two"] * 4
    args = GRPOConfig(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        use_vllm=False,
        **config,
    )  # fp16/bf16 left unset: the policy decides (TRL alone would pick bf16)
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_vowels,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        callbacks=[PrecisionCallback()],
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train a few GRPO steps in fp16 and return (and print) what ran."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--output-dir", default=None)
    options = parser.parse_args(argv)
    pp.enable()  # FP16 on both sides, loss scaler from the policy
    try:
        trainer = build_trainer(options.output_dir or tempfile.mkdtemp(), options.max_steps)
        trainer.train()
        last = next(h for h in reversed(trainer.state.log_history) if "precision/loss_scale" in h)
        callback = next(
            c for c in trainer.callback_handler.callbacks if isinstance(c, PrecisionCallback)
        )
        report = {
            "fp16": trainer.args.fp16,
            "bf16": trainer.args.bf16,
            "forward_dtype": str(callback.forward_dtype).removeprefix("torch."),
            "loss_scale": last["precision/loss_scale"],
            "skipped_steps": last["precision/skipped_steps"],
            "steps": trainer.state.global_step,
        }
    finally:
        pp.disable()
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
