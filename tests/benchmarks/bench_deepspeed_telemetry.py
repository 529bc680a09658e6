"""Cost of the DeepSpeed telemetry per optimizer step.

    .venv/bin/python -m tests.benchmarks.bench_deepspeed_telemetry [--steps 200] [--rounds 3] [--json FILE]

The headline figure is the telemetry's own work timed in isolation: what the step wrap of
:func:`track_engine` adds around ``step()`` (skip counting, the floor check) plus one
:func:`engine_scaler_stats` read (what a logging callback does at ``logging_steps=1``, the worst
case), against the median bare step. The same ZeRO-2 fp16 engine's whole step, bare and tracked, is
also timed in interleaved rounds; on a shared machine that difference is usually noise, and the
table says when it is. Prints a small table (``--json FILE`` also writes the figures). A script, not a test.
"""

from __future__ import annotations

import argparse
import time

from tests.benchmarks.report import (
    Spread,
    add_json_option,
    block_medians,
    emit,
    fmt_time,
    paired_difference,
    spread_row,
)
from tests.integration import ds_cpu


def _step_times(engine, steps: int, read_stats: bool) -> list[float]:
    from precision_plugin.deepspeed import engine_scaler_stats

    times = []
    for i in range(steps):
        start = time.perf_counter()
        ds_cpu.train_step(engine, seed=i)
        if read_stats:
            engine_scaler_stats(engine)
        times.append(time.perf_counter() - start)
    return times


def _isolated_cost(engine, repeats: int) -> list[float]:
    """Seconds per step of the telemetry's own work, in ``repeats`` batches of 2,000 calls."""
    from precision_plugin.deepspeed import engine_scaler_stats
    from precision_plugin.deepspeed.telemetry import tracker_of

    tracker, n, out = tracker_of(engine), 2000, []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            tracker.after_step(engine, tracker.before_step(engine))
            engine_scaler_stats(engine)
        out.append((time.perf_counter() - start) / n)
    return out


def main() -> dict:
    """Measure, then print the table (or the JSON) and return the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200, help="steps per round and engine")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    add_json_option(parser)
    options = parser.parse_args()

    ds_cpu.single_process_env()
    import deepspeed
    import torch

    from precision_plugin.deepspeed import apply_config, track_engine

    ds_cpu.allow_fp16_on_cpu()  # fp16 on any CPU (see tests/integration/ds_cpu.py)
    cfg = apply_config(
        ds_cpu.ds_config(2, section={"loss_scaler": {"init_scale": 256}}, bf16={"enabled": False})
    )

    def build():
        model = ds_cpu.tiny_model()
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.AdamW(model.parameters()), config=cfg
        )
        _step_times(engine, 20, False)  # warm-up
        return engine

    bare, tracked = build(), track_engine(build())
    times: dict[str, list[float]] = {"bare": [], "telemetry": []}
    for _ in range(options.rounds):  # interleaved rounds: drift hits both alike
        times["bare"] += _step_times(bare, options.steps, False)
        times["telemetry"] += _step_times(tracked, options.steps, True)
    block = max(1, options.steps // 10)
    diff, noise = paired_difference(
        block_medians(times["bare"], block), block_medians(times["telemetry"], block)
    )
    steps = {name: Spread.of(v) for name, v in times.items()}
    isolated = Spread.of(_isolated_cost(tracked, 9))
    step = steps["bare"].median
    data = {
        "steps_per_engine": len(times["bare"]),
        "step_bare": steps["bare"].as_dict(),
        "step_telemetry": steps["telemetry"].as_dict(),
        "step_difference": diff.as_dict(),
        "step_within_noise": noise,
        "telemetry_isolated": isolated.as_dict(),
        "telemetry_cost_pct_of_step": 100 * isolated.median / step,
    }
    rows = [
        spread_row("step, bare", steps["bare"]),
        spread_row("step, telemetry", steps["telemetry"], diff, noise, step),
        spread_row("telemetry alone", isolated),
    ]
    headline = (
        f"telemetry cost, timed in isolation: {fmt_time(isolated.median)} per optimizer step = "
        f"{100 * isolated.median / step:.3f}% of a {fmt_time(step)} ZeRO-2 fp16 step\n"
        f"{options.rounds} interleaved rounds x {options.steps} steps per engine; (noise): zero "
        f"lies within the middle half of the per-block differences"
    )
    emit(
        "DeepSpeed loss-scale telemetry vs a bare engine",
        rows,
        headline,
        data,
        options.json,
        "tests.benchmarks.bench_deepspeed_telemetry",
    )
    return data


if __name__ == "__main__":
    main()
