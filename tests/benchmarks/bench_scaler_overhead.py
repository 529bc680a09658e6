"""Cost of the loss-scale telemetry per optimizer step, against a bare torch GradScaler.

    .venv/bin/python -m tests.benchmarks.bench_scaler_overhead [--steps 400] [--device cpu] [--json FILE]

Same tiny Llama, same data, fp16 autocast, AdamW. Both scalers run interleaved in blocks so
drift of the machine hits both alike. Two figures: the whole optimizer step (forward, backward,
scaler.step, scaler.update) and ``scaler.update()`` alone, where all of the telemetry lives: the
headline is the ``update()`` difference, the telemetry timed in isolation; the whole-step
difference is shown with whether it is within the machine's noise. Prints a small table (``--json FILE``
also writes the figures with their provenance). A script, not a test: pytest does not collect it (speed claims are measured, never
asserted).
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from precision_plugin import PrecisionPolicy
from precision_plugin._core.scaler import make_grad_scaler
from tests.benchmarks.report import (
    Spread,
    add_json_option,
    block_medians,
    emit,
    fmt_time,
    paired_difference,
    spread_row,
)


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
    """Measure, then print the table (or the JSON) and return the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400, help="measured steps per scaler")
    parser.add_argument("--block", type=int, default=20, help="steps per interleaved block")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_json_option(parser)
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
    figures = {}
    for part, index in (("step", 0), ("update", 1)):
        series = {name: [t[index] for t in v] for name, v in times.items()}
        blocks = {name: block_medians(v, options.block) for name, v in series.items()}
        diff, noise = paired_difference(blocks["bare"], blocks["telemetry"])
        figures[part] = {
            "bare": Spread.of(series["bare"]),
            "telemetry": Spread.of(series["telemetry"]),
            "difference": diff,
            "within_noise": noise,
        }
    step = figures["step"]["bare"].median
    cost = figures["update"]["difference"].median
    data = {
        "device": device,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "steps_per_scaler": len(times["bare"]),
        **{
            f"{part}_{key}": value.as_dict() if isinstance(value, Spread) else value
            for part, f in figures.items()
            for key, value in f.items()
        },
        "telemetry_cost_s": cost,
        "telemetry_cost_pct_of_step": 100 * cost / step,
    }
    rows = []
    for part, label in (("step", "step"), ("update", "update()")):
        f = figures[part]
        rows.append(spread_row(f"{label}, bare", f["bare"]))
        rows.append(
            spread_row(
                f"{label}, telemetry", f["telemetry"], f["difference"], f["within_noise"], step
            )
        )
    noise = figures["update"]["within_noise"]
    headline = (
        f"telemetry cost, update() timed alone: {fmt_time(cost)} per optimizer step = "
        f"{100 * cost / step:.2f}% of a {fmt_time(step)} step"
        + (" (within noise: too small to tell from zero here)" if noise else "")
        + f"\n{device}, {len(times['bare'])} steps per scaler in interleaved blocks of "
        f"{options.block}; (noise): zero lies within the middle half of the per-block differences"
    )
    emit(
        "loss-scale telemetry vs a bare torch GradScaler",
        rows,
        headline,
        data,
        options.json,
        "tests.benchmarks.bench_scaler_overhead",
    )
    return data


if __name__ == "__main__":
    main()
