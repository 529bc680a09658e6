"""The drift canary on CPU with the TRL recipe: false alarms, overhead, and the fire drills.

    .venv/bin/python -m tests.benchmarks.bench_canary false-alarms [--steps 500] [--every 5] [--json FILE]
    .venv/bin/python -m tests.benchmarks.bench_canary overhead [--runs 5] [--steps 40] [--json FILE]
    .venv/bin/python -m tests.benchmarks.bench_canary drills [--steps 30] [--every 5] [--json FILE]
    .venv/bin/python -m tests.benchmarks.bench_canary levels [--steps 5] [--json FILE]
    .venv/bin/python -m tests.benchmarks.bench_canary plot   # docs/assets/canary-drills.png

``false-alarms``: one clean GRPO run (recipe defaults: tiny Llama, HFRollout, float16, learning
rate 1e-3) of ``--steps`` steps with a check every ``--every``: how many checks left the band and
how many alarms were raised (goal 0). ``overhead``: the canary's own work per check (both sides'
scoring, timed around it; the one-off level-2 certification excluded and reported apart),
divided by the default ``metrics.canary_every``, against the median GRPO step (TRL's
``step_time``), medians over ``--runs`` runs. ``drills``: each fire drill's timeline (step,
canary k3, ratio, verdict) with the model, learning rate and K it ran under. Scripts, not tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tests.benchmarks.report import add_json_option, write_json

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.benchmarks.bench_canary"


def _recipe() -> Any:
    spec = importlib.util.spec_from_file_location("recipe", ROOT / "integrations/trl/grpo_fp16.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _finite(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else None


def _run(argv: list[str]) -> dict[str, Any]:
    report = _recipe().main([*argv, "--output-dir", tempfile.mkdtemp()])
    return report


def _checks_of(trainer_report: dict[str, Any]) -> list[dict[str, Any]]:
    return trainer_report["canary_checks"]


def false_alarms(steps: int, every: int) -> dict[str, Any]:
    """One clean run: checks, out-of-band checks, alarms."""
    report = _run(["--max-steps", str(steps), "--canary-every", str(every)])
    checks = report["canary_checks"]
    out = [c for c in checks if not c["canary_in_band"]]
    ratios = [c["canary_ratio"] for c in checks]
    return {
        "model": "recipe tiny Llama (1 layer, hidden 32), built in code",
        "dtype": report["dtype"],
        "learning_rate": report["learning_rate"],
        "steps": report["steps"],
        "canary_every": every,
        "checks": len(checks),
        "out_of_band_checks": len(out),
        "false_alarms": 0 if report["canary_alarm"] is None else 1,
        "alarm": report["canary_alarm"],
        "band_upper_ratio": report["canary_band_upper_ratio"],
        "max_ratio": max(ratios) if ratios else None,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "timeline": [{k: _finite(v) for k, v in c.items()} for c in checks],
    }


def overhead(runs: int, steps: int) -> dict[str, Any]:
    """The canary's work per check / the default K, against the median GRPO step."""
    from precision_plugin.policy import PrecisionPolicy

    default_every = PrecisionPolicy().metrics.canary_every
    per_check: list[float] = []
    certify: list[float] = []
    step_times: list[float] = []
    for _ in range(runs):
        report = _run(["--max-steps", str(steps), "--canary-every", "5"])
        per_check += report["canary_seconds"][1:]  # the floor check also builds the scorers
        certify.append(report["canary_certify_seconds"])
        step_times += report["step_times"][1:]  # the first step builds the rollout copy
    check = statistics.median(per_check)
    step = statistics.median(step_times)
    return {
        "canary_every_default": default_every,
        "median_check_s": check,
        "median_step_s": step,
        "checks_timed": len(per_check),
        "steps_timed": len(step_times),
        "overhead_pct_at_default": 100 * check / default_every / step,
        "certification_once_s": statistics.median(certify),
        "runs": runs,
        "steps_per_run": steps,
    }


def drills(steps: int, every: int) -> dict[str, Any]:
    """Each drill's timeline and the clean runs beside them."""
    at = 10
    setups = {
        "stale-weights": ["--drill", f"stale-weights@{at}"],
        "engine-drift": ["--drill", f"engine-drift@{at}", "--learning-rate", "0"],
        "clean": [],
        "clean-lr0": ["--learning-rate", "0"],
    }
    out: dict[str, Any] = {"steps": steps, "canary_every": every, "drill_step": at, "runs": {}}
    for name, extra in setups.items():
        report = _run(["--max-steps", str(steps), "--canary-every", str(every), *extra])
        out["runs"][name] = {
            "learning_rate": report["learning_rate"],
            "alarm": report["canary_alarm"],
            "band_upper_ratio": report["canary_band_upper_ratio"],
            "timeline": [{k: _finite(v) for k, v in c.items()} for c in report["canary_checks"]],
        }
    return out


def levels(steps: int) -> dict[str, Any]:
    """The precision level each CPU configuration of the recipe reaches, with the evidence."""
    configs = {
        "float16, HFRollout padding its batch": ["--dtype", "float16"],
        "bfloat16, HFRollout padding its batch": ["--dtype", "bfloat16"],
        "float16, HFRollout(max_batch=1)": ["--dtype", "float16", "--rollout-batch", "1"],
        "bfloat16, HFRollout(max_batch=1)": ["--dtype", "bfloat16", "--rollout-batch", "1"],
    }
    out: dict[str, Any] = {"steps": steps, "configs": {}}
    for name, extra in configs.items():
        report = _run(["--max-steps", str(steps), "--canary-every", "5", *extra])
        last = report["canary_checks"][-1]
        out["configs"][name] = {
            "level": report["level"],
            "canary_bitwise_equal_frac": last["canary_bitwise_equal_frac"],
            "invariance": report["canary_invariance"],
        }
    return out


def plot(results: Path, out: Path) -> None:
    """The drills figure: each run's canary ratio to its floor per check (log scale), its band's
    upper edge, and the alarm, from the ``drills`` results file."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(results.read_text(encoding="utf-8"))
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    for name, run in data["runs"].items():
        steps = [c["step"] for c in run["timeline"]]
        ratios = [c["canary_ratio"] for c in run["timeline"]]
        (line,) = ax.plot(steps, ratios, marker="o", label=f"{name} (lr {run['learning_rate']:g})")
        if run["band_upper_ratio"]:
            ax.axhline(run["band_upper_ratio"], color=line.get_color(), lw=0.8, ls=":")
        alarm = run["alarm"]
        if alarm is not None:
            at = steps.index(alarm["step"])
            ax.annotate(
                alarm["verdict"], (steps[at], ratios[at]), textcoords="offset points",
                xytext=(6, -12), fontsize=8, color=line.get_color(),
            )  # fmt: skip
    ax.axvline(data["drill_step"], color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("canary k3 / floor (over the float32 reference)")
    ax.set_title(
        f"Drift canary fire drills: drills start at step {data['drill_step']}, a check every "
        f"{data['canary_every']} steps (dotted: band edges)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> dict[str, Any]:
    """Run the chosen measurement, print it and (``--json FILE``) write it."""
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["false-alarms", "overhead", "drills", "levels", "plot"])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    add_json_option(parser)
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    if options.what == "plot":  # the figure of docs/canary.md, from the drills results file
        plot(ROOT / "docs/results/canary-drills.json", ROOT / "docs/assets/canary-drills.png")
        return {}
    if options.what == "false-alarms":
        result = false_alarms(options.steps or 500, options.every)
        print(
            f"{result['steps']} clean steps, {result['checks']} checks: "
            f"{result['out_of_band_checks']} out of band, {result['false_alarms']} false alarms "
            f"(max ratio {result['max_ratio']:.3g}, band up to {result['band_upper_ratio']:.3g}x)"
        )
    elif options.what == "overhead":
        result = overhead(options.runs, options.steps or 40)
        print(
            f"canary check {result['median_check_s'] * 1e3:.2f} ms every "
            f"{result['canary_every_default']} steps of {result['median_step_s'] * 1e3:.1f} ms: "
            f"{result['overhead_pct_at_default']:.3f} % of a step"
        )
    elif options.what == "levels":
        result = levels(options.steps or 5)
        for name, config in result["configs"].items():
            print(f"{name}: level {config['level']:.0f} ({config['invariance']})")
    else:
        result = drills(options.steps or 30, options.every)
        for name, run in result["runs"].items():
            print(name, run["alarm"])
    write_json(options.json, result, MODULE)
    return result


if __name__ == "__main__":
    main()
