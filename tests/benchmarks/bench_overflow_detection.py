"""Cost of runtime overflow detection per training step: off vs sampled every 10 steps.

    .venv/bin/python -m tests.benchmarks.bench_overflow_detection [--pairs 200] [--json FILE]

A small Llama (default 2 layers, hidden 128, batch 2 x 64 tokens, one CPU thread: several
threads on a shared 2-core machine mostly measure contention), fp16 autocast, the plugin's loss
scaler, AdamW. Unchecked and checked training steps (``OverflowDetector`` hooks on every module)
alternate on the same model, so each checked step has an unchecked neighbour measured under the
same machine load; the median of the paired differences is the price of one checked step.
Detection sampled every ``--every`` steps pays it once per ``--every`` steps, so its overhead is
``median(checked - unchecked) / every / median(unchecked)``. A script, not a test: pytest does
not collect it, no speed is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time

import torch

from precision_plugin import PrecisionPolicy
from precision_plugin._core.overflow import OverflowDetector
from precision_plugin._core.scaler import make_grad_scaler
from tests.benchmarks.report import add_json_option, write_json


def _model(layers: int, hidden: int, device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    return LlamaForCausalLM(config).to(device)


def main() -> dict:
    """Measure; print a table (``--json FILE`` also writes them); return the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=200, help="unchecked/checked step pairs")
    parser.add_argument("--every", type=int, default=10, help="sampling interval of 'sampled'")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_json_option(parser)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    device = options.device
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model = _model(options.layers, options.hidden, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = make_grad_scaler(PrecisionPolicy(loss_scaler={"init_scale": 2.0**10}), device)
    detector = OverflowDetector(model, mode="always")
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 512, (options.batch, options.seq), generator=gen).to(device)

    def step(checked: bool) -> float:
        t0 = time.perf_counter()
        with detector.step(0) if checked else contextlib.nullcontext():
            with torch.autocast(device, dtype=torch.float16):
                loss = model(input_ids=batch, labels=batch).loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0

    for i in range(10):  # warm-up
        step(i % 2 == 0)
    plain, diffs = [], []
    for i in range(options.pairs):
        first_checked = i % 2 == 1  # alternate which of the pair runs first
        a, b = step(first_checked), step(not first_checked)
        off, on = (b, a) if first_checked else (a, b)
        plain.append(off)
        diffs.append(on - off)
    step_s = statistics.median(plain)
    checked_s = statistics.median(diffs)
    result = {
        "device": device,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "model": f"llama {options.layers}x{options.hidden}, batch {options.batch}x{options.seq}",
        "modules_hooked": sum(1 for _ in model.modules()),
        "threads": options.threads,
        "pairs": options.pairs,
        "every": options.every,
        "step_median_s": step_s,
        "checked_step_extra_s": checked_s,
        "checked_step_overhead_pct": 100 * checked_s / step_s,
        "sampled_overhead_pct": 100 * checked_s / options.every / step_s,
    }
    print(
        f"{result['model']}, {result['modules_hooked']} modules hooked, {device}, "
        f"{options.threads} thread(s), {options.pairs} step pairs"
    )
    print(f"{'detection':<22}{'median step':>14}{'vs off':>10}")
    rows = (
        ("off", step_s),
        ("every step", step_s + checked_s),
        (f"sampled every {options.every}", step_s + checked_s / options.every),
    )
    for label, seconds in rows:
        print(f"{label:<22}{seconds * 1e3:>11.2f} ms{100 * (seconds / step_s - 1):>+9.2f}%")
    write_json(options.json, result, "tests.benchmarks.bench_overflow_detection")
    return result


if __name__ == "__main__":
    main()
