"""``precision-plugin sanity --plot FILE.png``: accuracy, mismatch and gradient cosine per step.

One line per dtype, the mean over seeds at each step, with a band from the lowest to the highest
seed. Left, the GRPO training accuracy (the paper's sanity-test curve; a trailing mean over a
few steps, since one step holds only prompts × generations samples); middle, the online
train/rollout k3 KL on a log axis (the paper's ``kl_sample_train``); right, 1 − the cosine
between the plain and the importance-corrected policy gradient (log axis) when the readout ran,
else the largest per-token probability gap; last, when the steps logged it, 1 − the effective
sample size of the batch's sequence importance weights (log axis; ``precision/ess``, what an
importance-sampling correction would keep of the batch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from precision_plugin.probe.plot import require_matplotlib

_COLORS = {"float32": "#4c72b0", "float16": "#55a868", "bfloat16": "#c44e52"}


def smoothing(steps: int) -> int:
    """Steps in the accuracy panel's trailing mean: a thirtieth of the run, at least 1."""
    return max(1, steps // 30)


def series(
    data: dict[str, Any], dtype: str, field: str, smooth: int = 1
) -> list[tuple[int, float, float, float]]:
    """``(step, mean, low, high)`` over the seeds of ``field`` at each step of ``dtype``: the
    mean and range across seeds of each seed's trailing mean over ``smooth`` steps (steps where
    any seed logged nothing, or a non-finite value, are left out)."""
    per_seed = []
    for seed in data["seeds"]:
        steps = seed["runs"][dtype]["steps"]
        values = {s["step"]: _value(s, field) for s in steps}
        ordered = sorted(values)
        smoothed = {}
        for i, step in enumerate(ordered):
            window = [values[k] for k in ordered[max(0, i - smooth + 1) : i + 1]]
            if all(v is not None for v in window):
                smoothed[step] = sum(window) / len(window)  # type: ignore[arg-type]
        per_seed.append(smoothed)
    common = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    out = []
    for step in common:
        xs = [s[step] for s in per_seed]
        out.append((step, sum(xs) / len(xs), min(xs), max(xs)))
    return out


def _value(step: dict[str, Any], field: str) -> float | None:
    import math

    if field == "one_minus_cosine":
        cos = step.get("grad_cosine")
        value = None if cos is None else max(1.0 - cos, 1e-12)
    elif field == "one_minus_ess":
        ess = (step.get("telemetry") or {}).get("ess")
        value = None if ess is None else max(1.0 - ess, 1e-12)
    else:
        value = step.get(field)
    return value if value is not None and math.isfinite(value) else None


def _logged(data: dict[str, Any], read: Any) -> bool:
    return any(
        read(s) is not None
        for seed in data["seeds"]
        for run in seed["runs"].values()
        for s in run["steps"]
    )


def panels(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The figure's panels for a sanity document: ``(field, title, y scale)`` each."""
    smooth = smoothing(data["config"]["steps"])
    has_cosine = _logged(data, lambda s: s.get("grad_cosine"))
    third = (
        ("one_minus_cosine", "1 − cos(plain PG, importance-corrected PG)", "log")
        if has_cosine
        else ("prob_diff_max", "max |p_train − p_rollout| (precision/prob_diff_max)", "log")
    )
    chosen = [
        ("accuracy", "training accuracy" + (f" ({smooth}-step mean)" if smooth > 1 else ""),
         "linear"),
        ("k3_kl", "train/rollout k3 KL (precision/k3_kl)", "log"),
        third,
    ]  # fmt: skip
    if _logged(data, lambda s: (s.get("telemetry") or {}).get("ess")):
        chosen.append(
            ("one_minus_ess", "1 − ESS of the sequence IS weights (precision/ess)", "log")
        )
    return chosen


def plot_sanity(result: Any, path: str | Path) -> Path:
    """Draw the figure for a ``SanityResult`` (or its JSON form) and save it."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    data = result if isinstance(result, dict) else result.to_dict()
    config = data["config"]
    smooth = smoothing(config["steps"])
    chosen = panels(data)
    fig, axes = plt.subplots(1, len(chosen), figsize=(5 * len(chosen), 4.2))
    for ax, (field, name, scale) in zip(axes, chosen, strict=True):
        for dtype in config["dtypes"]:
            points = series(data, dtype, field, smooth if field == "accuracy" else 1)
            if scale == "log":
                points = [p for p in points if p[2] > 0]
            if not points:
                continue
            steps, mean, low, high = zip(*points, strict=True)
            color = _COLORS.get(dtype)
            ax.plot(steps, mean, label=dtype, color=color, linewidth=1.4)
            if len(data["seeds"]) > 1:
                ax.fill_between(steps, low, high, color=color, alpha=0.18, linewidth=0)
        ax.set_yscale(scale)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(loc="lower right")
    seeds = [s["seed"] for s in data["seeds"]]
    ratio = data.get("k3_ratio_bf16_over_fp16")
    headline = f"; mean k3 bf16/fp16 = {ratio['mean']:.0f}x" if ratio else ""
    band = "; line: mean over seeds, band: their range" if len(seeds) > 1 else ""
    fig.suptitle(
        f"Sanity GRPO ({config['preset']}): {config['model_size']} Llama "
        f"({data['model']['parameters']:,} params), {config['steps']} steps, seeds "
        f"{','.join(map(str, seeds))}, engine {config['engine']}{headline}{band}",
        fontsize=11,
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
