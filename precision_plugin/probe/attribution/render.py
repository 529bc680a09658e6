"""The attribution as a rich table, rendered from its JSON form (``attribution`` section), so a
results file renders the same table as the run that wrote it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from precision_plugin.probe.attribution.fixes import FIX_ORDER
from precision_plugin.probe.attribution.settings import changed_settings

_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
#: The k3 bootstrap's level in results files written before the section stated its
#: ``coverage``: 95 % (since then the project's one level, ``intervals.COVERAGE``, 90 %).
UNSTATED_COVERAGE = 0.95
#: The residual row's words in a table of Shapley shares.
RESIDUAL_WORDS = "the rollout as measured beyond all causes switched on together (rescored)"


def _k3(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}e}"


def _interval(row: Mapping[str, Any]) -> str:
    low, high = row["k3_interval"]
    return f"{_k3(row['k3'])} [{_k3(low, 1)}, {_k3(high, 1)}]"


def _share(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.0%}" if value < 0 else f"{value:.0%}"


def _share_interval(row: Mapping[str, Any]) -> str:
    """A share with its interval (``62% [55%, 70%]``); the share alone where it has none."""
    interval = row.get("share_interval")
    if row.get("share") is None or not interval or None in interval:
        return _share(row.get("share"))
    return f"{_share(row['share'])} [{_share(interval[0])}, {_share(interval[1])}]"


def _fix(fixes: Mapping[str, str]) -> str:
    for key in FIX_ORDER:
        if key in fixes:
            return f"{key}: {fixes[key]}"
    return next((f"{k}: {v}" for k, v in fixes.items()), "")


def dtype_fix(section: Mapping[str, Any], dtype: str) -> str:
    """The ``dtype`` row's fix in ``dtype``'s block, with the ratio this run measured: the
    dtype row's k3 (the compute dtype's own rounding) of bfloat16 over float16's; float32, the
    reference, has none."""
    if dtype == "float32":
        return "none: float32 is the reference the other dtypes are measured against"
    rows = {d: b.get("causes", {}).get("dtype", {}) for d, b in section.get("dtypes", {}).items()}
    fp16, bf16 = rows.get("float16", {}).get("k3"), rows.get("bfloat16", {}).get("k3")
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


def _row_fix(section: Mapping[str, Any], dtype: str, cause: str, row: Mapping[str, Any]) -> str:
    truncation = row.get("truncation")
    if truncation:
        return (
            f"ratios biased: log mass kept {truncation['mean_log_mass_kept']:.3g}/token "
            f"(note below); fix: logprobs_mode=processed_logprobs, or top_p=1, top_k=-1"
        )
    if not row["in_total"]:
        return f"if {row.get('what_if', '')}"
    fix = dtype_fix(section, dtype) if cause == "dtype" else _fix(row["fixes"])
    return f"{row['note']}. {fix}" if row.get("note") else fix


def render_attribution_table(
    section: Mapping[str, Any], decision: Mapping[str, Any] | None = None
) -> Any:
    """A rich ``Table`` of the JSON ``attribution`` section: per dtype a row per cause (k3 with
    its interval at the section's ``coverage``, share, bit-identical share, the fix), then
    interaction, residual and total.
    ``decision``: the probe's one decision (``consequence.decision``) the caption points at for
    what to change first (the table makes no decision of its own)."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    rollout = section.get("rollout", {})
    changed = changed_settings(rollout)
    table = Table(
        title="why it is still off: the mismatch by cause (--attribute)",
        caption=escape(_caption(section, changed, decision)),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
    )
    blocks = _blocks(section)
    level = f"{100 * section.get('coverage', UNSTATED_COVERAGE):g}"
    # Results with Shapley (or sequential) shares of k3 give each share its interval.
    share = f"share [{level}% CI]" if section.get("shares") else "share"
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


def _blocks(section: Mapping[str, Any]) -> list[list[tuple[str, ...]]]:
    """The table's cells (markup), one block of rows per dtype: its causes, interaction,
    residual and total."""
    from rich.markup import escape

    blocks: list[list[tuple[str, ...]]] = []
    split = bool(section.get("shares"))
    for dtype, block in section.get("dtypes", {}).items():
        rows: list[tuple[str, ...]] = []
        blocks.append(rows)
        first = True
        for cause, row in block["causes"].items():
            name = cause if row["in_total"] else f"({cause})"
            flips = row.get("expert_flips")
            if flips is not None:
                name += f", experts flip {flips:.1%}"
            rows.append((
                _SHORT.get(dtype, dtype) if first else "", name, _interval(row),
                _share_interval(row) if split else _share(row["share"]),
                f"{row['bitwise_equal']:.1%}" if row["bitwise_equal"] is not None else "-",
                escape(_row_fix(section, dtype, cause, row)),
            ))  # fmt: skip
            first = False
        if split:
            residual = block["residual"]
            rows.append((
                "", "residual", "", _share_interval(residual), "",
                escape(residual.get("note", RESIDUAL_WORDS)),
            ))  # fmt: skip
        for term in () if split else ("interaction", "residual"):
            rows.append(("", term, "", _share(block[term]["share"]), "", ""))
        total = block["total"]
        rows.append((
            "", "[bold]total[/]", _interval(total), "100%",
            f"{total['bitwise_equal']:.1%}" if total["bitwise_equal"] is not None else "-", "",
        ))  # fmt: skip
    return blocks


def _caption(
    section: Mapping[str, Any], changed: Mapping[str, Any], decision: Mapping[str, Any] | None
) -> str:
    rollout = ", ".join(f"{k}={v}" for k, v in changed.items()) or "defaults"
    lines = [
        f"rollout settings: {rollout}; stale weights at lr {section.get('learning_rate'):g}.",
        _shares_line(section),
    ]
    if section.get("first_change"):
        lines.append(_pointer(decision))
    for dtype, block in section.get("dtypes", {}).items():
        if block.get("layerwise"):
            lines.append(f"layerwise ({dtype}): {block['layerwise']}")
    lines.extend(section.get("notes", []))
    return "\n".join(lines)


def _shares_line(section: Mapping[str, Any]) -> str:
    """What the share column is: Shapley (or sequential) shares of k3 with their intervals, or
    (results written before them) shares of E[d^2]/2 with an interaction."""
    method = section.get("shares")
    if not method:
        return (
            "(cause): not in this rollout; what it would add if switched on (no share). Shares "
            "of E[d^2]/2; interaction = covariances between causes, residual = what they do "
            "together beyond their sum; the shares add up to 100%."
        )
    level = f"{100 * section.get('coverage', UNSTATED_COVERAGE):g}"
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


def _pointer(decision: Mapping[str, Any] | None) -> str:
    """Where what to change first is decided: the probe's one advice line."""
    if not decision:
        return "change first: the probe's advice line (consequence.decision) decides it."
    setting = decision.get("change_first")
    if setting:
        return (
            f"change first: {setting}, as the advice line says (decided by "
            f"{decision['decided_by']})."
        )
    if not decision.get("dtype"):  # nothing measured to compare, or a setup/model to fix
        what = str(decision.get("line", "")).removeprefix("do: ").rstrip(".")
        return f"change first: no rollout setting; the advice line decides ({what})."
    return (
        f"change first: the advice line's {decision['dtype']} (decided by "
        f"{decision['decided_by']}); no rollout setting outweighs the dtype's own rounding."
    )
