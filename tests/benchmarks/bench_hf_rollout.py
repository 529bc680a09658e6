"""HF rollout engine (HFRollout's and the probe's) tokens/s against plain ``model.generate``.

    .venv/bin/python -m tests.benchmarks.bench_hf_rollout [--runs 5] [--new-tokens 128] [--json FILE]

Same random-init Llama (4 layers, hidden 256, vocab 32,000), same dtype copy, same prompts
(8 × 16 tokens), sampling at temperature 1 over the full vocabulary, KV cache, no EOS (every
sequence runs the full length, so both produce the same number of tokens). ``model.generate``
is asked for exactly what the engine returns besides the tokens, the per-token log-probs of
the sampled tokens (``output_scores=True``, gathered after the run, as the engine did before
it recorded them while sampling); ``generate`` without scores is shown too. Runs alternate;
medians of CPU time (``time.process_time``, one torch thread by default), which a machine
shared with other jobs disturbs far less than wall time. A script, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from tests.benchmarks.report import add_json_option, write_json


def _model(dtype: torch.dtype) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=1024,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


def _generate(model: Any, ids: torch.Tensor, new: int, scores: bool) -> None:
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
        min_new_tokens=new, pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            generation_config=config,
            output_scores=scores,
            return_dict_in_generate=True,
        )
        if scores:
            sampled = out.sequences[:, ids.shape[1] :]
            for t, step in enumerate(out.scores):
                torch.log_softmax(step.float(), -1).gather(-1, sampled[:, t : t + 1])


def main() -> dict[str, Any]:
    """Measure, print a table (``--json FILE``: also write them) and return the figures."""
    from precision_plugin._core.hf_engine import HFRolloutEngine

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    add_json_option(parser)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    dtype = getattr(torch, options.dtype)
    model = _model(dtype)
    engine = HFRolloutEngine(_model(torch.float32), options.dtype, "cpu", copy=False)
    torch.manual_seed(1)
    prompts = torch.randint(1, 32000, (options.batch, 16))
    tokens = options.batch * options.new_tokens
    runs: dict[str, list[float]] = {"engine": [], "generate+scores": [], "generate": []}
    calls = {
        "engine": lambda: engine.generate(prompts.tolist(), options.new_tokens, seed=0),
        "generate+scores": lambda: _generate(model, prompts, options.new_tokens, True),
        "generate": lambda: _generate(model, prompts, options.new_tokens, False),
    }
    for name in calls:  # warm-up
        calls[name]()
    for _ in range(options.runs):
        for name, call in calls.items():
            t0 = time.process_time()
            call()
            runs[name].append(tokens / (time.process_time() - t0))
    result: dict[str, Any] = {name: statistics.median(v) for name, v in runs.items()}
    result["ranges"] = {name: [min(v), max(v)] for name, v in runs.items()}
    result["settings"] = {
        "runs": options.runs, "new_tokens": options.new_tokens, "batch": options.batch,
        "dtype": options.dtype, "threads": options.threads,
    }  # fmt: skip
    result["engine_vs_generate_scores"] = result["engine"] / result["generate+scores"]
    result["engine_vs_generate"] = result["engine"] / result["generate"]
    for name, values in runs.items():
        print(
            f"{name:<16} {statistics.median(values):9.1f} CPU-time tokens/s  "
            f"(range {min(values):.1f}-{max(values):.1f})"
        )
    print(f"engine / generate+scores  {result['engine_vs_generate_scores']:.3f}")
    print(f"engine / generate         {result['engine_vs_generate']:.3f}")
    write_json(options.json, result, "tests.benchmarks.bench_hf_rollout")
    return result


if __name__ == "__main__":
    main()
