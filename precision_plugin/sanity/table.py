"""The sanity benchmark's summary over seeds: as a rich table (the CLI) or Markdown (the docs).

Both read the JSON form (``SanityResult.to_dict()`` or a results file), so the docs tables
rendered from ``docs/results/*.json`` show exactly what the command printed.
"""

from __future__ import annotations

from typing import Any

#: Column headers, in order.
COLUMNS: tuple[str, ...] = (
    "dtype", "acc start", "acc best", "acc end", "end − fp32", "k3 mean", "max |Δp|",
    "grad cos", "|seq log-ratio|", "skipped", "NaN", "CPU s/step",
)  # fmt: skip


def _pm(stat: dict[str, Any] | None, spec: str, sd_spec: str | None = None) -> str:
    """``mean ± sd`` (``mean`` alone for one seed), ``-`` when missing."""
    if stat is None:
        return "-"
    mean = format(stat["mean"], spec)
    if stat["n"] < 2:
        return mean
    return f"{mean} ± {format(stat['sd'], sd_spec or spec)}"


def _seeds(data: dict[str, Any]) -> list[int]:
    return [s["seed"] for s in data["seeds"]]


def rows(data: dict[str, Any]) -> list[list[str]]:
    """One row per dtype of the JSON form ``data``: means ± sample standard deviations over the
    seeds of each run's summary (accuracies over windows of ``config.window`` steps)."""
    out = []
    for dtype, agg in data["aggregate"].items():
        paired = data["paired"].get(dtype, {}).get("final_accuracy_minus_float32")
        skipped = agg["skipped_steps"]
        nan = agg["nan_values"]
        out.append([
            dtype,
            _pm(agg["first_accuracy"], ".2f"),
            _pm(agg["peak_accuracy"], ".2f"),
            _pm(agg["final_accuracy"], ".2f"),
            _pm(paired, "+.2f", ".2f"),
            _pm(agg["mean_k3_kl"], ".1e"),
            _pm(agg["max_prob_diff_max"], ".1e"),
            _pm(agg["mean_grad_cosine"], ".4f"),
            _pm(agg["mean_seq_log_ratio_abs"], ".3f"),
            "-" if skipped is None else f"{skipped['mean']:.1f}",
            "-" if nan is None else f"{nan['max']:.0f}",
            _pm(data["timing"]["grpo_cpu_seconds_per_step"].get(dtype), ".2f"),
        ])  # fmt: skip
    return out


def title(data: dict[str, Any]) -> str:
    """What ran: preset, steps, seeds and where pretraining left the model."""
    config = data["config"]
    start = [s["pretrain"]["sampled_accuracy"] for s in data["seeds"]]
    seeds = ",".join(map(str, _seeds(data)))
    return (
        f"sanity GRPO ({config['preset']} preset), {config['steps']} steps/dtype, seeds {seeds} "
        f"(start: {min(start):.2f}-{max(start):.2f} sampled accuracy after pretraining)"
    )


def caption(data: dict[str, Any]) -> str:
    """The headline ratio and, with float32 as the control, the pre-registered verdict."""
    ratio = data["k3_ratio_bf16_over_fp16"]
    parts = []
    if ratio is not None:
        spread = f" ± {ratio['sd']:.0f}" if ratio["n"] > 1 else ""
        parts.append(f"mean k3 bf16/fp16: {ratio['mean']:.0f}x{spread}")
    verdict = data["verdict"]
    degrades = {d: v["degrades"] for d, v in verdict["dtypes"].items()}
    if degrades:
        text = ", ".join(f"{d} {'degrades' if v else 'holds'}" for d, v in degrades.items())
        parts.append(f"vs float32: {text}")
    return "; ".join(parts)


def render_sanity_table(result: Any) -> Any:
    """A ``rich.table.Table`` of a ``SanityResult`` or its JSON form."""
    from rich import box
    from rich.table import Table

    data = result if isinstance(result, dict) else result.to_dict()
    table = Table(
        box=box.SIMPLE_HEAD, pad_edge=False, title=title(data), caption=caption(data) or None
    )
    for name in COLUMNS:
        table.add_column(name, justify="left" if name == "dtype" else "right")
    for row in rows(data):
        table.add_row(*row)
    return table


def markdown_table(data: dict[str, Any]) -> str:
    """The same table in Markdown (for docs rendered from results files)."""
    lines = [
        "| " + " | ".join(c.replace("|", "\\|") for c in COLUMNS) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(data)]
    return "\n".join(lines)


def per_seed_markdown(data: dict[str, Any]) -> str:
    """Each seed's pretraining and, per dtype, its final-window accuracy (and the change from
    float32 in the same seed) and mean k3, in Markdown."""
    dtypes = list(data["config"]["dtypes"])
    head = ["seed", "pretraining steps", "start acc"]
    head += [f"{d} acc end" for d in dtypes] + [f"{d} k3" for d in dtypes if d != "float32"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---:"] * len(head)) + "|"]
    for seed in data["seeds"]:
        runs = seed["runs"]
        control = runs.get("float32", {}).get("summary", {}).get("final_accuracy")
        cells = [str(seed["seed"]), str(seed["pretrain"]["steps"]),
                 f"{seed['pretrain']['sampled_accuracy']:.2f}"]  # fmt: skip
        for d in dtypes:
            final = runs[d]["summary"]["final_accuracy"]
            delta = f" ({final - control:+.2f})" if d != "float32" and control is not None else ""
            cells.append("-" if final is None else f"{final:.2f}{delta}")
        for d in dtypes:
            if d != "float32":
                k3 = runs[d]["summary"]["mean_k3_kl"]
                cells.append("-" if k3 is None else f"{k3:.1e}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
