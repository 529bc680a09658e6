"""Wall time of ``precision-plugin probe`` plain against ``--attribute`` on the same model.

    .venv/bin/python -m tests.benchmarks.bench_attribution_time [--model PATH]
        [--repeats 1] [--json FILE] [-- further probe options]

Each run is the real command line in its own subprocess (``python -m precision_plugin probe``),
plain, with ``--attribute`` (the probe's own samples are attributed) and with ``--attribute
--rollout top_p=0.9,logprobs_mode=processed_logprobs,kv_cache_dtype=fp8_e4m3`` (the rollout
samples again with the settings), in turn, ``--repeats`` times; the probe's own ``seconds`` and
the attribution's are read from each run's JSON. Prints the medians and the ratio to the plain
probe (the issue's target: ``--attribute`` at most 3x), with the rescoring passes of the
causes switched together that each dtype's shares took (counted in the times); ``--json FILE``
writes them with their provenance. A script, not a test: speed is measured, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from tests.benchmarks.report import add_json_option, write_json
from tests.benchmarks.timed_probe import timed_probe

ROLLOUT = "top_p=0.9,logprobs_mode=processed_logprobs,kv_cache_dtype=fp8_e4m3"
SETUPS: dict[str, list[str]] = {
    "plain": [],
    "attribute": ["--attribute"],
    "attribute+rollout": ["--rollout", ROLLOUT],
}


def run_once(extra: list[str], probe_args: list[str]) -> dict[str, Any]:
    """One probe run in a subprocess: its wall time and the seconds its JSON reports."""
    run = timed_probe([*probe_args, *extra], {"OMP_NUM_THREADS": "1"})
    attribution = run.data.get("attribution") or {}
    return {
        "wall_s": run.wall_s,
        "probe_s": run.data["seconds"],
        "attribution_s": attribution.get("seconds"),
        # the rescoring passes of the cause subsets (Shapley: the 2^k - 1 non-empty subsets of
        # the k causes, the k single-cause rows among them), counted in the times above
        "subset_passes": {
            dtype: (entry.get("together") or {}).get("passes")
            for dtype, entry in (attribution.get("dtypes") or {}).items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Run the setups in turn and print (and optionally write) the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a local checkpoint folder (default: the embedded model)")
    parser.add_argument("--repeats", type=int, default=1)
    add_json_option(parser)
    args, rest = parser.parse_known_args(argv)
    probe_args = (["--model", args.model] if args.model else []) + [a for a in rest if a != "--"]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETUPS}
    for _ in range(args.repeats):
        for name, extra in SETUPS.items():
            runs[name].append(run_once(extra, probe_args))
            print(f"{name}: {runs[name][-1]['wall_s']:.1f} s", flush=True)
    median = {n: statistics.median(r["wall_s"] for r in rs) for n, rs in runs.items()}
    data = {
        "benchmark": "attribution-time",
        "model": args.model or "embedded",
        "probe_args": probe_args,
        "runs": runs,
        "median_wall_s": median,
        "ratio_to_plain": {n: median[n] / median["plain"] for n in SETUPS},
    }
    for name in SETUPS:
        print(f"{name:20s} {median[name]:8.1f} s  {data['ratio_to_plain'][name]:.2f}x plain")
    write_json(args.json, data, "tests.benchmarks.bench_attribution_time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
