"""Wall time of ``precision-plugin probe`` with an earlier tree of the code against this one.

    mkdir -p /tmp/base && git archive f38df7f | tar -x -C /tmp/base
    .venv/bin/python -m tests.benchmarks.bench_probe_speed --base /tmp/base [--model PATH]
        [--repeats 2] [--threads 1] [--attribute] [--json FILE] [-- further probe options]

Each run is the real command line in its own subprocess (``python -m precision_plugin probe``)
with ``PYTHONPATH`` set to the earlier tree (``base``) or to this one (``new``), both with the
same ``OMP_NUM_THREADS``; the two alternate, ``--repeats`` times each, so the machine's drift
hits both alike, and the load average is recorded before each run. Per dtype, each run's k3 and
per-sequence log-ratios are kept, to show the numbers did not move (``identical``: the same k3
and the same per-sequence log-ratios in every run of both). ``--attribute`` adds one
``--attribute`` run of this tree per repeat (the issue's target: at most 3x the plain probe);
its ``total`` row gives each dtype's k3 with its 95 % interval (bootstrap over sequences), and
``within_interval`` says whether the earlier code's k3 lies inside it (a change of kernels may
move k3 by rounding, not by more than its sampling uncertainty).
Prints the medians and the ratio; ``--json FILE`` writes them with their provenance. A script,
not a test: speed is measured, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from tests.benchmarks.report import add_json_option, write_json
from tests.benchmarks.timed_probe import timed_probe

ROOT = Path(__file__).resolve().parents[2]


def run_once(tree: Path, threads: int, args: list[str]) -> dict[str, Any]:
    """One probe run of the code in ``tree``: wall time, the probe's seconds, k3 per dtype."""
    env = {"PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    run = timed_probe(args, env, in_tmp=True)
    results = run.data["results"]
    attribution = run.data.get("attribution") or {}
    return {
        "wall_s": run.wall_s,
        "probe_s": run.data["seconds"],
        "attribution_s": attribution.get("seconds"),
        "load_average_1min": run.load_average_1min,
        "dtype_s": {d: r["seconds"] for d, r in results.items()},
        "k3": {d: r["k3_kl"] for d, r in results.items()},
        "seq_log_ratio": {d: r["seq_log_ratio"] for d, r in results.items()},
        "k3_interval": {
            d: a["total"]["k3_interval"] for d, a in (attribution.get("dtypes") or {}).items()
        },
    }


def within_interval(base: list[dict[str, Any]], attributed: list[dict[str, Any]]) -> bool | None:
    """Whether every base run's k3 lies in the first ``--attribute`` run's interval for its
    dtype (``None`` without an ``--attribute`` run)."""
    if not attributed:
        return None
    intervals = attributed[0]["k3_interval"]
    return all(
        intervals[d][0] <= k3 <= intervals[d][1]
        for run in base
        for d, k3 in run["k3"].items()
        if d in intervals
    )


def same_numbers(runs: list[dict[str, Any]]) -> bool:
    """Whether every run has the same k3 and per-sequence log-ratios in every dtype."""
    first = runs[0]
    return all(r["k3"] == first["k3"] and r["seq_log_ratio"] == first["seq_log_ratio"]
               for r in runs)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Alternate the two trees, print (and optionally write) the medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a tree of the earlier code (git archive)")
    parser.add_argument("--model", help="a local checkpoint folder (default: the embedded model)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every run")
    parser.add_argument("--attribute", action="store_true", help="also time --attribute (new)")
    add_json_option(parser)
    args, rest = parser.parse_known_args(argv)
    model = ["--model", str(Path(args.model).resolve())] if args.model else []
    probe_args = model + [a for a in rest if a != "--"]
    trees = {"base": Path(args.base).resolve(), "new": ROOT}
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    if args.attribute:
        runs["new --attribute"] = []
    for _ in range(args.repeats):
        for name in runs:
            extra = ["--attribute"] if name.endswith("--attribute") else []
            tree = trees[name.split()[0]]
            runs[name].append(run_once(tree, args.threads, probe_args + extra))
            print(f"{name}: {runs[name][-1]['wall_s']:.1f} s", flush=True)
    median = {n: statistics.median(r["wall_s"] for r in rs) for n, rs in runs.items()}
    plain = runs["base"] + runs["new"]
    data = {
        "benchmark": "probe-speed",
        "model": args.model or "embedded",
        "probe_args": [a for a in rest if a != "--"],
        "threads": args.threads,
        "base": args.base,
        "runs": runs,
        "median_wall_s": median,
        "speedup": median["base"] / median["new"],
        "k3": {n: rs[0]["k3"] for n, rs in runs.items() if n in ("base", "new")},
        "identical": same_numbers(plain),
    }
    if args.attribute:
        data["attribute_over_plain"] = median["new --attribute"] / median["new"]
        data["k3_interval"] = runs["new --attribute"][0]["k3_interval"]
        data["within_interval"] = within_interval(runs["base"], runs["new --attribute"])
    for name in runs:
        print(f"{name:16s} {median[name]:8.1f} s")
    print(f"speedup {data['speedup']:.2f}x; k3 and per-sequence log-ratios identical: "
          f"{data['identical']}")  # fmt: skip
    if args.attribute:
        print(f"--attribute / plain (new): {data['attribute_over_plain']:.2f}x; base k3 inside "
              f"the new k3's interval: {data['within_interval']}")  # fmt: skip
    write_json(args.json, data, "tests.benchmarks.bench_probe_speed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
