"""Choose the ``long`` sanity preset's learning rate on float32 only (the pre-registered rule).

    .venv/bin/python scripts/sanity_lr_choice.py --json docs/results/sanity-long-lr.json

Runs the preset in float32 alone, one run per learning rate of the grid, on a seed that is not
one of the protocol's (100), for the preset's number of steps, and picks the learning rate with
the highest final-window accuracy among the runs that do not collapse (docs/sanity.md,
"The long preset"). No float16 or bfloat16 run takes part. Prints one line per run as it
finishes and writes the results file (with its provenance) that docs/sanity.md renders.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from precision_plugin._base.provenance import write_results
from precision_plugin.sanity import preset_config, run_sanity

GRID: tuple[float, ...] = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
SEED = 100


def choose(runs: list[dict[str, Any]]) -> float | None:
    """The learning rate with the highest final-window accuracy among runs that did not
    collapse (the first of equals), or None when every run collapsed."""
    kept = [r for r in runs if not r["collapsed"] and r["final_accuracy"] is not None]
    return max(kept, key=lambda r: r["final_accuracy"])["learning_rate"] if kept else None


def main(argv: list[str] | None = None) -> int:
    """Run the grid, print a line per run, write ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write the results file here")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: preset)")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed (default: {SEED})")
    parser.add_argument(
        "--grid", default=",".join(f"{x:g}" for x in GRID), help="comma list of learning rates"
    )
    args = parser.parse_args(argv)
    grid = [float(x) for x in args.grid.split(",")]
    runs = []
    for lr in grid:
        config = preset_config(
            "long", seeds=(args.seed,), dtypes=("float32",), learning_rate=lr, steps=args.steps
        )
        result = run_sanity(config)
        seed_run = result.seeds[0]
        run = seed_run.runs["float32"]
        row = {
            "learning_rate": lr,
            **{
                k: run.summary[k]
                for k in (
                    "first_accuracy",
                    "peak_accuracy",
                    "final_accuracy",
                    "collapsed",
                    "cpu_seconds",
                )
            },
            "pretrain_sampled_accuracy": seed_run.pretrain["sampled_accuracy"],
            "accuracy": [s.accuracy for s in run.steps],
        }
        runs.append(row)
        print(
            f"lr {lr:g}: accuracy first {row['first_accuracy']:.3f}, best "
            f"{row['peak_accuracy']:.3f}, final {row['final_accuracy']:.3f}, collapsed "
            f"{row['collapsed']}, {row['cpu_seconds']:.0f} CPU s",
            flush=True,
        )
    chosen = choose(runs)
    print(f"chosen learning rate: {chosen}")
    if args.json:
        data = {
            "benchmark": "sanity-long-lr-choice",
            "seed": args.seed,
            "steps": config.steps,
            "window": config.window,
            "rule": "highest final-window float32 accuracy among runs that do not collapse",
            "runs": runs,
            "chosen_learning_rate": chosen,
        }
        write_results(args.json, data, [".venv/bin/python", *sys.argv])
    return 0


if __name__ == "__main__":
    sys.exit(main())
