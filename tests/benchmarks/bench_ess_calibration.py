"""Coverage of the ESS and projected mask-share intervals under heavy tails (issue 53).

Per-sequence log-ratio sums ``S = −v/2 + √v·Z`` of ``n`` sequences (8, 16, 64), one token
each (the intervals depend on ``v·L`` only), with ``Z`` of unit variance from four laws: normal,
Laplace, Student t with 3 degrees of freedom, and a 10 % mixture with 10x the variance. For each
replicate the figures' intervals are computed as ``fit_growth`` and ``ess_interval`` /
``project(..., tails=True)`` compute them (vectorised: the expected ESS read from a table of
the library's own ``batch_ess`` over a grid of variances; ``tests/unit/
test_interval_calibration.py`` checks the first replicates against the library), and compared
with the truth of each figure, simulated from the law: the expected ESS of a batch of ``n``
(the measured figure), 64 and 256 (projected), and the two masks' shares (closed form).

``coverage`` counts every replicate, ``coverage_no_warning`` those where the heavy-tail warning
(the residuals' excess kurtosis above ``HEAVY_TAIL_KURTOSIS``) does not fire.

    .venv/bin/python -m tests.benchmarks.bench_ess_calibration [--replicates 2000] [--json F]
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
from scipy import special, stats

from precision_plugin._core.intervals import (
    COVERAGE,
    TAIL_EXCESS_KURTOSIS,
    TAIL_LAWS,
    batch_ess,
    heavy_tails,
    robust_bounds,
    z_value,
)
from precision_plugin._core.metrics.consequence import SEQUENCE_MASKS
from tests.benchmarks.report import add_json_option, write_json

LAWS: tuple[str, ...] = ("normal", "laplace", "t3", "mixture")
SIZES: tuple[int, ...] = (8, 16, 64)
BATCHES: tuple[int, ...] = (64, 256)
#: Variances of the sequence sum: bf16's on the embedded model at 256 tokens is about 0.6.
SCALES: tuple[float, ...] = (0.1, 0.5, 2.0)
#: Variance grid of the expected-ESS tables (log-spaced), and the truth's replicates.
GRID = np.exp(np.linspace(math.log(1e-3), math.log(300.0), 56))
TRUTH_DRAWS = 2_000_000


def draw(law: str, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Unit-variance draws of ``law``."""
    if law == "normal":
        return rng.standard_normal(shape)
    if law == "laplace":
        return rng.laplace(size=shape) / math.sqrt(2.0)
    if law == "t3":
        return rng.standard_t(3, size=shape) / math.sqrt(3.0)
    wide = rng.random(shape) < 0.1  # mixture: 10 % of the sums with 10x the variance
    return rng.standard_normal(shape) * np.where(wide, math.sqrt(10.0), 1.0) / math.sqrt(1.9)


def cdf(law: str, x: Any) -> Any:
    """The CDF of ``law`` (unit variance)."""
    if law == "normal":
        return stats.norm.cdf(x)
    if law == "laplace":
        return stats.laplace.cdf(x, scale=1 / math.sqrt(2.0))
    if law == "t3":
        return stats.t.cdf(np.asarray(x) * math.sqrt(3.0), 3)
    x = np.asarray(x) * math.sqrt(1.9)
    return 0.9 * stats.norm.cdf(x) + 0.1 * stats.norm.cdf(x / math.sqrt(10.0))


def _ess(x: np.ndarray) -> np.ndarray:
    n = x.shape[-1]
    log = 2 * special.logsumexp(x, axis=-1) - special.logsumexp(2 * x, axis=-1) - math.log(n)
    return np.minimum(np.exp(log), 1.0)


def true_ess(law: str, v: float, batch: int, seed: int = 123) -> float:
    """The expected ESS of ``batch`` sums of variance ``v`` from ``law`` (Monte Carlo)."""
    reps = max(2000, TRUTH_DRAWS // batch)
    return float(_ess(math.sqrt(v) * draw(law, np.random.default_rng(seed), (reps, batch))).mean())


def true_share(law: str, mask: Any, v: float) -> float:
    """The share of sums ``−v/2 + √v·Z`` that ``mask`` drops (closed form)."""
    mean, sd = -v / 2, math.sqrt(v)
    out = 0.0
    if mask.low is not None:
        out += float(cdf(law, (math.log(mask.low) - mean) / sd))
    if mask.high is not None:
        out += 1.0 - float(cdf(law, (math.log(mask.high) - mean) / sd))
    return out


_TABLES: dict[tuple[str, int], np.ndarray] = {}


def ess_table(law: str, batch: int) -> np.ndarray:
    """The library's ``batch_ess`` of ``batch`` one-token sequences over ``GRID``."""
    key = (law, batch)
    if key not in _TABLES:
        _TABLES[key] = np.array([batch_ess(float(g), 1, batch, law=law) for g in GRID])
    return _TABLES[key]


def table_ess(law: str, batch: int, v: np.ndarray) -> np.ndarray:
    """``batch_ess(v, 1, batch, law=law)`` read from the table (log-linear interpolation)."""
    return np.interp(np.log(v), np.log(GRID), ess_table(law, batch))


def ess_bounds(low: np.ndarray, high: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """``ess_hull``'s bounds, vectorised: the hull over ``TAIL_LAWS`` at the variance ends."""
    lows = np.min([table_ess(law, batch, high) for law in TAIL_LAWS], axis=0)
    highs = np.max([table_ess(law, batch, low) for law in TAIL_LAWS], axis=0)
    return lows, highs


def masks_cdf(law: str, x: np.ndarray) -> np.ndarray:
    if law == "t3":
        return 0.5 + (np.arctan(x) + x / (1.0 + x * x)) / math.pi
    return stats.norm.cdf(x)


def mask_bounds(mask: Any, fits: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``project(fit, 1, tails=True)``'s interval of ``mask``'s share, vectorised: the extremes
    over the drift box (25 points, the drift, and the drift centring a two-sided mask), 25
    variances over the tail range and ``TAIL_LAWS``."""
    half = z_value(COVERAGE) * fits["stderr"]
    steps = np.linspace(0.0, 1.0, 25)
    drifts = [fits["drift"] - half + 2 * half * t for t in steps] + [fits["drift"]]
    if mask.low is not None and mask.high is not None:
        centre = (math.log(mask.low) + math.log(mask.high)) / 2.0
        drifts.append(np.clip(centre, fits["drift"] - half, fits["drift"] + half))
    variances = [fits["low"] + (fits["high"] - fits["low"]) * t for t in steps]
    lo = np.full(fits["drift"].shape, np.inf)
    hi = np.full(fits["drift"].shape, -np.inf)
    for law in TAIL_LAWS:
        for d in drifts:
            for v in variances:
                sd = np.sqrt(v)
                share = np.zeros_like(sd)
                if mask.low is not None:
                    share = share + masks_cdf(law, (math.log(mask.low) - d) / sd)
                if mask.high is not None:
                    share = share + 1.0 - masks_cdf(law, (math.log(mask.high) - d) / sd)
                share = np.clip(share, 0.0, 1.0)
                lo, hi = np.minimum(lo, share), np.maximum(hi, share)
    return lo, hi


def sample(law: str, n: int, v: float, replicates: int, seed: int) -> np.ndarray:
    """``[replicates, n]`` sequence sums ``−v/2 + √v·Z``."""
    return -v / 2 + math.sqrt(v) * draw(law, np.random.default_rng(seed), (replicates, n))


def fits_of(s: np.ndarray) -> dict[str, np.ndarray]:
    """Each replicate's fit as ``fit_growth`` makes it from one-token sequences: drift,
    its standard error, variance, the tail statistic and the tail-aware variance range."""
    n = s.shape[1]
    drift = s.mean(axis=1)
    z = s - drift[:, None]
    variance = (z**2).sum(axis=1) / (n - 1)
    kurtosis = stats.kurtosis(z, axis=1, fisher=True, bias=False)
    low, _ = robust_bounds(variance, kurtosis, n)
    _, high = robust_bounds(variance, kurtosis, n, floor=TAIL_EXCESS_KURTOSIS)
    _, robust_high = robust_bounds(variance, kurtosis, n)
    return {
        "drift": drift,
        "stderr": np.sqrt(variance / n),
        "variance": variance,
        "kurtosis": kurtosis,
        "low": low,
        "high": np.maximum(high, robust_high),
        "warning": np.array([heavy_tails(float(k)) for k in kurtosis]),
    }


def _cell_seed(law: str, n: int, v: float) -> int:
    return (
        1000 * LAWS.index(law) + 10 * n + SCALES.index(v)
        if v in SCALES
        else 1000 * LAWS.index(law) + n
    )


def cell(law: str, n: int, v: float, replicates: int) -> dict[str, Any]:
    """One cell's coverage of each figure, with and without the replicates that warn."""
    fits = fits_of(sample(law, n, v, replicates, _cell_seed(law, n, v)))
    warn = fits["warning"]
    figures: dict[str, Any] = {}
    for name, batch in (("ess_measured", n), *((f"ess_batch_{b}", b) for b in BATCHES)):
        truth = true_ess(law, v, batch)
        low, high = ess_bounds(fits["low"], fits["high"], batch)
        figures[name] = (truth, (low <= truth) & (truth <= high))
    for mask in SEQUENCE_MASKS:
        truth = true_share(law, mask, v)
        low, high = mask_bounds(mask, fits)
        figures[f"seq_mask_fraction_{mask.key}"] = (truth, (low <= truth) & (truth <= high))
    return {
        "law": law,
        "sequences": n,
        "variance": v,
        "replicates": replicates,
        "warning_rate": float(warn.mean()),
        "figures": {
            name: {
                "truth": truth,
                "coverage": float(covered.mean()),
                "coverage_no_warning": float(covered[~warn].mean()) if (~warn).any() else None,
            }
            for name, (truth, covered) in figures.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=2000)
    add_json_option(parser)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    cells = [cell(law, n, v, args.replicates) for v in SCALES for n in SIZES for law in LAWS]
    worst = min(
        min(f["coverage"], f["coverage_no_warning"] or 1.0)
        for c in cells
        for f in c["figures"].values()
    )
    for c in cells:
        row = " ".join(
            f"{name}={f['coverage']:.3f}/{f['coverage_no_warning'] or math.nan:.3f}"
            for name, f in c["figures"].items()
        )
        print(f"v={c['variance']:<4g} n={c['sequences']:<3d} {c['law']:8s} "
              f"warn={c['warning_rate']:.3f} {row}")  # fmt: skip
    print(f"lowest coverage: {worst:.3f} (nominal {COVERAGE}); {time.perf_counter() - start:.0f} s")
    data = {
        "coverage": COVERAGE,
        "tail_excess_kurtosis": TAIL_EXCESS_KURTOSIS,
        "laws": list(LAWS),
        "cells": cells,
        "lowest_coverage": worst,
    }
    write_json(args.json, data, "tests.benchmarks.bench_ess_calibration", argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
