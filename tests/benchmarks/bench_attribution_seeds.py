"""Each cause injected alone, over 20 seeds: how often the attribution ranks it first.

    .venv/bin/python -m tests.benchmarks.bench_attribution_seeds [--seeds 20] [--json FILE]

Runs ``tests.attribution_cases.run_case`` (the unit tests' cases: tiny models built in code, one
cause switched on, the others as the rollout runs them) with sampling seeds ``0..N-1`` and
records, per cause, how many seeds rank it first, and the smallest ratio of its k3 to the next
row's. ``tests/unit/test_attribution.py`` checks the published file (at least 19 of 20 per cause).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tests.attribution_cases import CASES, ranking, run_case
from tests.benchmarks.report import add_json_option, write_json


def main(argv: list[str] | None = None) -> int:
    """Run every cause over the seeds; print and optionally write the counts."""
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    add_json_option(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    causes: dict[str, Any] = {}
    for cause in CASES:
        firsts, ratios = 0, []
        for seed in range(args.seeds):
            ranked = ranking(run_case(cause, seed))
            firsts += ranked[0][0] == cause
            runner_up = ranked[1][1] if len(ranked) > 1 else 0.0
            ratios.append(ranked[0][1] / runner_up if runner_up > 0 else float("inf"))
        causes[cause] = {
            "first": firsts,
            "seeds": args.seeds,
            # None: the next row is exactly 0 in every seed (e.g. float32 dtype)
            "min_ratio_to_next": min(ratios) if min(ratios) != float("inf") else None,
        }
        print(f"{cause:14s} first in {firsts}/{args.seeds}, min ratio {min(ratios):.3g}",
              flush=True)  # fmt: skip
    data = {
        "benchmark": "attribution-seeds",
        "causes": causes,
        "seconds": time.perf_counter() - started,
    }
    write_json(args.json, data, "tests.benchmarks.bench_attribution_seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
