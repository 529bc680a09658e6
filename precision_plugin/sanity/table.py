"""The sanity benchmark's summary as a rich table."""

from __future__ import annotations

from typing import Any


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_sanity_table(result: Any) -> Any:
    """A ``rich.table.Table``: one row per dtype, accuracy and mismatch summaries."""
    from rich.table import Table

    ratio = result.k3_ratio_bf16_over_fp16
    pre = result.pretrain
    table = Table(
        title=(
            f"sanity GRPO, {result.config.steps} steps/dtype (start: {pre['sampled_accuracy']:.2f} "
            f"sampled accuracy after {pre['steps']} pretraining steps)"
        ),
        caption=f"mean k3 bf16/fp16: {ratio:.1f}x" if ratio else None,
    )
    for name in ("dtype", "acc first", "acc peak", "acc last5", "mean k3_kl", "max prob_diff",
                 "loss scale", "skipped", "NaN", "seconds"):  # fmt: skip
        table.add_column(name, justify="left" if name == "dtype" else "right")
    for dtype, run in result.runs.items():
        s = run.summary or run.summarize()
        table.add_row(
            dtype,
            _fmt(s["first_accuracy"], ".2f"),
            _fmt(s["peak_accuracy"], ".2f"),
            _fmt(s["final_accuracy"], ".2f"),
            _fmt(s["mean_k3_kl"], ".2e"),
            _fmt(s["max_prob_diff_max"], ".2e"),
            _fmt(s["final_loss_scale"], ".0f"),
            _fmt(s["skipped_steps"], ".0f"),
            str(s["nan_values"]),
            _fmt(s["seconds"], ".0f"),
        )
    return table
