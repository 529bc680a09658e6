"""GRPO in consistent FP16 with precision_plugin: a runnable recipe (CPU is enough).

    python integrations/trl/grpo_fp16.py --max-steps 3
    python integrations/trl/grpo_fp16.py --max-steps 3 --dtype bfloat16   # same seed, bf16
    python integrations/trl/grpo_fp16.py --max-steps 3 --entry callback   # PrecisionCallback alone

By default everything is built in code (a tiny Llama, a character tokenizer, a toy prompt set
and reward), so nothing is downloaded, and rollouts come from ``HFRollout`` (the plugin's HF
engine, an inference copy of the policy in the policy dtype). Each step prints the
train/rollout mismatch the plugin logs (``precision/k3_kl``, ...), then the asked-vs-ran table
and one JSON line with the loss scale, what ran and the mean mismatch (``--json FILE`` also
writes all of it, with the command that produced it). ``--entry callback`` uses
``PrecisionCallback(dtype)`` without ``enable()``: the flags are set by hand, and on a CPU the
learner then runs float32 (Accelerate has no fp16 there), which the callback reports.
``--model PATH`` trains a local checkpoint (loaded in float32: the plugin keeps master weights
fp32 and autocast computes in the policy dtype); ``--rollout vllm-colocate`` / ``--rollout
vllm-server`` sample with vLLM instead (GPU; the plugin starts a colocated engine in the policy
dtype; a server must run with ``PRECISION_PLUGIN=<dtype>``).
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


def load_checkpoint(path: str) -> tuple[Any, Any]:
    """A local causal-LM checkpoint in float32 (master weights) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def build_trainer(
    output_dir: str,
    max_steps: int = 3,
    *,
    rollout: str = "hf",
    model_path: str | None = None,
    model: Any = None,
    rollout_func: Any = None,
    peft_config: Any = None,
    seed: int = 0,
    callback: Any = None,
    **config: Any,
) -> Any:
    """A ``GRPOTrainer`` on the toy task with ``callback`` (default ``PrecisionCallback()``,
    whose policy comes from ``enable()``).

    ``rollout`` is ``hf`` (``HFRollout``), ``trl`` (TRL's own generate: no rollout log-probs,
    so no mismatch metrics), ``vllm-colocate`` or ``vllm-server``; ``rollout_func`` replaces
    it. ``model`` (with the recipe's tokenizer) or ``model_path`` replace the built-in model;
    ``config`` goes to ``GRPOConfig``.
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from precision_plugin.trl import HFRollout

    if model_path:
        model, tokenizer = load_checkpoint(model_path)
    else:
        built, tokenizer = build_model_and_tokenizer()
        model = built if model is None else model
    if rollout_func is None and rollout == "hf":
        rollout_func = HFRollout()
    if rollout.startswith("vllm"):
        config.update(use_vllm=True, vllm_mode=rollout.removeprefix("vllm-"))
    prompts = ["say a word", "abc", "hello there", "count to two"] * 4
    settings: dict[str, Any] = {
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 8,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": not torch.cuda.is_available(),
        "use_vllm": False,
    }
    args = GRPOConfig(
        output_dir=output_dir, max_steps=max_steps, seed=seed, **{**settings, **config}
    )  # fp16/bf16 left unset: the policy decides (TRL alone would pick bf16)
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_vowels,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        callbacks=[callback or PrecisionCallback()],
        rollout_func=rollout_func,
        peft_config=peft_config,
    )


MISMATCH = ("k3_kl", "k1_kl", "prob_diff_mean", "prob_diff_max", "tokens")


def mismatch_rows(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The per-step ``precision/*`` mismatch metrics of a run's log history."""
    return [
        {"step": h["step"], **{k: h[f"precision/{k}"] for k in MISMATCH}}
        for h in log_history
        if "precision/k3_kl" in h
    ]


def step_line(row: dict[str, float]) -> str:
    """One printed line of per-step mismatch."""
    return (
        f"step {row['step']:>3}  k3_kl {row['k3_kl']:.3e}  k1_kl {row['k1_kl']:+.3e}  "
        f"prob_diff_mean {row['prob_diff_mean']:.3e}  tokens {row['tokens']:.0f}"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train a few GRPO steps in the policy dtype and return (and print) what ran."""
    import sys

    from precision_plugin.audit import render
    from precision_plugin.provenance import write_results
    from precision_plugin.trl import HFRollout

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="a local checkpoint (default: built in code)")
    parser.add_argument(
        "--rollout", choices=["hf", "trl", "vllm-colocate", "vllm-server"], default="hf"
    )
    parser.add_argument(
        "--entry",
        choices=["enable", "callback"],
        default="enable",
        help="enable(): the one line; callback: PrecisionCallback(dtype) alone, flags by hand",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    options = parser.parse_args(argv)
    entry: dict[str, Any] = {}
    if options.entry == "enable":
        pp.enable(dtype=options.dtype)  # one dtype on both sides, loss scaler for float16
    else:  # without enable(): the callback and the rollout get the dtype, the flags by hand
        entry = {
            "callback": PrecisionCallback(options.dtype),
            "fp16": options.dtype == "float16",
            "bf16": options.dtype == "bfloat16",
        }
        if options.rollout == "hf":
            entry["rollout_func"] = HFRollout(options.dtype)
    try:
        trainer = build_trainer(
            options.output_dir or tempfile.mkdtemp(),
            options.max_steps,
            rollout=options.rollout,
            model_path=options.model,
            seed=options.seed,
            **entry,
        )
        trainer.train()
        history = trainer.state.log_history
        last = next((h for h in reversed(history) if "precision/loss_scale" in h), {})
        callback = next(
            c for c in trainer.callback_handler.callbacks if isinstance(c, PrecisionCallback)
        )
        rows = mismatch_rows(history)
        audit = callback.audit()
        report = {
            "entry": options.entry,
            "dtype": options.dtype,
            "fp16": trainer.args.fp16,
            "bf16": trainer.args.bf16,
            "forward_dtype": str(callback.forward_dtype).removeprefix("torch."),
            "rollout_dtype": audit["rollout"]["dtype"],
            "loss_scale": last.get("precision/loss_scale"),
            "skipped_steps": last.get("precision/skipped_steps"),
            "steps": trainer.state.global_step,
            "mismatch_steps": len(rows),
            "mean_k3_kl": sum(r["k3_kl"] for r in rows) / len(rows) if rows else None,
        }
    finally:
        pp.disable()
    for row in rows:
        print(step_line(row))
    print(render(audit, "asked vs ran"), end="")
    print(json.dumps(report))
    if options.json:
        words = sys.argv[1:] if argv is None else argv
        command = ["python", "integrations/trl/grpo_fp16.py", *words]
        write_results(options.json, {"report": report, "steps": rows, "audit": audit}, command)
    return report


if __name__ == "__main__":
    main()
