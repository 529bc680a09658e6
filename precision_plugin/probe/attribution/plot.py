"""``probe --attribute --attribution-plot FILE.png``: the mismatch by cause, per dtype.

Left: one stacked bar per dtype, each cause in the measured total as its share of ``E[d^2]/2``
(the interaction and residual terms too, below zero where negative), the total k3 over the bar.
Right: every measured row's k3 on a log scale, causes in the total solid and what-ifs hatched,
so a cause the rollout does not run with reads against those it does. Drawn from the JSON
``attribution`` section, so a results file redraws the same figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from precision_plugin.probe.attribution.fixes import CAUSES
from precision_plugin.probe.attribution.settings import changed_settings

_COLORS = dict(zip(
    (*CAUSES, "interaction", "residual"),
    ("#c44e52", "#4c72b0", "#55a868", "#8172b2", "#ccb974", "#64b5cd", "#dd8452", "#937860",
     "#da8bc3", "#8c8c8c", "#cfcfcf"),
    strict=True,
))  # fmt: skip
_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def plot_attribution(section: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Draw the figure of an ``attribution`` section (``AttributionReport.to_dict()``) as PNG."""
    from precision_plugin.probe.plot import require_matplotlib

    require_matplotlib()
    import matplotlib.pyplot as plt

    dtypes = [d for d in section["dtypes"] if d != "float32"] or list(section["dtypes"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), width_ratios=(1, 1.6))
    seen: set[str] = set()
    for x, dtype in enumerate(dtypes):
        block = section["dtypes"][dtype]
        up = down = 0.0
        terms = [(c, r["share"]) for c, r in block["causes"].items() if r["in_total"]]
        terms += [(t, block[t]["share"]) for t in ("interaction", "residual")]
        for name, share in terms:
            if share is None:
                continue
            bottom = up if share >= 0 else down
            left.bar(x, share, bottom=bottom, color=_COLORS[name], edgecolor="white",
                     label=name if name not in seen else None)  # fmt: skip
            seen.add(name)
            if share >= 0:
                up += share
            else:
                down += share
        left.annotate(f"k3 {block['total']['k3']:.2g}", (x, max(up, 1.0)), ha="center",
                      va="bottom", fontsize=9)  # fmt: skip
    left.axhline(0, color="black", linewidth=0.8)
    left.set_xticks(range(len(dtypes)), [_SHORT.get(d, d) for d in dtypes])
    left.set_ylabel("share of E[d²]/2 (≈ k3)")
    left.set_title("the measured mismatch by cause")
    left.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    width = 0.8 / max(1, len(dtypes))
    causes = [c for c in CAUSES if any(c in section["dtypes"][d]["causes"] for d in dtypes)]
    for i, dtype in enumerate(dtypes):
        rows = section["dtypes"][dtype]["causes"]
        for j, cause in enumerate(causes):
            row = rows.get(cause)
            if row is None or not row["k3"] or row["k3"] <= 0:
                continue
            right.bar(j + (i - (len(dtypes) - 1) / 2) * width, row["k3"], width,
                      color=_COLORS[cause], hatch=None if row["in_total"] else "//",
                      edgecolor="black" if i else "white", linewidth=0.5)  # fmt: skip
    for i, dtype in enumerate(dtypes):
        right.annotate(f"{_SHORT.get(dtype, dtype)}: {'left' if i == 0 else 'right'} bar",
                       (0.99, 0.97 - 0.06 * i), xycoords="axes fraction", ha="right",
                       fontsize=8)  # fmt: skip
    right.set_yscale("log")
    right.set_xticks(range(len(causes)), causes, rotation=30, ha="right")
    right.set_ylabel("k3 (nats/token)")
    right.set_title("each cause alone (hatched: what-if, not in this rollout)")
    changed = changed_settings(section["rollout"])
    rollout = ", ".join(f"{k}={v}" for k, v in changed.items()) or "defaults"
    fig.suptitle(title or f"why it is still off (rollout: {rollout})", fontsize=12)
    fig.tight_layout()
    out = Path(path).expanduser()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
