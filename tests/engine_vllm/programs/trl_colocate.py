"""TRL's GRPOTrainer with ``use_vllm=True, vllm_mode="colocate"`` on a live in-process vLLM
engine, after ``precision_plugin.enable()``: the recipe's trainer (integrations/trl/grpo_fp16.py)
on a checkpoint folder.

``trl_colocate.py CONFIG`` (JSON): ``model``, ``recipe`` (the recipe's path), ``dtype``,
``steps``, ``learning_rate``, ``keep`` (policy ``vllm.cpu_keep_weights``), ``linear_only``
(true: before anything, Linear layers keep their weights and the LM head stays prepacked: what a
user who fixes only the crash gets). Prints ``RESULT {json}`` last.
"""

import importlib.util
import json
import math
import sys
import tempfile
import time


def linear_only() -> None:
    """vLLM's F.linear fallback for the Linear layers (remove_weight=True) only."""
    import torch
    import vllm.model_executor.layers.utils as utils

    original = utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer, remove_weight):
        if not remove_weight:
            return original(layer, remove_weight)  # the LM head: prepacked, as vLLM does
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)
        return None

    utils.dispatch_cpu_unquantized_gemm = dispatch


def byte_sum(completions, **_):
    """A reward that differs between any two different completions."""
    return [sum(text.encode()) % 101 / 100 for text in completions]


def finite(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def main(config: dict) -> dict:
    start = time.perf_counter()
    spec = importlib.util.spec_from_file_location("grpo_recipe", config["recipe"])
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    import precision_plugin as pp
    from precision_plugin.trl.sync_check import ATTR
    from precision_plugin.vllm import verify_engine

    if config.get("linear_only"):
        linear_only()
    pp.enable(
        {
            "dtype": config["dtype"],
            "metrics": {"canary_every": 1},
            "vllm": {"cpu_keep_weights": config["keep"]},
        }
    )
    trainer = recipe.build_trainer(
        tempfile.mkdtemp(),
        config["steps"],
        rollout="vllm-colocate",
        model_path=config["model"],
        learning_rate=config["learning_rate"],
        vllm_max_model_length=256,
    )
    # The recipe's vowel reward is 0 for most of this byte-level model's completions (no gradient,
    # the weights would not move): a reward that varies between completions of one prompt.
    trainer.reward_funcs = [byte_sum]
    built = time.perf_counter()
    error = None
    try:
        trainer.train()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    trained = time.perf_counter()
    llm = trainer.vllm_generation.llm
    callback = next(
        c for c in trainer.callback_handler.callbacks if isinstance(c, pp.PrecisionCallback)
    )
    audit = callback.audit()
    history = [
        {k: finite(v) for k, v in h.items() if k.startswith("precision/") or k == "step"}
        for h in trainer.state.log_history
    ]
    state = getattr(trainer.vllm_generation, ATTR, None)
    checks = state.checks if state is not None else []
    import vllm.model_executor.layers.utils as layer_utils

    from precision_plugin._base.patching import is_patched

    return {
        "error": error,
        "steps": trainer.state.global_step,
        "fp16": trainer.args.fp16,
        "bf16": trainer.args.bf16,
        "engine_dtype": str(llm.llm_engine.vllm_config.model_config.dtype),
        "verify": [[f.status, f.message] for f in verify_engine(llm, config["dtype"])],
        "audit_rollout": audit["rollout"],
        "audit_contradictions": audit["contradictions"],
        "history": history,
        "syncs": state.syncs if state is not None else 0,
        "sync_checks": [[c.sync, c.ratio, c.faulty] for c in checks],
        "kept_by_plugin": is_patched(layer_utils.dispatch_cpu_unquantized_gemm),
        "build_seconds": built - start,
        "train_seconds": trained - built,
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
