"""``probe --attribute --attribution-plot FILE.png``: the mismatch by cause, per dtype.

Left: one stacked bar per dtype, each cause in the measured total as its share of ``E[d^2]/2``
(the interaction and residual terms too, below zero where negative), the total k3 over the bar.
Right: every measured row's k3 on a log scale, causes in the total solid and what-ifs hatched,
so a cause the rollout does not run with reads against those it does. Drawn from the JSON
``attribution`` section, so a results file redraws the same figure.

A number that is not finite (``null`` in the JSON, NaN, inf) draws no bar: a k3 is labelled
``inf``, ``undefined`` or ``not finite`` (a marker at the top of the right panel, where its bar
would be, so it does not read as a small value), and a bar whose shares are not all finite says
so under its k3.
"""

from __future__ import annotations

import math
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
#: Left panel: the headroom over the bars (a fraction of their span) that the k3 labels sit in,
#: top-aligned inside the panel so they never reach its title.
_HEADROOM = 0.3
_LABEL_Y = 0.98
#: Right panel: where a k3 that is not finite is marked (axes fraction), and the log-scale
#: headroom (a power of the span) that keeps the bars below those marks.
_MARK_Y = 0.96
_MARK_HEADROOM = 1.35


def _finite(x: Any) -> float | None:
    """``x`` as a float where it is a finite number, else ``None`` (``null``, NaN, inf)."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def _not_finite(value: Any, row: Mapping[str, Any]) -> str:
    """What a k3 that is not a finite number reads as. NaN is undefined; ``null`` (the JSON's
    infinite or undefined) is undefined without a token, and inf where the row has tokens and a
    finite lower bound (a token's ``e^d`` overflowed: every term is >= 0, so the mean is +inf)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isnan(value):
            return "undefined"
        return "inf" if value > 0 else "-inf"
    tokens = row.get("tokens")
    interval = row.get("k3_interval")
    low = interval[0] if isinstance(interval, list | tuple) and interval else None
    if tokens == 0:
        return "undefined"
    if isinstance(tokens, int) and tokens > 0 and _finite(low) is not None:
        return "inf"
    return "not finite"


def _k3_text(row: Mapping[str, Any]) -> str:
    value = row.get("k3")
    k3 = _finite(value)
    return f"{k3:.2g}" if k3 is not None else _not_finite(value, row)


def plot_attribution(section: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Draw the figure of an ``attribution`` section (``AttributionReport.to_dict()``) as PNG."""
    from precision_plugin.probe.plot import require_matplotlib

    require_matplotlib()
    import matplotlib.pyplot as plt

    dtypes = [d for d in section["dtypes"] if d != "float32"] or list(section["dtypes"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), width_ratios=(1, 1.6))
    seen: set[str] = set()
    top, bottom = 1.0, 0.0
    labels: list[str] = []
    for x, dtype in enumerate(dtypes):
        block = section["dtypes"][dtype]
        total = block.get("total") or {}
        # Shares are None where the total's part is 0 (nothing to split); otherwise a share
        # that is not a finite number is said, not dropped silently.
        split = _finite(total.get("part")) != 0.0
        up = down = 0.0
        unshared = False
        terms = [(c, r.get("share")) for c, r in block["causes"].items() if r.get("in_total")]
        # Shapley shares (results with "shares") have no interaction term.
        terms += [(t, (block.get(t) or {}).get("share")) for t in ("interaction", "residual")
                  if t in block]  # fmt: skip
        for name, value in terms:
            share = _finite(value)
            if share is None:
                unshared |= value is not None or split
                continue
            bottom_ = up if share >= 0 else down
            left.bar(x, share, bottom=bottom_, color=_COLORS[name], edgecolor="white",
                     label=name if name not in seen else None)  # fmt: skip
            seen.add(name)
            if share >= 0:
                up += share
            else:
                down += share
        top, bottom = max(top, up), min(bottom, down)
        labels.append(f"k3 {_k3_text(total)}" + ("\nshares not finite" if unshared else ""))
    span = top - bottom
    left.set_ylim(bottom - 0.05 * span, top + _HEADROOM * span)
    for x, label in enumerate(labels):
        left.text(x, _LABEL_Y, label, transform=left.get_xaxis_transform(), ha="center",
                  va="top", fontsize=9)  # fmt: skip
    left.axhline(0, color="black", linewidth=0.8)
    left.set_xlim(-0.5, len(dtypes) - 0.5)
    left.set_xticks(range(len(dtypes)), [_SHORT.get(d, d) for d in dtypes])
    left.set_ylabel("Shapley share of k3" if section.get("shares") else "share of E[d²]/2 (≈ k3)")
    left.set_title("the measured mismatch by cause")
    if seen:
        left.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    width = 0.8 / max(1, len(dtypes))
    causes = [c for c in CAUSES if any(c in section["dtypes"][d]["causes"] for d in dtypes)]
    marks: list[tuple[float, str, str]] = []
    for i, dtype in enumerate(dtypes):
        rows = section["dtypes"][dtype]["causes"]
        for j, cause in enumerate(causes):
            row = rows.get(cause)
            if row is None:
                continue
            x = j + (i - (len(dtypes) - 1) / 2) * width
            k3 = _finite(row.get("k3"))
            if k3 is None:
                marks.append((x, cause, _not_finite(row.get("k3"), row)))
                continue
            if k3 <= 0:
                continue
            right.bar(x, k3, width, color=_COLORS[cause],
                      hatch=None if row.get("in_total") else "//",
                      edgecolor="black" if i else "white", linewidth=0.5)  # fmt: skip
    right.set_yscale("log")
    if marks:
        # No bar for them: a marker at the top of the panel where the bar would be, and what
        # the k3 is, so an infinite one does not read as negligible.
        low, high = right.get_ylim()
        right.set_ylim(low, low * (high / low) ** _MARK_HEADROOM)
        along = right.get_xaxis_transform()
        for x, cause, text in marks:
            right.plot(x, _MARK_Y, marker="^", markersize=9, color=_COLORS[cause],
                       markeredgecolor="black", linestyle="none", transform=along,
                       clip_on=False)  # fmt: skip
            right.text(x, _MARK_Y - 0.04, text, transform=along, rotation=90, ha="center",
                       va="top", fontsize=8)  # fmt: skip
    right.set_xlim(-0.5, len(causes) - 0.5)
    right.set_xticks(range(len(causes)), causes, rotation=30, ha="right")
    right.set_ylabel("k3 (nats/token)")
    order = ", ".join(_SHORT.get(d, d) for d in dtypes)
    note = "; ▲: k3 not finite, no bar (inf: off the scale)" if marks else ""
    right.set_xlabel(f"bars left to right: {order}{note}", fontsize=8)
    right.set_title("each cause alone (hatched: what-if, not in this rollout)")
    changed = changed_settings(section["rollout"])
    rollout = ", ".join(f"{k}={v}" for k, v in changed.items()) or "defaults"
    fig.suptitle(title or f"why it is still off (rollout: {rollout})", fontsize=12)
    fig.tight_layout()
    out = Path(path).expanduser()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
