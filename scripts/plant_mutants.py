"""Plant the seven one-line bugs of issue 52 that once survived the tests, one at a time, and
check that a test fails on each.

Each mutant is applied to a scratch copy of the package (``precision_plugin/`` and ``tests/``
copied to a temporary folder; the working tree is never touched), then the tests named beside it
run there with ``python -m pytest``. First the same tests run on the unmutated copy (they must
pass, and must import the copy, not the working tree). Prints one line per mutant, ``caught`` or
``MISSED``; exits 1 if any is missed or the baseline fails.

    .venv/bin/python scripts/plant_mutants.py            # all seven (about a minute)
    .venv/bin/python scripts/plant_mutants.py --list     # the mutants and their tests
    .venv/bin/python scripts/plant_mutants.py band       # the mutants whose name holds 'band'
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = "tests/unit/test_planted_mutants.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    old: str  # the line's text as it is (must occur exactly once in the file)
    new: str  # the bug
    tests: tuple[str, ...]  # pytest node ids that must fail on it
    seen: str  # what a user would see


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "band-quantile",
        "precision_plugin/_core/canary/band.py",
        "q = float(torch.quantile(means, 1.0 - alpha))",
        "q = float(torch.quantile(means, 1.0 - alpha / 2))",
        (f"{TESTS}::test_the_band_is_the_one_sided_1_minus_alpha_bound_it_states",),
        "every band wider than documented",
    ),
    Mutant(
        "stale-since-last",
        "precision_plugin/_core/canary/monitor.py",
        "since = same[0].step",
        "since = same[-1].step",
        (f"{TESTS}::test_a_rollout_frozen_at_step_5_is_stale_since_5_at_every_later_check",),
        '"stale since 15" for a freeze at 5',
    ),
    Mutant(
        "ladder-seed-dropped",
        "precision_plugin/_core/canary/ladder.py",
        "max_new_tokens, seed + first),",
        "max_new_tokens, seed),",
        (f"{TESTS}::test_a_batch_invariant_engine_with_more_prompts_than_one_batch_is_certified",),
        "a batch-invariant engine with more prompts than one batch refused level 2",
    ),
    Mutant(
        "misfit-half",
        "precision_plugin/_core/misfit.py",
        "k = max(2, n // 3)",
        "k = max(2, n // 2)",
        (f"{TESTS}::test_the_misfit_check_takes_the_longest_third",),
        "the misfit check takes the longest half instead of the longest third",
    ),
    Mutant(
        "deepspeed-window-key",
        "precision_plugin/deepspeed/config.py",
        '"loss_scale_window": "loss_scaler.growth_interval",',
        '"loss_scale_window": "loss_scaler.growth_factor",',
        (f"{TESTS}::test_a_replaced_loss_scale_window_names_loss_scaler_growth_interval",),
        "the DeepSpeed warning names loss_scaler.growth_factor for loss_scale_window",
    ),
    Mutant(
        "master-copy-any",
        "precision_plugin/_core/master_copy.py",
        'if tensors and all(str(t.dtype) == "torch.float32" for t in tensors):',
        'if tensors and any(str(t.dtype) == "torch.float32" for t in tensors):',
        (f"{TESTS}::test_a_master_copy_partly_in_half_precision_is_no_float32_master_copy",),
        "a master copy partly in half precision accepted",
    ),
    Mutant(
        "areal-switch-minus-one",
        "precision_plugin/_core/configs/values.py",
        "return value != 0",
        "return value > 0",
        (f"{TESTS}::test_an_areal_switch_reads_any_nonzero_integer_as_on",),
        "an AReaL switch -1 read as off",
    ),
)


def _copy(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in ("precision_plugin", "tests"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml",):
        shutil.copy2(ROOT / name, dest / name)


def _pytest(where: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(where), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(
            cmd, cwd=where, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    return done.returncode, done.stdout + done.stderr


def _imports_the_copy(where: Path) -> bool:
    env = dict(os.environ, PYTHONPATH=str(where), PYTHONDONTWRITEBYTECODE="1")
    code = "import precision_plugin, sys; sys.stdout.write(precision_plugin.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=where, env=env, capture_output=True, text=True
    )
    return done.returncode == 0 and Path(done.stdout).resolve().is_relative_to(where.resolve())


def plant(mutant: Mutant, where: Path) -> str:
    """Write ``mutant`` into the copy at ``where``; return the original text to restore."""
    path = where / mutant.path
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise SystemExit(
            f"plant_mutants: {mutant.name}: {mutant.path} holds {count} copies of {mutant.old!r} "
            f"(expected exactly one); update MUTANTS in scripts/plant_mutants.py to the code."
        )
    path.write_text(text.replace(mutant.old, mutant.new))
    return text


def run(selected: tuple[Mutant, ...], timeout: float = 300.0) -> int:
    missed = 0
    with tempfile.TemporaryDirectory(prefix="plant-mutants-") as scratch:
        where = Path(scratch)
        _copy(where)
        if not _imports_the_copy(where):
            print("plant_mutants: the scratch copy is not what python imports; stopped.")
            return 1
        every = tuple(dict.fromkeys(t for m in selected for t in m.tests))
        start = time.monotonic()
        rc, out = _pytest(where, every, timeout)
        if rc != 0:
            print(f"plant_mutants: the tests fail without any mutant (rc {rc}):\n{out[-3000:]}")
            return 1
        print(f"baseline: {len(every)} tests pass on the copy ({time.monotonic() - start:.0f} s)")
        for mutant in selected:
            original = plant(mutant, where)
            try:
                start = time.monotonic()
                rc, out = _pytest(where, mutant.tests, timeout)
            finally:
                (where / mutant.path).write_text(original)
            took = time.monotonic() - start
            if rc == 1:  # a test failed: the bug is caught
                print(f"caught  {mutant.name:24} {mutant.path} ({took:.0f} s)")
            else:
                missed += 1
                why = "the tests pass" if rc == 0 else f"pytest exit {rc}, not a failed test"
                print(f"MISSED  {mutant.name:24} {mutant.path}: {why} ({mutant.seen})")
                if rc != 0:
                    print(out[-2000:])
    print(f"{len(selected) - missed} of {len(selected)} planted bugs caught")
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="run only mutants whose name holds one of these")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests")
    args = parser.parse_args(argv)
    selected = tuple(m for m in MUTANTS if not args.names or any(n in m.name for n in args.names))
    if not selected:
        parser.error(f"no mutant matches {args.names}; --list shows them")
    if args.list:
        for m in selected:
            print(f"{m.name}: {m.path}: {m.old!r} -> {m.new!r}\n    {', '.join(m.tests)}")
        return 0
    return run(selected)


if __name__ == "__main__":
    sys.exit(main())
