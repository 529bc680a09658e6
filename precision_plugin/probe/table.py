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


#: Rows of the headroom table: the tightest modules.
HEADROOM_ROWS = 8


def render_headroom_table(result: ProbeResult, top: int = HEADROOM_ROWS) -> Any:
    """A rich ``Table`` of the ``top`` tightest modules of the probe's float16 headroom, with the
    recommendation and the ``model_type`` check in the caption; ``None`` when not measured."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    check = result.overflow
    if check is None:
        return None
    report = check.report
    table = Table(
        title=(
            f"float16 headroom: largest |activation| in float32 on the probe prompts "
            f"(float16 max {report.fp16_max:g}); tightest {min(top, len(report.modules))} of "
            f"{len(report.modules)} modules"
        ),
        caption=escape(_headroom_caption(check)),
        box=box.SIMPLE_HEAD,
    )
    table.add_column("module", overflow="fold")
    table.add_column("class", no_wrap=True)
    table.add_column("max |x|", justify="right", no_wrap=True)
    table.add_column("margin (bits)", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for row in report.tightest(top):
        margin = f"{row.margin_bits:.1f}" if math.isfinite(row.margin_bits) else "-"
        flag = "[red]below margin[/]" if row.flagged else "[green]ok[/]"
        table.add_row(
            escape(row.path or "<model>"), row.module_class, _num(row.max_abs), margin, flag
        )
    return table


def _headroom_caption(check: Any) -> str:
    report = check.report
    rec = report.recommendation()
    lines = [f"flag: margin < {report.margin_bits:g} bits (overflow.margin_bits). {rec.message}."]
    if check.risks:
        lines.extend(f"model_type list: {f.message}" for f in check.risks)
    else:
        lines.append(
            f"model_type list: {check.model_type!r} is not on the known float16-risk lists "
            f"(vLLM refusals, families known to overflow)."
        )
    return "\n".join(lines)
