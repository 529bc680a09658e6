"""``precision-plugin probe --plot FILE.png``: the paper's offline-mismatch figure (Fig. 5).

One row per dtype: left, the probability of every sampled token under the trainer (π) against
the rollout engine (μ), on the diagonal when they agree; right, each sequence's log-ratio
Σ(log π − log μ) against its length, with the least-squares slope per 1,000 tokens. The
log-ratio axes are shared, so a wider spread in bfloat16 than in float16 is visible at a glance.
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
        _token_scatter(axes[row][0], r, name, color)
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


def _valid_pairs(r: Any) -> tuple[list[float], list[float]]:
    pi, mu = [], []
    for train_row, roll_row in zip(r.train_logprobs, r.rollout_logprobs, strict=True):
        for a, b in zip(train_row, roll_row, strict=True):
            if math.isfinite(a) and math.isfinite(b):
                pi.append(math.exp(a))
                mu.append(math.exp(b))
    return pi, mu


def _token_scatter(ax: Any, r: Any, name: str, color: str) -> None:
    pi, mu = _valid_pairs(r)
    ax.scatter(mu, pi, s=5, alpha=0.5, color=color, linewidths=0)
    if mu:
        lo, hi = min(min(mu), min(pi)), max(max(mu), max(pi))
        pad = (hi - lo) * 0.05 or hi * 0.05 or 1e-3
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="black", lw=0.8, ls="--")
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
    m = r.metrics
    ax.set_title(f"{name}: token probability, trainer vs rollout", fontsize=10)
    ax.set_xlabel("rollout μ(token)")
    ax.set_ylabel("trainer π(token)")
    ax.text(
        0.03,
        0.97,
        f"k3 KL {m.k3_kl:.2e}\nmean |π−μ| {m.prob_diff_mean:.2e}\nmax |π−μ| {m.prob_diff_max:.2e}"
        f"\n{m.tokens} tokens · {r.verdict}",
        transform=ax.transAxes,
        va="top",
        fontsize=8,
        family="monospace",
        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85, "edgecolor": "#cccccc"},
    )


def _length_fit(ax: Any, r: Any, name: str, color: str) -> None:
    m = r.metrics
    lengths, ratios = m.seq_lengths, m.seq_log_ratio
    ax.axhline(0.0, color="black", lw=0.8, ls="--")
    ax.scatter(lengths, ratios, s=18, color=color, alpha=0.8)
    slope = m.seq_log_ratio_slope_per_1k
    if len(lengths) >= 2 and math.isfinite(slope):
        mean_x = sum(lengths) / len(lengths)
        mean_y = sum(ratios) / len(ratios)
        xs = [min(lengths), max(lengths)]
        ax.plot(xs, [mean_y + slope / 1000.0 * (x - mean_x) for x in xs], color=color, lw=1.5)
    ax.set_title(f"{name}: sequence log-ratio vs length", fontsize=10)
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("Σ log π − log μ")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    ax.text(
        0.03,
        0.97,
        f"slope {slope:+.2e} per 1K tokens\nseq KL {m.seq_kl:.2e}",
        transform=ax.transAxes,
        va="top",
        fontsize=8,
        family="monospace",
        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85, "edgecolor": "#cccccc"},
    )
