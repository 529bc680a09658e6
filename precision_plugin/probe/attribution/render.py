"""The attribution as a rich table. The probe renders it from its
[`AttributionReport`][precision_plugin.probe.attribution.report.AttributionReport] and the one
[`Decision`][precision_plugin._core.decision.Decision]; the docs render it from a results file's
JSON
``attribution`` section (and ``consequence.decision``). Both are read into one view (``_View``,
only what the table shows, each number as the JSON writes it), so a results file renders the
same table as the run that wrote it; ``to_dict()`` is the JSON, not the table's input."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from precision_plugin._core.decision import Decision
from precision_plugin._core.intervals import COVERAGE
from precision_plugin.probe.attribution.fixes import CAUSE_TABLE, FIX_ORDER
from precision_plugin.probe.attribution.report import (
    AttributionReport,
    CauseRow,
    DtypeAttribution,
    _num,
    part_note,
)
from precision_plugin.probe.attribution.settings import changed_settings

_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
#: The k3 bootstrap's level in results files written before the section stated its
#: ``coverage``: 95 % (since then the project's one level, ``intervals.COVERAGE``, 90 %).
UNSTATED_COVERAGE = 0.95
#: The residual row's words in a table of Shapley shares.
RESIDUAL_WORDS = "the rollout as measured beyond all causes switched on together (rescored)"

#: A k3 with its interval: value, low, high (``None``: not finite, as the JSON writes it).
_Interval = tuple[Any, Any, Any]


@dataclass(frozen=True)
class _Row:
    """What the table shows of one cause in one dtype."""

    cause: str
    in_total: bool
    k3: _Interval
    share: float | None
    #: The share's interval (``None``: the row has no split, results written before them).
    share_interval: tuple[Any, Any] | None
    bitwise_equal: float | None
    expert_flips: float | None = None
    #: The sampling row of a truncated rollout with raw log-probs: the mean log mass kept.
    truncated: bool = False
    truncation: Any = None
    what_if: str = ""
    note: str = ""
    fixes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Block:
    """One dtype's rows, its residual (and, without shares, the interaction) and its total."""

    dtype: str
    rows: list[_Row]
    total: _Interval
    total_bitwise_equal: float | None
    residual_share: Any
    residual_interval: tuple[Any, Any] | None
    residual_note: str
    interaction_share: Any
    layerwise: str | None


@dataclass(frozen=True)
class _View:
    """The whole table: the blocks and what its caption says."""

    changed: Mapping[str, Any]
    learning_rate: Any
    coverage: float
    #: ``shapley`` or ``sequential``; empty for results written before the shares.
    shares: str
    first_change: bool
    notes: list[str]
    blocks: list[_Block]
    #: Each dtype's ``dtype`` row's k3, which that row's fix quotes as a ratio.
    dtype_k3: dict[str, Any]


def _view(section: AttributionReport | Mapping[str, Any]) -> _View:
    return _report_view(section) if isinstance(section, AttributionReport) else _json_view(section)


def _report_view(report: AttributionReport) -> _View:
    methods = {a.shares.method for a in report.dtypes.values() if a.shares is not None}
    return _View(
        changed=changed_settings(report.settings.to_dict()),
        learning_rate=report.learning_rate,
        coverage=COVERAGE,
        shares="sequential" if "sequential" in methods else "shapley",
        first_change=report.first is not None,
        notes=list(report.notes),
        blocks=[_report_block(block) for block in report.dtypes.values()],
        dtype_k3=_dtype_k3(report),
    )


def _report_block(block: DtypeAttribution) -> _Block:
    total = block.total
    if block.shares is None:  # results without shares: parts of E[d^2]/2 with an interaction
        share = (lambda x: x / block.total_part) if block.total_part > 0 else (lambda x: None)
        residual_share, residual_interval, note = share(block.residual), None, RESIDUAL_WORDS
        interaction = share(block.interaction)
    else:
        residual = block.shares.residual
        residual_share = _num(residual.share)
        residual_interval = (_num(residual.share_low), _num(residual.share_high))
        note, interaction = part_note(residual) or RESIDUAL_WORDS, None
    return _Block(
        dtype=block.dtype,
        rows=[_report_row(row) for row in block.rows],
        total=(_num(total.value), _num(total.low), _num(total.high)),
        total_bitwise_equal=_num(block.bitwise_equal),
        residual_share=residual_share,
        residual_interval=residual_interval,
        residual_note=note,
        interaction_share=interaction,
        layerwise=block.layerwise,
    )


def _report_row(row: CauseRow) -> _Row:
    split = row.split
    return _Row(
        cause=row.cause,
        in_total=row.in_total,
        k3=(_num(row.k3.value), _num(row.k3.low), _num(row.k3.high)),
        share=_num(row.share) if row.share is not None else None,
        share_interval=(
            (_num(split.share_low), _num(split.share_high)) if split is not None else None
        ),
        bitwise_equal=_num(row.bitwise_equal),
        expert_flips=row.expert_flips,
        truncated=row.truncation is not None,
        truncation=_num(row.truncation),
        what_if=row.what_if,
        note=row.note(),
        fixes=CAUSE_TABLE[row.cause].fixes,
    )


def _json_view(section: Mapping[str, Any]) -> _View:
    return _View(
        changed=changed_settings(section.get("rollout", {})),
        learning_rate=section.get("learning_rate"),
        coverage=section.get("coverage", UNSTATED_COVERAGE),
        shares=section.get("shares") or "",
        first_change=bool(section.get("first_change")),
        notes=list(section.get("notes", [])),
        blocks=[_json_block(d, block) for d, block in section.get("dtypes", {}).items()],
        dtype_k3=_dtype_k3(section),
    )


def _json_block(dtype: str, block: Mapping[str, Any]) -> _Block:
    total, residual = block["total"], block.get("residual", {})
    interval = residual.get("share_interval")
    return _Block(
        dtype=dtype,
        rows=[_json_row(cause, row) for cause, row in block["causes"].items()],
        total=(total["k3"], *total["k3_interval"]),
        total_bitwise_equal=total["bitwise_equal"],
        residual_share=residual.get("share"),
        residual_interval=tuple(interval) if interval else None,  # type: ignore[arg-type]
        residual_note=residual.get("note", RESIDUAL_WORDS),
        interaction_share=block.get("interaction", {}).get("share"),
        layerwise=block.get("layerwise"),
    )


def _json_row(cause: str, row: Mapping[str, Any]) -> _Row:
    interval = row.get("share_interval")
    truncation = row.get("truncation")
    return _Row(
        cause=cause,
        in_total=row["in_total"],
        k3=(row["k3"], *row["k3_interval"]),
        share=row["share"],
        share_interval=tuple(interval) if interval else None,  # type: ignore[arg-type]
        bitwise_equal=row["bitwise_equal"],
        expert_flips=row.get("expert_flips"),
        truncated=bool(truncation),
        truncation=truncation["mean_log_mass_kept"] if truncation else None,
        what_if=row.get("what_if", ""),
        note=row.get("note") or "",
        fixes=row.get("fixes", {}),
    )


def _k3(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}e}"


def _interval(value: Any, low: Any, high: Any) -> str:
    """A k3 with its interval: ``1.50e-03 [1.0e-03, 2.1e-03]``."""
    return f"{_k3(value)} [{_k3(low, 1)}, {_k3(high, 1)}]"


def _share(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.0%}" if value < 0 else f"{value:.0%}"


def _share_interval(share: Any, interval: tuple[Any, Any] | None) -> str:
    """A share with its interval (``62% [55%, 70%]``); the share alone where it has none."""
    if share is None or not interval or None in interval:
        return _share(share)
    return f"{_share(share)} [{_share(interval[0])}, {_share(interval[1])}]"


def _fix(fixes: Mapping[str, str]) -> str:
    for key in FIX_ORDER:
        if key in fixes:
            return f"{key}: {fixes[key]}"
    return next((f"{k}: {v}" for k, v in fixes.items()), "")


def dtype_fix(section: AttributionReport | Mapping[str, Any], dtype: str) -> str:
    """The ``dtype`` row's fix in ``dtype``'s block, with the ratio this run measured: the
    dtype row's k3 (the compute dtype's own rounding) of bfloat16 over float16's; float32, the
    reference, has none. ``section``: the report, or its JSON form."""
    return _dtype_fix(_dtype_k3(section), dtype)


def _dtype_k3(section: AttributionReport | Mapping[str, Any]) -> dict[str, Any]:
    """Each dtype's ``dtype`` row's k3 (``None``: not measured or not finite)."""
    if isinstance(section, AttributionReport):
        rows = {d: b.row("dtype") for d, b in section.dtypes.items()}
        return {d: _num(r.k3.value) if r is not None else None for d, r in rows.items()}
    blocks = section.get("dtypes", {}).items()
    return {d: b.get("causes", {}).get("dtype", {}).get("k3") for d, b in blocks}


def _dtype_fix(k3: Mapping[str, Any], dtype: str) -> str:
    if dtype == "float32":
        return "none: float32 is the reference the other dtypes are measured against"
    fp16, bf16 = k3.get("float16"), k3.get("bfloat16")
    if isinstance(fp16, (int, float)) and isinstance(bf16, (int, float)) and fp16 > 0 < bf16:
        ratio = bf16 / fp16
        measured = (
            f"{ratio:.0f}x less per token than bfloat16 in this run"
            if ratio >= 1
            else f"{1 / ratio:.1f}x more per token than bfloat16 in this run"
        )
    else:
        measured = "its ratio to bfloat16 needs both dtypes measured (--dtypes)"
    if dtype == "float16":
        return f"precision_plugin: pp.enable() keeps float16 on both sides ({measured})"
    return f"precision_plugin: pp.enable() (float16 on both sides: {measured})"


def _row_fix(k3: Mapping[str, Any], dtype: str, row: _Row) -> str:
    if row.truncated:
        return (
            f"ratios biased: log mass kept {row.truncation:.3g}/token "
            f"(note below); fix: logprobs_mode=processed_logprobs, or top_p=1, top_k=-1"
        )
    if not row.in_total:
        return f"if {row.what_if}"
    fix = _dtype_fix(k3, dtype) if row.cause == "dtype" else _fix(row.fixes)
    return f"{row.note}. {fix}" if row.note else fix


def render_attribution_table(
    section: AttributionReport | Mapping[str, Any],
    decision: Decision | Mapping[str, Any] | None = None,
) -> Any:
    """A rich ``Table`` of the attribution (the report, or its JSON ``attribution`` section):
    per dtype a row per cause (k3 with its interval at the section's ``coverage``, share,
    bit-identical share, the fix), then interaction, residual and total.
    ``decision``: the probe's one decision (``consequence.decision``, or its JSON form) the
    caption points at for what to change first (the table makes no decision of its own)."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    view = _view(section)
    table = Table(
        title="why it is still off: the mismatch by cause (--attribute)",
        caption=escape(_caption(view, decision)),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
    )
    blocks = _blocks(view)
    level = f"{100 * view.coverage:g}"
    # Results with Shapley (or sequential) shares of k3 give each share its interval.
    share = f"share [{level}% CI]" if view.shares else "share"
    rows = [row for block in blocks for row in block]
    for i, (header, justify) in enumerate((
        ("dtype", "left"), ("cause", "left"), (f"k3 [{level}% CI]", "right"), (share, "right"),
        ("bit-eq", "right"), ("fix (what-if: what was switched)", "left"),
    )):  # fmt: skip
        if header.startswith("fix"):
            # The one column that wraps: on a narrow console or in a file (100 columns) the
            # fixes fold onto more lines and every number keeps all its digits.
            table.add_column(header, justify=justify, overflow="fold", min_width=16)
            continue
        widest = max((len(_plain(row[i])) for row in rows), default=0)
        table.add_column(header, justify=justify, no_wrap=True, min_width=max(len(header), widest))
    for block in blocks:
        for i, row in enumerate(block):
            table.add_row(*row, end_section=i == len(block) - 1)
    return table


def _plain(cell: str) -> str:
    from rich.text import Text

    return Text.from_markup(cell).plain


def _percent(value: Any) -> str:
    return f"{value:.1%}" if value is not None else "-"


def _blocks(view: _View) -> list[list[tuple[str, ...]]]:
    """The table's cells (markup), one block of rows per dtype: its causes, interaction,
    residual and total."""
    from rich.markup import escape

    blocks: list[list[tuple[str, ...]]] = []
    split = bool(view.shares)
    for block in view.blocks:
        rows: list[tuple[str, ...]] = []
        blocks.append(rows)
        first = True
        for row in block.rows:
            name = row.cause if row.in_total else f"({row.cause})"
            if row.expert_flips is not None:
                name += f", experts flip {row.expert_flips:.1%}"
            rows.append((
                _SHORT.get(block.dtype, block.dtype) if first else "", name, _interval(*row.k3),
                _share_interval(row.share, row.share_interval) if split else _share(row.share),
                _percent(row.bitwise_equal), escape(_row_fix(view.dtype_k3, block.dtype, row)),
            ))  # fmt: skip
            first = False
        if split:
            rows.append((
                "", "residual", "", _share_interval(block.residual_share, block.residual_interval),
                "", escape(block.residual_note),
            ))  # fmt: skip
        else:
            rows.append(("", "interaction", "", _share(block.interaction_share), "", ""))
            rows.append(("", "residual", "", _share(block.residual_share), "", ""))
        rows.append((
            "", "[bold]total[/]", _interval(*block.total), "100%",
            _percent(block.total_bitwise_equal), "",
        ))  # fmt: skip
    return blocks


def _caption(view: _View, decision: Decision | Mapping[str, Any] | None) -> str:
    rollout = ", ".join(f"{k}={v}" for k, v in view.changed.items()) or "defaults"
    lines = [
        f"rollout settings: {rollout}; stale weights at lr {view.learning_rate:g}.",
        _shares_line(view),
    ]
    if view.first_change:
        lines.append(_pointer(decision))
    for block in view.blocks:
        if block.layerwise:
            lines.append(f"layerwise ({block.dtype}): {block.layerwise}")
    lines.extend(view.notes)
    return "\n".join(lines)


def _shares_line(view: _View) -> str:
    """What the share column is: Shapley (or sequential) shares of k3 with their intervals, or
    (results written before them) shares of E[d^2]/2 with an interaction."""
    method = view.shares
    if not method:
        return (
            "(cause): not in this rollout; what it would add if switched on (no share). Shares "
            "of E[d^2]/2; interaction = covariances between causes, residual = what they do "
            "together beyond their sum; the shares add up to 100%."
        )
    level = f"{100 * view.coverage:g}"
    how = (
        "Shapley shares of k3: each cause's saving averaged over every order of switching the "
        "causes on together (rescored on the same tokens)"
        if method == "shapley"
        else "sequential shares of k3: the causes switched on one after the other in the "
        "table's order, each what it adds (more causes than a Shapley split rescores)"
    )
    return (
        f"(cause): not in this rollout; what it would add if switched on (no share). {how}; "
        f"k3 per cause: that cause alone against the common base. residual = the rollout as "
        f"measured minus all causes switched on together; the shares add up to 100%. Each "
        f"share's {level}% interval comes from one bootstrap over sequences; a share whose "
        f"interval holds 0 is not distinguishable from 0."
    )


def _pointer(decision: Decision | Mapping[str, Any] | None) -> str:
    """Where what to change first is decided: the probe's one advice line (``decision``: the
    [`Decision`][precision_plugin._core.decision.Decision], or its JSON form)."""
    if not decision:
        return "change first: the probe's advice line (consequence.decision) decides it."
    if isinstance(decision, Decision):
        setting, dtype, decided_by = decision.change_first, decision.dtype, decision.decided_by
        line = decision.line
    else:
        setting, dtype = decision.get("change_first"), decision.get("dtype")
        decided_by, line = decision.get("decided_by"), decision.get("line", "")
    if setting:
        return f"change first: {setting}, as the advice line says (decided by {decided_by})."
    if not dtype:  # nothing measured to compare, or a setup/model to fix
        what = str(line).removeprefix("do: ").rstrip(".")
        return f"change first: no rollout setting; the advice line decides ({what})."
    return (
        f"change first: the advice line's {dtype} (decided by {decided_by}); no rollout "
        f"setting outweighs the dtype's own rounding."
    )
