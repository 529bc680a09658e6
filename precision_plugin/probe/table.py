"""The probe's result as a rich table, rendered by the probe itself (as ``doctor`` renders its
report); the CLI only prints it."""

from __future__ import annotations

import math
from typing import Any

from precision_plugin.probe.schema import ProbeResult

_VERDICT_STYLE = {"ok": "green", "watch": "yellow", "problem": "red", "invalid": "bold red"}


def render_probe_table(result: ProbeResult) -> Any:
    """A rich ``Table`` of a [`ProbeResult`][precision_plugin.probe.ProbeResult], a row a dtype."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"train/rollout mismatch: {result.model} ({result.engine}, {result.device})",
        caption=_caption(result),
        box=box.SIMPLE_HEAD,
    )
    for header in ("dtype", "k3 KL", "k1 KL", "|Δp| mean", "|Δp| max", "slope/1K", "tokens"):
        table.add_column(header, justify="left" if header == "dtype" else "right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for name, r in result.results.items():
        m = r.metrics
        style = _VERDICT_STYLE.get(r.verdict, "")
        table.add_row(
            f"{name}*" if name == "float32" else name,
            _num(m.k3_kl),
            _num(m.k1_kl),
            _num(m.prob_diff_mean),
            _num(m.prob_diff_max),
            _num(m.seq_log_ratio_slope_per_1k),
            f"{m.tokens}" + (f" ({m.nan_tokens} NaN)" if m.nan_tokens else ""),
            f"[{style}]{r.verdict}[/]" if style else r.verdict,
        )
    return table


def _num(value: float) -> str:
    return "-" if value != value else f"{value:.1e}"


def _caption(result: ProbeResult) -> str:
    lines = [f"* self-check: {result.self_check.message}"]
    ratio = result.k3_ratio("bfloat16", "float16")
    if not math.isnan(ratio):
        lines.append(f"bfloat16 k3 is {ratio:.0f}x float16 k3 (theory ~64x).")
    s = result.config.metrics
    lines.append(
        f"verdict on prob_diff_mean: < {s.prob_diff_ok:g} ok, <= {s.prob_diff_bad:g} watch, "
        f"> {s.prob_diff_bad:g} problem (verl's thresholds)."
    )
    return "\n".join(lines)
