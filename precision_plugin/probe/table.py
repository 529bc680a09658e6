"""The probe's result as a rich table, rendered by the probe itself (as ``doctor`` renders its
report); the CLI only prints it, and the docs render it from a results file.

The table reads top to bottom: a row per dtype with the size of its mismatch (k3 KL, its factor
over float16, the probability gap, the drift with length), what that mismatch does to an RL batch
as measured (ESS, the shares TRL's and verl's default sequence masks drop) and at the target
length (the share of the batch that still counts, the verdict); under it one line per dtype
with the figures and their intervals, then the line that says what to do, then the legend.
Everything is read from the JSON form (``ProbeResult.to_dict()``), so a results file renders
the same table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from precision_plugin.probe.advice import percent
from precision_plugin.probe.schema import SELF_CHECK_DTYPE, ProbeResult

_VERDICT_STYLE = {
    "floor": "green",
    "ok": "green",
    "negligible": "green",
    "noticeable": "yellow",
    "costly": "red",
    "severe": "bold red",
    "invalid": "bold red",
}
_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

#: Mismatch columns: header, the JSON key of the dtype's metric.
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("k3 KL", "k3_kl"),
    ("|Δp|\nmean", "prob_diff_mean"),
    ("drift\n/1K", "drift_per_1k"),  # signed, ± its standard error on a second line
)


def render_probe_table(result: ProbeResult | Mapping[str, Any], explain: bool = False) -> Any:
    """A rich ``Table`` of a [`ProbeResult`][precision_plugin.probe.ProbeResult] or of its JSON
    form (a results file): a row per dtype, then the verdict lines; ``explain`` adds what each
    column means. With the rollout as configured (``--rollout``) each dtype's first row is that
    rollout (labelled so) and its second the default rollout. What to do is
    [`render_decision`][precision_plugin.probe.table.render_decision], printed last."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    data = result.to_dict() if isinstance(result, ProbeResult) else result
    results: dict[str, Any] = data["results"]
    consequence = data.get("consequence") or {}
    per_dtype = consequence.get("dtypes", {})
    target = consequence.get("target_length")
    settings = data.get("settings", {})
    configured = data.get("configured") or {}
    title = (
        f"train/rollout mismatch: {escape(str(data['model']))} ({data['engine']}, "
        f"{data['device']}), up to {settings.get('max_new_tokens', '?'):,} new tokens"
    )
    if configured:
        title += (
            f"; the rollout as configured ({escape(configured['settings'])}), each dtype's "
            f"second row with the rollout at its defaults"
        )
    table = Table(
        title=title,
        caption=escape(_caption(data, explain)),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    reference = _reference(results)
    # Two-line headers keep the table within 80 columns.
    table.add_column("dtype", no_wrap=True)
    table.add_column(_COLUMNS[0][0], justify="right", no_wrap=True)
    table.add_column(f"÷\n{_SHORT.get(reference, reference)}", justify="right", no_wrap=True)
    for header, _ in _COLUMNS[1:]:
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("seqs", justify="right", no_wrap=True)
    table.add_column("ESS", justify="right", no_wrap=True)
    table.add_column("masked\nTRL·verl", justify="right", no_wrap=True)
    at = f"at {target:,}\nkept" if target else "kept"
    table.add_column(at, justify="right", no_wrap=True)
    table.add_column("conse-\nquence", no_wrap=True)
    under = configured.get("results", {})
    under_consequence = consequence.get("configured", {}).get("dtypes", {})
    for name, r in results.items():
        if name in under:
            table.add_row(*_cells(name, under[name], under, under_consequence.get(name, {}),
                                  _reference(under)))  # fmt: skip
            table.add_row(*_cells("  defaults", r, results, per_dtype.get(name, {}), reference,
                                  name), end_section=True)  # fmt: skip
        else:
            table.add_row(*_cells(name, r, results, per_dtype.get(name, {}), reference))
    return table


def _cells(
    label: str,
    r: Mapping[str, Any],
    results: Mapping[str, Any],
    c: Mapping[str, Any],
    reference: str,
    name: str | None = None,
) -> tuple[str, ...]:
    """One row's cells: ``r`` a dtype's results, ``c`` its consequence; ``name`` the dtype
    where ``label`` is not it."""
    name = name or label
    measured = c.get("measured", {})
    verdict = c.get("verdict") or r.get("verdict", "")
    style = _VERDICT_STYLE.get(verdict, "")
    return (
        label,
        _num(r.get("k3_kl")),
        _factor(name, results, reference, floor=r.get("verdict") in ("ok", "invalid")),
        *(_cell(r, key) for _, key in _COLUMNS[1:]),
        _count(measured.get("sequences")),
        _fixed(measured.get("ess")),
        f"{percent(measured.get('seq_mask_fraction_trl'))}·"
        f"{percent(measured.get('seq_mask_fraction_verl'))}",
        percent(c.get("kept_at_target")) if verdict not in ("invalid", "") else "-",
        f"[{style}]{verdict}[/]" if style else verdict,
    )


def render_decision(result: ProbeResult | Mapping[str, Any]) -> str:
    """What to do, as the probe's last lines: ``do: ...`` and ``apply: ...`` (the decision's
    line split where it says how to apply it); empty without a consequence section. Read from
    the result's consequence report (the decision's line), or from a results file's JSON."""
    if isinstance(result, ProbeResult):
        consequence = result.consequence
        advice = str(consequence.advice or "") if consequence is not None else ""
    else:
        advice = str((result.get("consequence") or {}).get("advice") or "")
    do, sep, apply = advice.partition(". apply: ")
    return f"{do}.\napply: {apply}" if sep else advice


def _reference(results: Mapping[str, Any]) -> str:
    """The dtype the k3 factors are relative to: float16 when measured, else the lowest."""
    k3 = {
        n: r.get("k3_kl")
        for n, r in results.items()
        if n != SELF_CHECK_DTYPE and isinstance(r.get("k3_kl"), (int, float)) and r["k3_kl"] > 0
    }
    if "float16" in k3 or not k3:
        return "float16"
    return min(k3, key=k3.__getitem__)


def _factor(name: str, results: Mapping[str, Any], reference: str, floor: bool = True) -> str:
    if name == SELF_CHECK_DTYPE and floor:
        return "floor"
    a, b = results[name].get("k3_kl"), results.get(reference, {}).get("k3_kl")
    if not (isinstance(a, (int, float)) and isinstance(b, (int, float))) or b <= 0:
        return "n/a"
    ratio = a / b
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _num(value: Any) -> str:
    return f"{value:.1e}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def _cell(r: Mapping[str, Any], key: str) -> str:
    """A metric's cell; the drift signed, with its standard error under it."""
    if key != "drift_per_1k":
        return _num(r.get(key))
    value, se = r.get(key), r.get("drift_per_1k_se")
    if not (isinstance(value, (int, float)) and math.isfinite(value)):
        return "n/a"
    return f"{value:+.1e}" + (f"\n±{se:.0e}" if isinstance(se, (int, float)) else "")


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "n/a"


def _fixed(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


#: The line that points at the glossary when ``--explain`` is not given.
EXPLAIN_HINT = "--explain: what each column and verdict means (also in docs/cli.md)."


def _caption(data: Mapping[str, Any], explain: bool = False) -> str:
    consequence = data.get("consequence") or {}
    configured = (consequence.get("configured") or {}).get("dtypes", {})
    lines = [d["line"] for d in configured.values() if d.get("line")]
    default = [d["line"] for d in consequence.get("dtypes", {}).values() if d.get("line")]
    lines += [f"with the rollout at its defaults: {line}" for line in default] if lines else default
    if not lines:
        lines = [f"* self-check: {data['self_check']['message']}"]
    if not explain:
        return "\n".join([*lines, "", EXPLAIN_HINT])
    target = consequence.get("target_length")
    bounds = consequence.get("bounds", {})
    trl = bounds.get("seq_mask_fraction_trl", {}).get("kept", "w ≤ 3")
    verl = bounds.get("seq_mask_fraction_verl", {}).get("kept", "0.5 ≤ w ≤ 2")
    batch = consequence.get("batch_size")
    lines += [
        "",
        "k3 KL: mean(r − 1 − log r), r = π/μ per sampled token; ÷: its factor over the reference "
        "(theory: bf16 ÷ fp16 ≈ 64). drift/1K: −1000·k1, how far Σ log π − log μ drifts per "
        "1,000 tokens (E_μ = −L·KL(μ‖π): the paper's Fig. 5 slope), ± its standard error.",
        f"seqs: the sequences measured, behind every figure of the row and its line. ESS: "
        f"effective share of the batch under sequence importance weights w = π/μ; masked: share "
        f"of sequences TRL's default sequence_mask ({trl}) and verl's Seq-MIS preset ({verl}) "
        f"drop, as measured.",
        (f"at {target:,}: " if target else "")
        + (
            f"the share of a batch of {batch:,} sequences "
            if batch
            else "the share of an infinite batch (a results file from before batch sizes) "
        )
        + "that still counts at the target length (the least of the batch's ESS and each "
        "mask's kept share), projected with S(L) ~ Normal(drift·L, variance·L); 90 % intervals "
        "in the lines above: shares Clopper-Pearson, variances and ESS a chi-square interval "
        "sized for heavy tails (precision_plugin._core.intervals).",
        "consequence: negligible < 1 % lost; noticeable: kept ≥ 0.5; costly: ≥ 0.3; severe "
        "below (0.5 and 0.3: verl's rollout-correction ESS guidance).",
    ]
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


def render_layerwise_table(result: ProbeResult | Mapping[str, Any]) -> Any:
    """A rich ``Table`` of the layerwise replay: per stage and dtype, the divergence of the two
    sides in rounding units (each side on its own, and the stage alone), float16 saturation;
    the caption says where the sides part. ``None`` without a replay."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    data = result.to_dict() if isinstance(result, ProbeResult) else result
    layerwise = data.get("layerwise")
    if not layerwise or not layerwise.get("dtypes"):
        return None
    dtypes = layerwise["dtypes"]
    lines = [d["line"] for d in dtypes.values()]
    lines.append(
        "u: the dtype's unit roundoff (2^-11 float16, 2^-8 bfloat16). alone: the stage fed the "
        "trainer's input (the error it adds itself). A stage parts when it adds more than "
        f"{layerwise.get('part_factor', 4):g}x the median stage's error."
    )
    table = Table(
        title="layerwise: rollout vs trainer hidden states, in units of rounding (u)",
        caption=escape("\n".join(lines)),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("stage", overflow="fold")
    for name in dtypes:
        table.add_column(f"{_SHORT.get(name, name)} u", justify="right", no_wrap=True)
        table.add_column(f"{_SHORT.get(name, name)} alone", justify="right", no_wrap=True)
    if "float16" in dtypes:
        table.add_column("fp16 at/near max", justify="right", no_wrap=True)
    first = next(iter(dtypes.values()))
    for i, stage in enumerate(first["stages"]):
        cells = []
        for d in dtypes.values():
            s = d["stages"][i] if i < len(d["stages"]) else {}
            mark = " ◀" if d.get("parted_at") == stage["name"] else ""
            cells += [_units(s.get("units")), _units(s.get("local_units")) + mark]
        if "float16" in dtypes:
            fp16 = dtypes["float16"]["stages"]
            s = fp16[i] if i < len(fp16) else {}
            cells.append(f"{s.get('saturated', 0)}/{s.get('near_limit', 0)}")
        table.add_row(escape(stage["name"]), *cells)
    return table


def _units(value: Any) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "n/a"
    return f"{value:.3g}"
