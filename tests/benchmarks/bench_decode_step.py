"""Where a rollout decode step's time goes: the probe's HF engine's wall time per step, by dtype
and by the rows in the batch, and how much of it the linear layers' products take.

    .venv/bin/python -m tests.benchmarks.bench_decode_step [--model ./smollm2-135m] \
        [--steps 128] [--rows 1,8] [--threads 1] [--json FILE]

Without ``--model`` it measures the probe's embedded model.

Each dtype gets the probe's own rollout copy (``HFRolloutEngine``: packed, fused products and
the plugin's attention); prompts of 8 tokens, ``--steps`` tokens each (EOS suppressed), so the
cache stays short and the step's fixed costs show. Per dtype and row count: the median wall
time per step of three runs; then one run under ``torch.profiler`` for the kernels' own time
in the linear products (oneDNN's ``_linear_pointwise``, or ``addmm``/``mm`` where the weights
are not packed), the rate they read the weights at, and the operators called per step (those
called from Python, not the ones they call). ``other`` is the rest of the unprofiled step:
attention, sampling, the elementwise operators and Python. The core's streaming rate
(``tensor.sum()`` over 512 MB of float32) is measured alongside for comparison. A script, not a
test.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from precision_plugin.cli.argtypes import positive_int
from tests.benchmarks.report import add_json_option, write_json

#: Operators whose self time is a linear layer's product in the rollout copy.
PRODUCTS = ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm")

DTYPES = ("float32", "float16", "bfloat16")


def weight_bytes(model: Any) -> int:
    """Bytes the linear layers' products read per step: a float16 weight is multiplied widened
    to float32 (``float16_cpu``), so it counts four bytes per parameter, as float32 does."""
    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            size = 2 if module.weight.dtype == torch.bfloat16 else 4
            total += module.weight.numel() * size
    return total


def _prompts(rows: int, vocab: int) -> list[list[int]]:
    """``rows`` prompts of 8 seeded token ids, from 100 to 999 where the vocabulary has them."""
    high = min(1000, vocab)
    generator = torch.Generator().manual_seed(0)
    return torch.randint(min(100, high // 2), high, (rows, 8), generator=generator).tolist()


def _profiled(engine: Any, prompts: list[list[int]], steps: int) -> tuple[float, int, float]:
    """The products' kernel time (s), the operators called from Python and the run's own wall
    time (s, with the profiler's overhead), over one profiled run."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.generate(prompts, steps, 0, min_new_tokens=steps)
    wall = time.perf_counter() - start
    events = prof.events()
    products = sum(e.self_cpu_time_total for e in events if e.name in PRODUCTS) / 1e6
    top_level = sum(1 for e in events if e.cpu_parent is None and "::" in e.name)
    return products, top_level, wall


def stream_rate() -> float:
    """GB/s at which one core sums 512 MB of float32 (median of five)."""
    big = torch.ones(128 * 1024 * 1024)
    big.sum()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        big.sum()
        times.append(time.perf_counter() - start)
    return big.numel() * 4 / statistics.median(times) / 1e9


def measure(model_path: str, dtype: str, rows: list[int], steps: int) -> dict[str, Any]:
    """One dtype's figures for each row count."""
    from precision_plugin._core.hf_engine import HFRolloutEngine

    engine = HFRolloutEngine.from_pretrained(model_path, dtype, "cpu")
    vocab = engine.model.config.vocab_size
    engine.generate(_prompts(max(rows), vocab), 8, 0)  # warm-up; fuses the shared-input layers
    read = weight_bytes(engine.model)
    result: dict[str, Any] = {"weight_bytes": read, "rows": {}}
    for count in rows:
        prompts = _prompts(count, vocab)
        walls = []
        for _ in range(3):
            start = time.perf_counter()
            engine.generate(prompts, steps, 0, min_new_tokens=steps)
            walls.append(time.perf_counter() - start)
        step = statistics.median(walls) / steps
        products, operators, profiled = _profiled(engine, prompts, steps)
        products /= steps
        cell = {
            "step_ms": step * 1e3,
            # the profiled run's own step: the products are part of it (the unprofiled runs
            # are other runs, which a loaded machine can make faster or slower)
            "profiled_step_ms": profiled / steps * 1e3,
            "products_ms": products * 1e3,
            "products_share": products / step,
            "products_gb_s": read / products / 1e9,
            "other_ms": (step - products) * 1e3,
            "operators_per_step": operators / steps,
        }
        result["rows"][str(count)] = cell
        print(
            f"{dtype:<9} {count} rows  {cell['step_ms']:6.1f} ms/step  products "
            f"{cell['products_ms']:5.1f} ms ({cell['products_gb_s']:4.1f} GB/s)  other "
            f"{cell['other_ms']:5.1f} ms  {cell['operators_per_step']:,.0f} operators/step",
            flush=True,
        )
    engine.close()
    return result


def row_counts(text: str) -> list[int]:
    """An argparse type: a comma list of row counts, each at least 1 (``1,8``)."""
    try:
        return [positive_int(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of whole numbers of at least 1 (e.g. 1,8), got {text!r}"
        ) from None


def checkpoint(text: str) -> str:
    """An argparse type: a local HF checkpoint folder (the probe's own check)."""
    from precision_plugin.errors import PrecisionConfigError
    from precision_plugin.probe.inputs import check_model_dir

    try:
        return str(check_model_dir(text))
    except PrecisionConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main() -> dict[str, Any]:
    """Measure, print a line per dtype and row count (``--json FILE``: also write them)."""
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model", type=checkpoint, help="local HF checkpoint folder (default: the embedded model)"
    )
    parser.add_argument("--steps", type=positive_int, default=128)
    parser.add_argument("--rows", type=row_counts, default="1,8", help="batch row counts")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    add_json_option(parser)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    rows = options.rows
    with tempfile.TemporaryDirectory() as scratch:
        model = options.model
        if model is None:
            from precision_plugin.probe.tiny_model import save_default_model

            model = str(save_default_model(Path(scratch) / "embedded"))
        result: dict[str, Any] = {
            "settings": {
                "model": options.model or "embedded",
                "steps": options.steps,
                "rows": rows,
                "threads": options.threads,
                "prompt_tokens": 8,
            },
            "stream_gb_s": stream_rate(),
            "dtypes": {dtype: measure(model, dtype, rows, options.steps) for dtype in DTYPES},
        }
    print(f"one core sums float32 at {result['stream_gb_s']:.1f} GB/s")
    write_json(options.json, result, "tests.benchmarks.bench_decode_step")
    return result


if __name__ == "__main__":
    main()
