"""What the fp8 KV cache's emulation costs in the attribution's own rollout (``--rollout
kv_cache_dtype=fp8_e4m3``): each key and value rounded once as it enters the cache (the code)
against the whole cache rounded at every step and layer (how it was), and no fp8 cache at all.

    .venv/bin/python -m tests.benchmarks.bench_kv_rounding [--model ./smollm2-135m] \
        [--tokens 256] [--prompts 8] [--dtype float16] [--threads 1] [--json FILE]

Without ``--model`` it measures the probe's embedded model. Each variant runs
``rollout_samples`` once (8 prompts of 12 seeded tokens, every completion ``--tokens`` long),
in this order: no fp8 cache, rounded once, whole cache; the two fp8 variants' samples are
compared token for token and log-prob for log-prob (rounding to fp8 is idempotent, so they
must be equal). A script, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from precision_plugin.cli.argtypes import positive_int
from tests.attribution_cases import round_whole_cache
from tests.benchmarks.bench_decode_step import checkpoint
from tests.benchmarks.report import add_json_option, write_json

VARIANTS = ("no fp8 cache", "rounded once", "whole cache every step")


def measure(model_path: str, dtype: str, tokens: int, prompts: int) -> dict[str, Any]:
    """Seconds per variant and whether the two fp8 variants sampled the same."""
    from precision_plugin._core.hf_engine import load_causal_lm
    from precision_plugin.probe.attribution import variants
    from precision_plugin.probe.attribution.measure import rollout_samples
    from precision_plugin.probe.attribution.settings import parse_rollout

    master, _ = load_causal_lm(model_path, "cpu")
    vocab = int(master.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(min(100, vocab // 2), min(1000, vocab), (prompts, 12), generator=generator)
    options = {"max_new_tokens": tokens, "min_new_tokens": tokens, "seed": 0}
    seconds: dict[str, float] = {}
    samples: dict[str, Any] = {}
    for name in VARIANTS:
        settings = parse_rollout(
            "temperature=1" if name == "no fp8 cache" else "kv_cache_dtype=fp8"
        )
        patch = (
            mock.patch.object(variants, "quantized_entries", round_whole_cache)
            if name == "whole cache every step"
            else contextlib.nullcontext()
        )
        start = time.perf_counter()
        with patch:
            samples[name] = rollout_samples(
                master, ids.tolist(), [tokens] * prompts, dtype, settings, **options
            )
        seconds[name] = time.perf_counter() - start
        print(f"{dtype} {tokens} tokens  {name:<24} {seconds[name]:7.1f} s", flush=True)
    once, whole = samples["rounded once"], samples["whole cache every step"]
    same = [(s.completion_ids, s.logprobs) for s in once] == [
        (s.completion_ids, s.logprobs) for s in whole
    ]
    return {"seconds": seconds, "same_samples": same}


def main() -> dict[str, Any]:
    """Measure, print a line per variant (``--json FILE``: also write them)."""
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model", type=checkpoint, help="local HF checkpoint folder (default: the embedded model)"
    )
    parser.add_argument("--tokens", type=positive_int, default=256, help="tokens per completion")
    parser.add_argument("--prompts", type=positive_int, default=8)
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float16")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    add_json_option(parser)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    with tempfile.TemporaryDirectory() as scratch:
        model = options.model
        if model is None:
            from precision_plugin.probe.tiny_model import save_default_model

            model = str(save_default_model(Path(scratch) / "embedded"))
        result = {
            "settings": {
                "model": options.model or "embedded",
                "tokens": options.tokens,
                "prompts": options.prompts,
                "dtype": options.dtype,
                "threads": options.threads,
            },
            **measure(model, options.dtype, options.tokens, options.prompts),
        }
    print(f"same samples with the cache rounded once: {result['same_samples']}")
    write_json(options.json, result, "tests.benchmarks.bench_kv_rounding")
    return result


if __name__ == "__main__":
    main()
