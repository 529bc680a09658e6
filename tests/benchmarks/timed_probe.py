"""One ``precision-plugin probe`` run, timed, for the benchmarks that compare probe runs
(``bench_attribution_time``, ``bench_probe_speed``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TimedProbe:
    """A probe run: its wall time, the 1-minute load average just before it, and its JSON."""

    wall_s: float
    load_average_1min: float
    data: dict[str, Any]


def timed_probe(args: list[str], env: dict[str, str], *, in_tmp: bool = False) -> TimedProbe:
    """Run ``python -m precision_plugin probe ARGS --json ...`` in a subprocess with ``env`` over
    this process's environment (``in_tmp``: from a temporary folder, so that ``PYTHONPATH``, not
    the current folder, decides which tree of the package runs); a failed run stops the
    benchmark with its output."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "probe.json"
        command = [sys.executable, "-m", "precision_plugin", "probe", *args, "--json", str(out)]
        load = os.getloadavg()[0]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              env={**os.environ, **env}, cwd=tmp if in_tmp else None)  # fmt: skip
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
        return TimedProbe(wall, load, json.loads(out.read_text()))
