"""``precision-plugin probe --plot FILE.png``: the paper's offline-mismatch figure (Fig. 5).

One row per dtype, axes shared per column so the rows compare at a glance: left, each sampled
token's probability gap |π − μ| between the trainer (π) and the rollout engine (μ) against π,
both on log scales (most sampled tokens of a trained model have π below 0.01; the gap grows
with the token's probability, and each dtype sits at its own height: float32 at the floor,
bfloat16 about eight times above float16); middle, each sequence's Σ(log π − log μ) against its
length, with the drift per 1,000 tokens (−1000·k1: E_μ[Σ] = −L·KL(μ‖π), a line through the
origin, ± its standard error) and each length bucket's mean; right, the consequence: the share
of an RL batch that still counts (the ESS, and the shares TRL's and verl's default sequence
masks keep) measured per length bucket and projected to the target length with its 90 % band.
With ``--layerwise`` a last row shows, per stage of the network, how far the two sides' hidden
states differ in rounding units, and where they part. The figures of each panel are in its
title, off the data.
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
    """File extensions matplotlib can write here (``png``, ``pdf``, ``svg``, ...; ``pgf`` only
    where its TeX program is installed, since it fails at the save); needs matplotlib."""
    require_matplotlib()
    import shutil

    import matplotlib
    from matplotlib.figure import Figure

    formats = tuple(Figure().canvas.get_supported_filetypes())
    if shutil.which(str(matplotlib.rcParams.get("pgf.texsystem", "xelatex"))) is None:
        formats = tuple(f for f in formats if f != "pgf")
    return formats


def plot_probe(result: Any, path: str | Path) -> Path:
    """Draw the figure for a [`ProbeResult`][precision_plugin.probe.ProbeResult] and save it as
    PNG."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    dtypes = list(result.results)
    consequence = getattr(result, "consequence", None)
    layerwise = getattr(result, "layerwise", None)
    ncols = 3 if consequence is not None else 2
    nrows = len(dtypes) + (1 if layerwise is not None and layerwise.dtypes else 0)
    fig = plt.figure(figsize=(5.4 * ncols, 3.6 * nrows))
    grid = fig.add_gridspec(nrows, ncols)
    axes = [[fig.add_subplot(grid[row, col]) for col in range(ncols)] for row in range(len(dtypes))]
    for row in axes[1:]:  # rows share each column's y axis
        for col, ax in enumerate(row):
            ax.sharey(axes[0][col])
    for row, name in enumerate(dtypes):
        r = result.results[name]
        color = _COLORS.get(name, "#8172b2")
        _token_gaps(axes[row][0], r, name, color)
        _length_fit(axes[row][1], r, name, color)
        if consequence is not None and name in consequence.dtypes:
            _consequence_panel(axes[row][2], consequence.dtypes[name], name, color)
    if nrows > len(dtypes):
        _layerwise_panel(fig.add_subplot(grid[-1, :]), layerwise)
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
#: The smallest π the token panel's log axis shows.
_PI_FLOOR = 1e-12


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
    ax.set_xscale("log")  # a trained model samples most tokens at π < 0.01
    low = min((p for p in pi if p > 0), default=_PI_FLOOR)
    ax.set_xlim(max(low, _PI_FLOOR) / 2.0, 1.5)
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
    lengths, ratios = m.seq_lengths, list(m.seq_log_ratio)
    effect = r.length_effect()
    ax.scatter(lengths, ratios, s=18, color=color, alpha=0.6 if effect.buckets else 0.8)
    # Each length bucket's mean log-ratio (>= 4 sequences each): the paper's Fig. 5 at length.
    full = [b for b in effect.buckets if b.sequences > 1]
    if full:
        ax.plot(
            [b.mean_length for b in full],
            [b.mean_log_ratio for b in full],
            "D-",
            color="black",
            ms=4,
            lw=0.8,
            label="length-bucket mean",
        )
    drift, se = effect.drift_per_1k, effect.drift_per_1k_se
    if lengths and math.isfinite(drift):
        # E_mu[sum log pi - log mu] = -L KL: a line through the origin, its band +- 1 SE.
        xs = [0.0, float(max(lengths))]
        ax.plot(xs, [drift / 1000.0 * x for x in xs], color=color, lw=1.5, label="drift")
        if math.isfinite(se):
            ax.fill_between(
                xs,
                [(drift - se) / 1000.0 * x for x in xs],
                [(drift + se) / 1000.0 * x for x in xs],
                color=color,
                alpha=0.15,
                lw=0,
            )
        ax.legend(loc="lower left", fontsize=7, frameon=False)
    ax.axhline(0.0, color="grey", lw=0.6)
    se_text = f" ± {se:.1e}" if math.isfinite(se) else ""
    ax.set_title(
        f"{name}: sequence log-ratio vs length\n"
        f"drift {drift:+.2e}{se_text} per 1K tokens (−1000·k1) · seq KL {m.seq_kl:.1e}",
        fontsize=9,
    )
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("Σ log π − log μ")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    ax.grid(True, alpha=0.3)


def _consequence_panel(ax: Any, c: Any, name: str, color: str) -> None:
    """Share of the batch that counts against length: measured per bucket (markers), projected
    to the target length with the 90 % band (lines)."""
    from precision_plugin._core.metrics.consequence import SEQUENCE_MASKS, project
    from precision_plugin.probe.advice import ess_text, percent

    p = c.projection
    top = max([p.length, *(b.max_length for b in c.buckets)])
    xs = sorted({max(1, round(top * (i + 1) / 60)) for i in range(60)})
    points = [project(c.fit, x) for x in xs]
    curves = [("ESS (infinite batch)", "-", lambda q: q.ess, False)]
    curves += [
        (f"kept by {m.system}'s mask", "--" if m.key == "verl" else "-.",
         lambda q, m=m: getattr(q, f"seq_mask_fraction_{m.key}"), True)
        for m in SEQUENCE_MASKS
    ]  # fmt: skip
    for label, style, pick, complement in curves:
        values = [pick(q) for q in points]
        if all(math.isnan(v.value) for v in values):
            continue
        flip = (lambda y: 1.0 - y) if complement else (lambda y: y)
        ax.plot(xs, [flip(v.value) for v in values], style, color=color, lw=1.3, label=label)
        ax.fill_between(
            xs, [flip(v.low) for v in values], [flip(v.high) for v in values], color=color,
            alpha=0.08,
        )  # fmt: skip
    for i, b in enumerate(c.buckets):
        m = b.consequence
        ax.plot([b.mean_length], [m.ess], "o", color="black", ms=3,
                label="bucket ESS" if i == 0 else None)  # fmt: skip
        verl = b.to_dict()["intervals"]["seq_mask_fraction_verl"]  # Clopper-Pearson, 90 %
        kept = 1.0 - m.seq_mask_fraction_verl
        sizes = sorted({x.consequence.sequences for x in c.buckets})
        ax.errorbar([b.mean_length], [kept], yerr=[[kept - (1 - verl["high"])],
                    [(1 - verl["low"]) - kept]], fmt="s", color="black", ms=3, mfc="none",
                    lw=0.6, capsize=2,
                    label=f"bucket kept by verl's mask ({'/'.join(map(str, sizes))} seqs)"
                    if i == 0 else None)  # fmt: skip
    e = c.ess
    ax.errorbar([p.length], [e.value], yerr=[[e.value - e.low], [e.high - e.value]], fmt="D",
                color=color, ms=4, capsize=3,
                label=f"ESS, a batch of {c.batch_size:,}")  # fmt: skip
    ax.axvline(p.length, color="0.5", lw=0.8, ls=":")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(0, top * 1.02)
    ax.set_title(
        f"{name}: the share of an RL batch that counts ({c.verdict})\n"
        f"at {p.length:,} tokens, a batch of {c.batch_size:,}: ESS {ess_text(e.value)} "
        f"({ess_text(e.low)}–{ess_text(e.high)}),\nkept {percent(c.kept)}; from "
        f"{c.fit.sequences} sequences, 90 % bands",
        fontsize=8,
    )
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("share of the batch")
    ax.legend(loc="lower left", fontsize=6, frameon=False)
    ax.grid(True, alpha=0.3)


def _layerwise_panel(ax: Any, layerwise: Any) -> None:
    """Per stage, the two sides' divergence in rounding units (free-running and local)."""
    for i, (name, d) in enumerate(layerwise.dtypes.items()):
        color = _COLORS.get(name, "#8172b2")
        xs = list(range(len(d.stages)))
        ax.plot(xs, [max(s.units, 1e-3) for s in d.stages], "-", color=color, label=f"{name}")
        ax.plot(
            xs, [max(s.local_units, 1e-3) for s in d.stages], ":", color=color,
            label=f"{name} (each stage alone)",
        )  # fmt: skip
        if d.parted_at is not None:
            at = [s.name for s in d.stages].index(d.parted_at)
            ax.plot([at], [max(d.stages[at].local_units, 1e-3)], "v", color=color, ms=9)
            ax.annotate(
                f"{name} parts: {d.parted_at}", (at, d.stages[at].local_units), fontsize=7,
                textcoords="offset points", xytext=(6, -12 - 11 * i), color=color,
            )  # fmt: skip
    first = next(iter(layerwise.dtypes.values()))
    labels = [_short_stage(s.name) for s in first.stages]
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=90, fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("‖h_rollout − h_trainer‖ / ‖h_trainer‖ in u")
    ax.set_title(
        "layerwise: how far the rollout side's hidden states are from the trainer's, in units "
        "of the dtype's rounding (solid: each side on its own; dotted: each stage fed the "
        "trainer's input)",
        fontsize=9,
    )
    ax.legend(fontsize=7, frameon=False, ncol=4)
    ax.grid(True, alpha=0.3)


def _short_stage(name: str) -> str:
    parts = name.split(".")
    return parts[-1] if not parts[-1].isdigit() else f"L{parts[-1]}"
