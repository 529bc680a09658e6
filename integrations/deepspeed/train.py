"""A tiny HF Trainer run under DeepSpeed with precision_plugin (in-code model, no downloads).

    python integrations/deepspeed/train.py --deepspeed integrations/deepspeed/zero2_fp16.json
    python integrations/deepspeed/train.py --deepspeed integrations/deepspeed/zero2_bf16.json
    python integrations/deepspeed/train.py --deepspeed FILE.json --dtype bfloat16
    torchrun --nproc_per_node 2 integrations/deepspeed/train.py --deepspeed FILE.json

The precision policy is the DeepSpeed file's ``"precision_plugin"`` section (or
``PRECISION_PLUGIN`` when set), so one file decides the dtype of the whole run: the script
enables that policy before the Trainer is built, and the plugin writes DeepSpeed's
``fp16``/``bf16`` settings from it. ``--dtype`` sets the section's dtype, so both sides change
together. Run with plain ``python``, the script sets up a one-process world itself (DeepSpeed
would otherwise look for MPI). Prints one JSON line with what ran.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
from pathlib import Path

import torch

import precision_plugin as pp
from precision_plugin._base import userfiles
from precision_plugin.cli.argtypes import positive_int
from precision_plugin.deepspeed import config_policy, engine_dtype, engine_scaler_stats


def one_process_world() -> None:
    """Rank variables of a one-process world on loopback, unless a launcher already set them."""
    if "RANK" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
        | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )


class RandomTokens(torch.utils.data.Dataset):
    """Fixed pseudo-random token sequences (language-model targets = inputs)."""

    def __init__(self, size: int, length: int, vocab: int) -> None:
        self.size, self.length, self.vocab = size, length, vocab

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.length,), generator=generator)
        return {"input_ids": ids, "labels": ids.clone()}


def tiny_llama() -> torch.nn.Module:
    """A 2-layer Llama with a 128-token vocabulary, random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def main() -> None:
    """Train the tiny model for ``--max-steps`` steps and print what ran."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deepspeed", required=True, help="DeepSpeed config (JSON file)")
    parser.add_argument(
        "--dtype",
        choices=["float16", "bfloat16", "float32"],
        help="override the file's precision_plugin.dtype (the policy follows it)",
    )
    parser.add_argument("--max-steps", type=positive_int, default=5)
    parser.add_argument("--batch-size", type=positive_int, default=2, help="per device")
    parser.add_argument("--output-dir", default=None, help="default: a temporary folder")
    options = parser.parse_args()

    one_process_world()
    # The one reader: a regular JSON file within the size limit, every failure in one line.
    config = userfiles.read_json(options.deepspeed, "--deepspeed (the DeepSpeed config)")
    if not isinstance(config, dict):
        parser.error(f"--deepspeed: {options.deepspeed!r} holds no JSON object")
    if options.dtype:
        config["precision_plugin"] = {**config.get("precision_plugin", {}), "dtype": options.dtype}
    policy = pp.enable(config_policy(config))
    from transformers import Trainer, TrainingArguments

    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(
            output_dir=options.output_dir or scratch,
            deepspeed=config,
            per_device_train_batch_size=options.batch_size,
            max_steps=options.max_steps,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            use_cpu=not torch.cuda.is_available(),  # HF refuses bf16 on CPU without it
        )
        model = tiny_llama()
        seen: list[torch.dtype] = []
        model.model.layers[0].mlp.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=RandomTokens(64, 16, model.config.vocab_size),
            callbacks=[pp.PrecisionCallback(policy)],
        )
        result = trainer.train()
    engine = trainer.model_wrapped
    stats = engine_scaler_stats(engine)
    ds = engine.config if isinstance(engine.config, dict) else {}
    report = {
        "policy_dtype": policy.dtype,
        "engine_dtype": engine_dtype(engine),  # float32 where DeepSpeed refuses the policy's
        "deepspeed_fp16": bool(ds.get("fp16", {}).get("enabled")),
        "deepspeed_bf16": bool(ds.get("bf16", {}).get("enabled")),
        "forward_dtype": str(seen[-1]).removeprefix("torch."),
        "zero_stage": engine.zero_optimization_stage(),
        "loss_scale": stats.scale if stats else None,
        "steps": result.global_step,
        "skipped_steps": stats.skipped_steps if stats else 0,
        "train_loss": round(result.training_loss, 4),
    }
    if trainer.is_world_process_zero():
        print(json.dumps(report))


if __name__ == "__main__":
    try:
        main()
    except pp.PrecisionPluginError as stop:  # a strict stop: its one line, not a traceback
        raise SystemExit(f"{Path(__file__).name}: stopped: {stop}") from None
