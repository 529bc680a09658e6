"""The probe's result as a rich table, rendered by the probe itself (as ``doctor`` renders its
report); the CLI only prints it.

The table leads with what the run is for: how much more one dtype drifts than another. Each
low-precision row gets a verdict relative to the lowest-mismatch dtype (float32 is the floor the
self-check holds), a last row gives the bfloat16 / float16 ratio of every magnitude, and verl's
absolute thresholds (which a small model rarely reaches) have a column of their own.
"""

from __future__ import annotations

import math
from typing import Any

from precision_plugin.probe.schema import SELF_CHECK_DTYPE, ProbeResult

_VERDICT_STYLE = {"ok": "green", "watch": "yellow", "problem": "red", "invalid": "bold red"}
_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

#: Columns: header, metric attribute, whether a ratio of it between dtypes means something.
_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("k3 KL", "k3_kl", True),
    ("|Δp| mean", "prob_diff_mean", True),
    ("|Δp| max", "prob_diff_max", True),
    ("|seq|/1K", "seq_abs_log_ratio_slope_per_1k", True),
    ("k1 KL", "k1_kl", False),  # signed: a ratio of two signed means says nothing
)

#: A dtype within this factor of the lowest k3 counts as "lowest" too.
_SAME_FACTOR = 2.0


def render_probe_table(result: ProbeResult) -> Any:
    """A rich ``Table`` of a [`ProbeResult`][precision_plugin.probe.ProbeResult], a row a dtype,
    then the bfloat16 / float16 ratio of each magnitude when both ran."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"train/rollout mismatch: {result.model} ({result.engine}, {result.device})",
        caption=_caption(result),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("dtype", no_wrap=True)
    for header, _, _ in _COLUMNS:
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("verl", no_wrap=True)
    verdicts = relative_verdicts(result)
    for name, r in result.results.items():
        m = r.metrics
        style = _VERDICT_STYLE.get(r.verdict, "")
        table.add_row(
            f"{name}*" if name == SELF_CHECK_DTYPE else name,
            *(_num(getattr(m, attr)) for _, attr, _ in _COLUMNS),
            f"{m.tokens}" + (f" ({m.nan_tokens} NaN)" if m.nan_tokens else ""),
            verdicts[name],
            f"[{style}]{r.verdict}[/]" if style else r.verdict,
        )
    if "bfloat16" in result.results and "float16" in result.results:
        bf, fp = result.results["bfloat16"].metrics, result.results["float16"].metrics
        table.add_section()
        table.add_row(
            "bf16 ÷ fp16",
            *(_ratio(getattr(bf, a), getattr(fp, a)) if r else "" for _, a, r in _COLUMNS),
            "",
            "",
            "",
            style="bold",
        )
    return table


def relative_verdicts(result: ProbeResult) -> dict[str, str]:
    """Each dtype's verdict against the others (rich markup): float32 is the floor the self-check
    holds; among the other dtypes the lowest k3 is "lowest", the rest "Nx <lowest>"."""
    out: dict[str, str] = {}
    k3 = {
        name: r.metrics.k3_kl
        for name, r in result.results.items()
        if name != SELF_CHECK_DTYPE and math.isfinite(r.metrics.k3_kl)
    }
    best = min(k3, key=k3.__getitem__) if k3 else None
    for name in result.results:
        if not result.valid:
            out[name] = "[bold red]invalid[/]"
        elif name == SELF_CHECK_DTYPE:
            out[name] = "[green]floor[/]"
        elif name not in k3 or best is None:
            out[name] = "-"
        elif k3[best] <= 0 or k3[name] <= _SAME_FACTOR * k3[best]:
            out[name] = "[green]lowest[/]" if len(k3) > 1 else "[green]measured[/]"
        else:
            factor = k3[name] / k3[best]
            style = "red" if factor >= 8 else "yellow"
            out[name] = f"[{style}]{factor:.0f}x {_SHORT.get(best, best)}[/]"
    return out


def _num(value: float) -> str:
    return "-" if value != value else f"{value:.1e}"


def _ratio(a: float, b: float) -> str:
    if not (math.isfinite(a) and math.isfinite(b)) or b <= 0 or a < 0:
        return "-"
    return f"{a / b:.0f}x" if a / b >= 10 else f"{a / b:.1f}x"


def _caption(result: ProbeResult) -> str:
    s = result.config.metrics
    lines = [
        f"* self-check: {result.self_check.message}",
        "verdict: k3 KL against the lowest-mismatch dtype (float32 is the floor); bf16 ÷ fp16: "
        "theory ~64x for k3, ~8x for |Δp| (unit roundoff 2^-8 vs 2^-11).",
        "k1 KL = mean(log μ − log π) is signed: small negative values are noise, only its size "
        "matters. |seq|/1K: slope of |Σ log π − log μ| against length, per 1,000 tokens (the "
        "signed slope is in --json).",
        f"verl: prob_diff_mean < {s.prob_diff_ok:g} ok, <= {s.prob_diff_bad:g} watch, > "
        f"{s.prob_diff_bad:g} problem (verl's absolute thresholds).",
    ]
    counts = {r.metrics.tokens for r in result.results.values()}
    if len(counts) > 1:
        lines.append(
            "tokens differ per dtype: each dtype samples its own completions, which reach "
            "<eos> at different points."
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
