"""Over seeds: mean and spread of every summary figure, paired differences against float32,
the pre-registered degradation verdict, and the run's CPU time.

The verdict implements the criterion docs/sanity.md pre-registers for the ``long`` preset
(fixed before any full run). Per seed, a dtype **degrades** when its final-window accuracy is
at least ``MARGIN`` below float32's in the same seed (same pretrained weights, same sampling
seeds), or when it collapses (final window ``COLLAPSE_DROP`` below its own best window) while
float32 does not. A dtype degrades overall when it degrades in a majority of the seeds. The
paper's consequence is reproduced when bfloat16 degrades and float16 does not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from precision_plugin.sanity.fields import COLLAPSE_DROP, PRESETS, SUMMARY_FIELDS

#: Final-window accuracy this far below float32's (same seed) counts as degraded.
MARGIN = 0.10
#: Summary fields aggregated over seeds (numbers only).
NUMERIC_FIELDS: tuple[str, ...] = tuple(
    f for f in SUMMARY_FIELDS if f not in ("window", "collapsed")
)
CONTROL = "float32"


def spread(values: Iterable[float | None]) -> dict[str, Any] | None:
    """``{"mean", "sd", "min", "max", "n"}`` over the finite ``values`` (``sd``: sample standard
    deviation, 0 for one value); None when there is none."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return None
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return {"mean": mean, "sd": sd, "min": min(xs), "max": max(xs), "n": len(xs)}


def aggregate(result: Any) -> dict[str, Any]:
    """``{"aggregate", "paired", "k3_ratio_bf16_over_fp16", "verdict", "timing"}`` of a
    [`SanityResult`][precision_plugin.sanity.SanityResult]."""
    seeds = result.seeds
    dtypes = list(result.config.dtypes)
    per_dtype = {
        d: {f: spread(s.runs[d].summary.get(f) for s in seeds) for f in NUMERIC_FIELDS}
        | {"collapsed_seeds": [s.seed for s in seeds if s.runs[d].summary.get("collapsed")]}
        for d in dtypes
    }
    paired = {}
    if CONTROL in dtypes:
        for d in dtypes:
            if d != CONTROL:
                paired[d] = {
                    "final_accuracy_minus_float32": spread(
                        _difference(s, d, "final_accuracy") for s in seeds
                    ),
                    "peak_accuracy_minus_float32": spread(
                        _difference(s, d, "peak_accuracy") for s in seeds
                    ),
                }
    return {
        "aggregate": per_dtype,
        "paired": paired,
        "k3_ratio_bf16_over_fp16": spread(s.k3_ratio_bf16_over_fp16 for s in seeds),
        "verdict": verdict(result),
        "timing": timing(result),
    }


def _difference(seed_run: Any, dtype: str, field: str) -> float | None:
    a = seed_run.runs[dtype].summary.get(field)
    b = seed_run.runs[CONTROL].summary.get(field)
    return a - b if a is not None and b is not None else None


def degraded(seed_run: Any, dtype: str) -> bool:
    """Whether ``dtype`` degraded against float32 in this seed (the module's criterion)."""
    run, control = seed_run.runs[dtype].summary, seed_run.runs[CONTROL].summary
    a, b = run.get("final_accuracy"), control.get("final_accuracy")
    below = a is not None and b is not None and a <= b - MARGIN
    return bool(below or (run.get("collapsed") and not control.get("collapsed")))


def verdict(result: Any) -> dict[str, Any]:
    """The pre-registered degradation verdict (None values when float32 did not run)."""
    config = result.config
    long = PRESETS["long"]
    complete = (
        config.steps >= long["steps"]
        and len(config.seeds) >= len(long["seeds"])
        and set(config.dtypes) >= {"float32", "float16", "bfloat16"}
    )
    out: dict[str, Any] = {
        "criterion": (
            f"per seed, a dtype degrades when its final-window accuracy is >= {MARGIN:g} below "
            f"float32's, or it collapses (final window >= {COLLAPSE_DROP:g} below its best "
            f"window) while float32 does not; it degrades overall in a majority of seeds"
        ),
        "margin": MARGIN,
        "collapse_drop": COLLAPSE_DROP,
        "protocol_complete": complete,
        "dtypes": {},
        "paper_consequence_reproduced": None,
    }
    if CONTROL not in config.dtypes:
        return out
    for d in config.dtypes:
        if d == CONTROL:
            continue
        hits = [s.seed for s in result.seeds if degraded(s, d)]
        out["dtypes"][d] = {
            "degraded_seeds": hits,
            "degrades": len(hits) > len(result.seeds) / 2,
        }
    bf16, fp16 = out["dtypes"].get("bfloat16"), out["dtypes"].get("float16")
    if bf16 is not None and fp16 is not None:
        out["paper_consequence_reproduced"] = bf16["degrades"] and not fp16["degrades"]
    return out


def timing(result: Any) -> dict[str, Any]:
    """CPU seconds (process time) of pretraining per seed and of a GRPO step per dtype, the
    run's totals, and the preset's full protocol extrapolated from those rates."""
    config, seeds = result.config, result.seeds
    pre = spread(s.pretrain.get("cpu_seconds") for s in seeds)
    per_step = {
        d: spread(s.runs[d].cpu_seconds / max(1, len(s.runs[d].steps)) for s in seeds)
        for d in config.dtypes
    }
    cpu = sum(s.pretrain.get("cpu_seconds", 0.0) for s in seeds) + sum(
        r.cpu_seconds for s in seeds for r in s.runs.values()
    )
    wall = sum(s.pretrain.get("seconds", 0.0) for s in seeds) + sum(
        r.seconds for s in seeds for r in s.runs.values()
    )
    full = PRESETS[config.preset]
    full_steps = full.get("steps", config.steps)
    full_seeds = len(full.get("seeds", config.seeds))
    estimate = None
    if pre is not None and all(v is not None for v in per_step.values()):
        estimate = full_seeds * (
            pre["mean"] + full_steps * sum(v["mean"] for v in per_step.values())  # type: ignore[index]
        )
    return {
        "pretrain_cpu_seconds": pre,
        "grpo_cpu_seconds_per_step": per_step,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "preset_protocol": {"steps": full_steps, "seeds": full_seeds},
        "preset_protocol_cpu_seconds": estimate,
    }
