"""What keeping vLLM-CPU's Linear weights costs: decode speed with vLLM's prepacked products
against its own ``F.linear`` path (``vllm.cpu_keep_weights``), per dtype, on a real engine.

    .venv-vllm-cpu/bin/python -m tests.benchmarks.bench_vllm_cpu_weights --model DIR \\
        [--dtypes float32,bfloat16,float16] [--prompts 8] [--tokens 128] [--json FILE]

Runs in the real-engine environment (scripts/setup_vllm_cpu_env.sh). Each (dtype, mode) is one
engine process (tests/engine_vllm/programs/offline.py): ``prompts`` sequences sampled together,
``tokens`` new tokens each (EOS ignored); the figure is the generation's wall time and its
tokens/s (engine start-up excluded). Where oneDNN cannot build a product for a dtype on this CPU
(float16 without AVX512-FP16/AMX), vLLM already computes with ``F.linear`` and both modes run
the same kernels. The modes are set as a user would, through the policy
(``PRECISION_PLUGIN='{"dtype": ..., "vllm": {"cpu_keep_weights": "on"|"off"}}'``), which the
plugin's general plugin applies in the engine's worker process. A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from tests.benchmarks.report import add_json_option, write_json

PROGRAMS = Path(__file__).resolve().parents[1] / "engine_vllm" / "programs"


def run(model: str, dtype: str, keep: bool, prompts: int, tokens: int) -> dict[str, Any]:
    """One engine process; its generation time, tokens/s and whether oneDNN fell back."""
    import json
    import subprocess
    import tempfile

    config = {
        "model": model,
        "llm": {"dtype": dtype},
        "prompts": [[1, 2 + i, 3 + i] for i in range(prompts)],
        "tokens": tokens,
    }
    # The policy reaches the engine's worker process through the general plugin, as it would
    # reach a server: "on" keeps the weights in every engine, "off" leaves vLLM's prepacking.
    policy = {"dtype": dtype, "vllm": {"cpu_keep_weights": "on" if keep else "off"}}
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "PYTHONPATH")},
        "PRECISION_PLUGIN": json.dumps(policy),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
    }
    with tempfile.TemporaryDirectory() as workdir:
        done = subprocess.run(
            [sys.executable, str(PROGRAMS / "offline.py"), json.dumps(config)],
            cwd=workdir, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{dtype} keep={keep}: the engine failed:\n{done.stdout[-3000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    seconds = result["generate_seconds"]
    return {
        "dtype": dtype,
        "mode": "kept (F.linear)" if keep else "prepacked (vLLM default)",
        "generate_seconds": seconds,
        "tokens_per_second": prompts * tokens / seconds,
        "onednn_fallback": "Failed to create oneDNN linear" in done.stdout,
        "plugin_processes": done.stdout.count("precision_plugin active in this process"),
        "kept_in_processes": done.stdout.count("CPU Linear weights kept (F.linear)"),
        "engine_dtype": result["dtype"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local checkpoint folder")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    add_json_option(parser)
    options = parser.parse_args(argv)
    rows = []
    for dtype in options.dtypes.split(","):
        pair = [
            run(options.model, dtype, keep, options.prompts, options.tokens)
            for keep in (False, True)
        ]
        pair[1]["cost"] = pair[0]["tokens_per_second"] / pair[1]["tokens_per_second"]
        rows.extend(pair)
        for row in pair:
            print(
                f"{row['dtype']:>9} {row['mode']:<26} {row['tokens_per_second']:7.1f} tok/s"
                f"{'  (oneDNN fell back)' if row['onednn_fallback'] else ''}"
            )
    results = {
        "model": options.model,
        "prompts": options.prompts,
        "tokens": options.tokens,
        "rows": rows,
    }
    module = "tests.benchmarks.bench_vllm_cpu_weights"
    write_json(options.json, results, module, argv=argv, venv=".venv-vllm-cpu")
    return results


if __name__ == "__main__":
    main()
