"""Cost of the loss-scale telemetry per optimizer step, against a bare torch GradScaler.

    .venv/bin/python tests/benchmarks/bench_scaler_overhead.py [--steps 400] [--device cpu]

Same tiny Llama, same data, fp16 autocast, AdamW. Both scalers run interleaved in blocks so
drift of the machine hits both alike. Two figures: the whole optimizer step (forward, backward,
scaler.step, scaler.update) and ``scaler.update()`` alone, where all of the telemetry lives.
Prints one JSON line; the overhead must stay below 1% of the step. A script, not a test: pytest
does not collect it (speed claims are measured, never asserted).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from precision_plugin import PrecisionPolicy
from precision_plugin.scaler import make_grad_scaler


def _model(device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    return LlamaForCausalLM(config).to(device)


def _run(scaler, model, optimizer, batch, device: str, sync) -> tuple[float, float]:
    t0 = time.perf_counter()
    with torch.autocast(device, dtype=torch.float16):
        loss = model(input_ids=batch, labels=batch).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    sync()
    t1 = time.perf_counter()
    scaler.update()
    sync()
    t2 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    return t2 - t0, t2 - t1


def main() -> dict:
    """Measure and print the medians (seconds) and the overhead in percent of a step."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400, help="measured steps per scaler")
    parser.add_argument("--block", type=int, default=20, help="steps per interleaved block")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    options = parser.parse_args()
    device = options.device
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    policy = PrecisionPolicy(loss_scaler={"init_scale": 2.0**10, "growth_interval": 10**9})
    kwargs = dict(init_scale=2.0**10, growth_interval=10**9)
    setups = {}
    for name in ("bare", "telemetry"):
        model = _model(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        scaler = (
            torch.amp.GradScaler(device, **kwargs)
            if name == "bare"
            else make_grad_scaler(policy, device)
        )
        setups[name] = (scaler, model, optimizer)
    batch = torch.randint(0, 128, (2, 16), device=device)
    for setup in setups.values():  # warm-up
        for _ in range(20):
            _run(*setup, batch, device, sync)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in setups}
    for _ in range(options.steps // options.block):
        for name, setup in setups.items():
            times[name].extend(_run(*setup, batch, device, sync) for _ in range(options.block))
    med = {
        name: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v))
        for name, v in times.items()
    }
    step = med["bare"][0]
    result = {
        "device": device,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "steps_per_scaler": len(times["bare"]),
        "step_median_s": {name: m[0] for name, m in med.items()},
        "update_median_s": {name: m[1] for name, m in med.items()},
        "update_overhead_s": med["telemetry"][1] - med["bare"][1],
        "update_overhead_pct_of_step": 100 * (med["telemetry"][1] - med["bare"][1]) / step,
        "step_overhead_pct": 100 * (med["telemetry"][0] - step) / step,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
