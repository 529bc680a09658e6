"""``precision-plugin probe --plot FILE.png``: the paper's offline-mismatch figure (Fig. 5).

One row per dtype, axes shared per column so the rows compare at a glance: left, each sampled
token's probability gap |π − μ| between the trainer (π) and the rollout engine (μ) against π, on a
log scale (the gap grows with the token's probability, and each dtype sits at its own height:
float32 at the floor, bfloat16 about eight times above float16); right, each sequence's
|Σ(log π − log μ)| against its length, with the least-squares slope per 1,000 tokens (± its
standard error) and each length bucket's mean. The figures
of each panel are in its title, off the data.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from precision_plugin.errors import PrecisionConfigError

_COLORS = {"float32": "#4c72b0", "float16": "#55a868", "bfloat16": "#c44e52"}


def require_matplotlib() -> Any:
    """Import matplotlib with the non-interactive Agg backend, or explain how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise PrecisionConfigError(
            "--plot needs matplotlib, which is not installed; run "
            "pip install 'precision_plugin[plot]' (or pip install matplotlib), or drop --plot."
        ) from None
    matplotlib.use("Agg", force=True)
    return matplotlib


def image_formats() -> tuple[str, ...]:
    """File extensions matplotlib can write (``png``, ``pdf``, ``svg``, ...); needs matplotlib."""
    require_matplotlib()
    from matplotlib.figure import Figure

    return tuple(Figure().canvas.get_supported_filetypes())


def plot_probe(result: Any, path: str | Path) -> Path:
    """Draw the figure for a [`ProbeResult`][precision_plugin.probe.ProbeResult] and save it as
    PNG."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    dtypes = list(result.results)
    fig, axes = plt.subplots(
        len(dtypes), 2, figsize=(11, 3.6 * len(dtypes)), squeeze=False, sharey="col"
    )
    for row, name in enumerate(dtypes):
        r = result.results[name]
        color = _COLORS.get(name, "#8172b2")
        _token_gaps(axes[row][0], r, name, color)
        _length_fit(axes[row][1], r, name, color)
    title = f"train/rollout mismatch of {result.model} ({result.engine} engine, {result.device})"
    if not result.valid:
        title += "\nINVALID: float32 self-check failed"
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    out = Path(path).expanduser()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


#: Where an exact agreement (|π − μ| = 0) is drawn on the log axis.
_GAP_FLOOR = 1e-12


def _valid_pairs(r: Any) -> tuple[list[float], list[float]]:
    pi, mu = [], []
    for train_row, roll_row in zip(r.train_logprobs, r.rollout_logprobs, strict=True):
        for a, b in zip(train_row, roll_row, strict=True):
            if math.isfinite(a) and math.isfinite(b):
                pi.append(math.exp(a))
                mu.append(math.exp(b))
    return pi, mu


def _token_gaps(ax: Any, r: Any, name: str, color: str) -> None:
    pi, mu = _valid_pairs(r)
    gaps = [max(abs(a - b), _GAP_FLOOR) for a, b in zip(pi, mu, strict=True)]
    ax.scatter(pi, gaps, s=5, alpha=0.5, color=color, linewidths=0)
    ax.set_yscale("log")
    ax.set_xlim(0.0, 1.0)
    m = r.metrics
    ax.set_title(
        f"{name}: token probability gap (k3 KL {m.k3_kl:.1e})\n"
        f"mean |π−μ| {m.prob_diff_mean:.1e} · max {m.prob_diff_max:.1e} · {m.tokens} tokens",
        fontsize=9,
    )
    ax.set_xlabel("trainer probability π of the sampled token")
    ax.set_ylabel("|π − μ|")
    ax.grid(True, which="major", alpha=0.3)


def _length_fit(ax: Any, r: Any, name: str, color: str) -> None:
    m = r.metrics
    lengths, ratios = m.seq_lengths, [abs(v) for v in m.seq_log_ratio]
    effect = r.length_effect()
    ax.scatter(lengths, ratios, s=18, color=color, alpha=0.6 if effect.buckets else 0.8)
    # Each length bucket's mean |log-ratio| (>= 4 sequences each): the paper's Fig. 5 at length.
    full = [b for b in effect.buckets if b.sequences > 1]
    if full:
        ax.plot(
            [b.mean_length for b in full],
            [b.mean_abs_log_ratio for b in full],
            "D-",
            color="black",
            ms=4,
            lw=0.8,
            label="length-bucket mean",
        )
        ax.legend(loc="upper left", fontsize=7, frameon=False)
    slope = m.seq_abs_log_ratio_slope_per_1k
    if len(lengths) >= 2 and math.isfinite(slope):
        mean_x = sum(lengths) / len(lengths)
        mean_y = sum(ratios) / len(ratios)
        xs = [min(lengths), max(lengths)]
        ax.plot(xs, [mean_y + slope / 1000.0 * (x - mean_x) for x in xs], color=color, lw=1.5)
    ax.set_title(
        f"{name}: |sequence log-ratio| vs length\n"
        f"slope {slope:+.2e} ± {effect.abs_slope_stderr_per_1k:.1e} per 1K tokens · "
        f"seq KL {m.seq_kl:.1e}",
        fontsize=9,
    )
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("|Σ log π − log μ|")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    ax.grid(True, alpha=0.3)
