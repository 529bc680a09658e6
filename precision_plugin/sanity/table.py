"""The sanity benchmark's summary as a rich table."""

from __future__ import annotations

from typing import Any


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_sanity_table(result: Any) -> Any:
    """A ``rich.table.Table``: one row per dtype, accuracy and mismatch summaries."""
    from rich import box
    from rich.table import Table

    ratio = result.k3_ratio_bf16_over_fp16
    pre = result.pretrain
    table = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        title=(
            f"sanity GRPO, {result.config.steps} steps/dtype (start: {pre['sampled_accuracy']:.2f} "
            f"sampled accuracy after {pre['steps']} pretraining steps)"
        ),
        caption=f"mean k3 bf16/fp16: {ratio:.1f}x" if ratio else None,
    )
    # accuracy at step 1, its peak, its mean over the last 5 steps; seconds per dtype
    for name in ("dtype", "acc 1st", "acc max", "acc end", "k3_kl mean", "pdiff max",
                 "scale", "skipped", "NaN", "s"):  # fmt: skip
        table.add_column(name, justify="left" if name == "dtype" else "right", min_width=len(name))
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
