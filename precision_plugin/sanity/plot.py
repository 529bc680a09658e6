"""``precision-plugin sanity --plot FILE.png``: training accuracy and mismatch per step, per dtype.

Left, the GRPO training accuracy (the paper's sanity-test curve); middle, the online
train/rollout k3 KL on a log axis (the paper's ``kl_sample_train``); right, the largest
per-token probability gap between the two sides at each step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from precision_plugin.probe.plot import require_matplotlib

_COLORS = {"float32": "#4c72b0", "float16": "#55a868", "bfloat16": "#c44e52"}


def plot_sanity(result: Any, path: str | Path) -> Path:
    """Draw the figure for a [`SanityResult`][precision_plugin.sanity.SanityResult] and save it."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (
        ("accuracy", "training accuracy (sampled, exact match)", "linear"),
        ("k3_kl", "train/rollout k3 KL (precision/k3_kl)", "log"),
        ("prob_diff_max", "max |p_train - p_rollout| (precision/prob_diff_max)", "log"),
    )
    for ax, (field, title, scale) in zip(axes, panels, strict=True):
        for dtype, run in result.runs.items():
            points = [
                (s.step, getattr(s, field))
                for s in run.steps
                if getattr(s, field) is not None and (scale == "linear" or getattr(s, field) > 0)
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, label=dtype, color=_COLORS.get(dtype), linewidth=1.4)
        ax.set_yscale(scale)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(loc="lower right")
    config = result.config
    ratio = result.k3_ratio_bf16_over_fp16
    headline = f"; mean k3 bf16/fp16 = {ratio:.0f}x" if ratio else ""
    fig.suptitle(
        f"Sanity GRPO: {config.model_size} Llama ({result.model['parameters']:,} params), "
        f"{config.steps} steps, seed {config.seed}, engine {config.engine}{headline}",
        fontsize=11,
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
