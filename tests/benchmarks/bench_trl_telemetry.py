"""Cost of the TRL mismatch telemetry per GRPO step, with the recipe on CPU.

    .venv/bin/python -m tests.benchmarks.bench_trl_telemetry [--runs 5] [--steps 8] [--json FILE]

The recipe (integrations/trl/grpo_fp16.py: tiny Llama, HFRollout, fp16) trains ``--steps``
steps with ``metrics.enabled`` on and off, alternating runs so drift of the machine hits both
alike. Two figures: the whole step (TRL's own ``step_time``, medians over every step of every
run) and the telemetry in isolation (time spent inside the accumulator's ``add`` and ``flush``,
per step), which is where all of its work lives. A script, not a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.report import add_json_option, write_json

ROOT = Path(__file__).resolve().parents[2]


def _recipe() -> Any:
    spec = importlib.util.spec_from_file_location("recipe", ROOT / "integrations/trl/grpo_fp16.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timed(cls: Any, name: str, sink: list[float]) -> Any:
    original = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t0)

    setattr(cls, name, wrapper)
    return original


def _run(recipe: Any, enabled: bool, steps: int, seed: int) -> tuple[list[float], float]:
    import precision_plugin as pp
    from precision_plugin.trl.telemetry import MismatchAccumulator

    spent: list[float] = []
    add = _timed(MismatchAccumulator, "add", spent)
    flush = _timed(MismatchAccumulator, "flush", spent)
    pp.enable(metrics={"enabled": enabled})
    try:
        trainer = recipe.build_trainer(tempfile.mkdtemp(), steps, seed=seed)
        trainer.train()
    finally:
        pp.disable()
        MismatchAccumulator.add, MismatchAccumulator.flush = add, flush
    times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
    return times[1:], sum(spent) / steps  # the first step builds the rollout copy


def main() -> dict[str, Any]:
    """Measure, print a table (``--json FILE``: also write them) and return the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5, help="runs per setting")
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps per run")
    add_json_option(parser)
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    recipe = _recipe()
    steps: dict[bool, list[float]] = {True: [], False: []}
    isolated: list[float] = []
    for run in range(options.runs):
        for enabled in (run % 2 == 0, run % 2 != 0):
            times, spent = _run(recipe, enabled, options.steps, seed=run)
            steps[enabled] += times
            if enabled:
                isolated.append(spent)
    on, off = statistics.median(steps[True]), statistics.median(steps[False])
    alone = statistics.median(isolated)
    result = {
        "median_step_off_s": off,
        "median_step_on_s": on,
        "whole_step_difference_pct": 100 * (on - off) / off,
        "telemetry_per_step_s": alone,
        "telemetry_pct_of_step": 100 * alone / off,
        "spread_off_s": [min(steps[False]), max(steps[False])],
        "spread_on_s": [min(steps[True]), max(steps[True])],
    }
    print(
        f"median step, telemetry off   {off * 1e3:9.2f} ms  (range {min(steps[False]) * 1e3:.1f}-{max(steps[False]) * 1e3:.1f})"
    )
    print(
        f"median step, telemetry on    {on * 1e3:9.2f} ms  (range {min(steps[True]) * 1e3:.1f}-{max(steps[True]) * 1e3:.1f})"
    )
    print(
        f"whole-step difference        {result['whole_step_difference_pct']:+9.2f} %  (noise-bound when within the ranges)"
    )
    print(
        f"telemetry alone per step     {alone * 1e6:9.1f} µs = {result['telemetry_pct_of_step']:.3f} % of a step"
    )
    write_json(options.json, result, "tests.benchmarks.bench_trl_telemetry")
    return result


if __name__ == "__main__":
    main()
