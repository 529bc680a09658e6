"""Attribution cases that inject one cause alone, shared by the unit tests and the seeds benchmark
(``tests/benchmarks/bench_attribution_seeds.py``). Tiny models built in code, CPU only."""

from __future__ import annotations

from typing import Any

import torch

from precision_plugin.probe.attribution import RolloutSettings, attribute_dtype, rollout_samples
from tests.tiny import tiny_llama


def round_whole_cache(module: Any, key: Any, value: Any, new: int, fmt: str) -> tuple[Any, Any]:
    """The reference for ``variants.quantized_entries``: every key and value the attention sees
    rounded again at each call, into new tensors (the first fp8 KV emulation)."""
    from precision_plugin.probe.attribution.variants import fake_quantize

    return fake_quantize(key, fmt), fake_quantize(value, fmt)


PROMPTS = [[5, 9, 17, 3, 22, 40], [7, 7, 31, 2], [11, 60, 33, 8, 1]]
NEW_TOKENS = 24

# Causes that exist only relative to a compute dtype are injected under float32 compute with only
# that component rounded; the others in the setting that shows them.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "dtype": ("bfloat16", {}),
    "decode": ("float32", {}),
    "batch": ("float32", {}),
    "lm_head": ("float32", {"lm_head_dtype": "bfloat16"}),
    "sampling": ("float32", {"temperature": 0.7}),
    "rope": ("float32", {"rope_dtype": "bfloat16"}),
    "kv_cache": ("float32", {"kv_cache_dtype": "fp8_e4m3"}),
    "router": ("float32", {"router_dtype": "bfloat16"}),
    "stale_weights": ("float32", {}),
}


def llama() -> Any:
    """A 2-layer tiny Llama; wider init than HF's 0.02: peaked next-token distributions."""
    return tiny_llama(num_hidden_layers=2, initializer_range=0.2).eval()


def moe() -> Any:
    """A 2-layer tiny Qwen2-MoE (8 experts, top 2)."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, max_position_embeddings=128,
        initializer_range=0.2,
    )  # fmt: skip
    return Qwen2MoeForCausalLM(config).eval()


class BatchDependentNorm:
    """A controlled engine: the final norm's output is rounded to bfloat16 whenever more than
    one sequence shares the forward (a batch-dependent kernel), never for a sequence alone."""

    def __call__(self, module: Any, args: Any, output: Any) -> Any:
        return output.to(torch.bfloat16).float() if output.shape[0] > 1 else output


def sample(model: Any, dtype: str, settings: RolloutSettings, *,
           prompts: list[list[int]] = PROMPTS, seed: int = 0) -> Any:  # fmt: skip
    """The rollout's samples with ``settings``: ``NEW_TOKENS`` tokens per prompt."""
    return rollout_samples(
        model, prompts, [NEW_TOKENS] * len(prompts), dtype, settings,
        max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, seed=seed,
    )  # fmt: skip


def run(model: Any, dtype: str, settings: RolloutSettings, *, prompts: list[list[int]] = PROMPTS,
        learning_rate: float | None = None, seed: int = 0) -> Any:  # fmt: skip
    """Sample with ``settings`` and attribute, only the causes the rollout runs with."""
    samples = sample(model, dtype, settings, prompts=prompts, seed=seed)
    return attribute_dtype(
        model, samples, dtype, settings,
        min_new_tokens=NEW_TOKENS, learning_rate=learning_rate, seed=seed, what_if=False,
    )  # fmt: skip


def run_case(cause: str, seed: int = 0) -> Any:
    """The attribution of ``CASES[cause]`` (sampling seed ``seed``)."""
    dtype, switches = CASES[cause]
    model = moe() if cause == "router" else llama()
    prompts = PROMPTS[:1] if cause == "decode" else PROMPTS  # alone: no batch row
    if cause == "batch":
        model.model.norm.register_forward_hook(BatchDependentNorm())
    lr = 1e-3 if cause == "stale_weights" else None
    return run(model, dtype, RolloutSettings(**switches), prompts=prompts, learning_rate=lr,
               seed=seed)  # fmt: skip


def ranking(report: Any) -> list[tuple[str, float]]:
    """``(cause, k3)`` of every row, largest first."""
    return [(r.cause, r.k3.value) for r in report.ranked()]
