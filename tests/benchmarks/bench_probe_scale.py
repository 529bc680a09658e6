"""Peak memory and wall time of ``precision-plugin probe`` against generation length and vocabulary.

    .venv/bin/python -m tests.benchmarks.bench_probe_scale [--tokens 256,1024,4096]
        [--vocabs 32000,151936] [--num-prompts 8] [--dtypes float32] [--rss-cap-gb 8]
        [--case-timeout S] [--json FILE] [-- further probe options]

For each vocabulary a random-init Qwen2-shaped checkpoint is built in code and saved to a
temporary folder (hidden 192, 2 layers, GQA 4/2, untied head: about 59 M parameters at Qwen2.5's
151,936 tokens, 13 M at 32,000; the probe's byte tokenizer encodes the prompts, and the model
samples from its whole vocabulary). Each (vocabulary, length) case runs the real command line in
its own subprocess; the child reports its own peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``),
and the parent kills it when its RSS passes ``--rss-cap-gb`` (recorded as ``killed``), so a case
that would exhaust a shared machine's memory is measured as "more than the cap" instead.

Prints a table (``--json FILE`` also writes the figures with their provenance). A script, not a test: pytest does not
collect it (speed and memory claims are measured, never asserted).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.report import add_json_option, write_json

#: The Qwen2 shape of the benchmark model (random init, saved in bfloat16 like a real checkpoint).
QWEN2_SHAPE: dict[str, Any] = {
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}


def save_model(folder: Path, vocab_size: int, seed: int = 0) -> int:
    """Save a random-init Qwen2-shaped checkpoint with ``vocab_size`` tokens; returns #params."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from precision_plugin.probe.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.model_max_length = QWEN2_SHAPE["max_position_embeddings"]
    config = Qwen2Config(
        vocab_size=vocab_size,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **QWEN2_SHAPE,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def _child(argv: list[str], out: str) -> None:
    """Run the CLI in this process, then write its exit code and this process's peak RSS."""
    from precision_plugin.cli import main

    t0 = time.perf_counter()
    code = main(argv)
    seconds = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    Path(out).write_text(json.dumps({"rc": code, "seconds": seconds, "peak_mib": peak_kib / 1024}))


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_case(model: Path, tokens: int, options: argparse.Namespace) -> dict[str, Any]:
    """One probe run in a subprocess: peak RSS (MiB), wall time (s), exit code or ``killed``."""
    with tempfile.TemporaryDirectory(prefix="bench-probe-") as tmp:
        report, result = Path(tmp) / "report.json", Path(tmp) / "probe.json"
        argv = [
            "probe",
            "--model",
            str(model),
            "--device",
            "cpu",
            "--num-prompts",
            str(options.num_prompts),
            "--max-new-tokens",
            str(tokens),
            "--dtypes",
            options.dtypes,
            "--json",
            str(result),
            *options.extra,
        ]
        # cwd is the repository root, so ``-c`` imports this checkout's package and script.
        code = "from tests.benchmarks.bench_probe_scale import _child; "
        code += f"_child({argv!r}, {str(report)!r})"
        cap_mib = options.rss_cap_gb * 1024
        t0 = time.perf_counter()
        log = (Path(tmp) / "stderr.txt").open("wb")  # a file: a full pipe would stall the child
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        seen, killed = 0.0, False
        while proc.poll() is None:
            seen = max(seen, _rss_mib(proc.pid))
            if seen > cap_mib:
                proc.kill()
                killed = True
                break
            time.sleep(0.2)
        proc.wait()
        log.close()
        stderr = (Path(tmp) / "stderr.txt").read_bytes()
        wall = time.perf_counter() - t0
        if killed:
            return {
                "status": f"killed > {options.rss_cap_gb:g} GB",
                "peak_mib": seen,
                "wall_s": wall,
            }
        if not report.is_file():
            tail = stderr.decode(errors="replace").strip().splitlines()[-1:]
            return {"status": f"failed: {' '.join(tail)}", "peak_mib": seen, "wall_s": wall}
        child = json.loads(report.read_text())
        out: dict[str, Any] = {
            "status": "ok" if child["rc"] == 0 else f"exit {child['rc']}",
            "peak_mib": child["peak_mib"],
            "wall_s": wall,
        }
        if result.is_file():
            data = json.loads(result.read_text())
            out["tokens_generated"] = data["results"]["float32"]["tokens"]
            out["self_check_k3"] = data["self_check"]["k3_kl"]
        return out


def _table(rows: list[dict[str, Any]]) -> str:
    head = f"{'vocab':>8} {'params':>7} {'new tokens':>10} {'peak RSS':>10} {'wall':>8}  status"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['vocab']:>8} {r['params'] / 1e6:>6.1f}M {r['max_new_tokens']:>10} "
            f"{r['peak_mib'] / 1024:>8.2f}GB {r['wall_s']:>7.1f}s  {r['status']}"
        )
    return "\n".join(lines)


def main() -> dict[str, Any]:
    """Run every case and print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="256,1024,4096", help="comma list of max-new-tokens")
    parser.add_argument("--vocabs", default="32000,151936", help="comma list of vocab sizes")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--dtypes", default="float32", help="probe --dtypes (float32 always runs)")
    parser.add_argument("--rss-cap-gb", type=float, default=8.0, help="kill a case above this")
    parser.add_argument(
        "--case-timeout", type=float, default=0, help="stop a case after this many s (0: never)"
    )
    add_json_option(parser)
    parser.add_argument("extra", nargs="*", help="further probe options, after --")
    options = parser.parse_args()
    rows = []
    for vocab in (int(v) for v in options.vocabs.split(",")):
        with tempfile.TemporaryDirectory(prefix="bench-probe-model-") as tmp:
            params = save_model(Path(tmp), vocab)
            for tokens in (int(t) for t in options.tokens.split(",")):
                case = run_case(Path(tmp), tokens, options)
                rows.append({"vocab": vocab, "params": params, "max_new_tokens": tokens, **case})
                print(_table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    result = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "num_prompts": options.num_prompts,
        "dtypes": options.dtypes,
        "cases": rows,
    }
    print(_table(rows))
    write_json(options.json, result, "tests.benchmarks.bench_probe_scale")
    return result


if __name__ == "__main__":
    main()
