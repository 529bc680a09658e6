"""Cost of the DeepSpeed telemetry per optimizer step (run: python -m tests.benchmarks.bench_deepspeed_telemetry).

Times the same ZeRO-2 fp16 engine's training step bare and with :func:`track_engine` (the step
wrap: skip counting and the floor check) plus one :func:`engine_scaler_stats` read per step
(what a logging callback does at logging_steps=1, the worst case). Prints the medians and the
overhead in percent of the step.
"""

from __future__ import annotations

import statistics
import time

from tests.integration import ds_cpu


def _median_step_ms(engine, steps: int, read_stats: bool) -> float:
    from precision_plugin.deepspeed import engine_scaler_stats

    times = []
    for i in range(steps):
        start = time.perf_counter()
        ds_cpu.train_step(engine, seed=i)
        if read_stats:
            engine_scaler_stats(engine)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(steps: int = 200, rounds: int = 3) -> None:
    ds_cpu.single_process_env()
    import deepspeed
    import torch

    from precision_plugin.deepspeed import apply_config, track_engine

    ds_cpu.allow_fp16_on_cpu()
    cfg = apply_config(ds_cpu.ds_config(2, section={"loss_scaler": {"init_scale": 256}}))

    def build():
        model = ds_cpu.tiny_model()
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.AdamW(model.parameters()), config=cfg
        )
        _median_step_ms(engine, 20, False)  # warm-up
        return engine

    bare, tracked = build(), track_engine(build())
    results = {"bare": [], "telemetry": []}
    for _ in range(rounds):  # interleaved rounds: drift hits both alike
        results["bare"].append(_median_step_ms(bare, steps, False))
        results["telemetry"].append(_median_step_ms(tracked, steps, True))
    b, t = min(results["bare"]), min(results["telemetry"])
    print(f"bare step       : {b:.3f} ms (median, best of {rounds} x {steps} steps)")
    print(f"with telemetry  : {t:.3f} ms")
    print(
        f"difference      : {t - b:+.4f} ms = {100 * (t - b) / b:+.2f}% of the step (noise-bound)"
    )
    # The telemetry's own work, timed in isolation: what the step wrap adds around step(), and
    # one stats read.
    from precision_plugin.deepspeed import engine_scaler_stats
    from precision_plugin.deepspeed.telemetry import tracker_of

    tracker, n = tracker_of(tracked), 20000
    start = time.perf_counter()
    for _ in range(n):
        tracker.after_step(tracked, tracker.before_step(tracked))
        engine_scaler_stats(tracked)
    cost = (time.perf_counter() - start) / n * 1e3
    print(f"telemetry work  : {cost * 1e3:.1f} us per step = {100 * cost / b:.3f}% of the step")


if __name__ == "__main__":
    main()
