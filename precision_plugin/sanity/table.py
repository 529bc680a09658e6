"""The sanity benchmark's summary over seeds: as a rich table (the CLI) or Markdown (the docs).

Both read the JSON form (``SanityResult.to_dict()`` or a results file), so the docs tables
rendered from ``docs/results/*.json`` show exactly what the command printed.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from precision_plugin.sanity.aggregate import spread
from precision_plugin.sanity.schema import CONSEQUENCE_FIELDS, consequence_summary

#: The accuracy table's columns (accuracies are means over windows of ``config.window`` steps).
ACCURACY_COLUMNS: tuple[str, ...] = (
    "dtype", "acc start", "acc best", "acc end", "end − float32", "collapsed", "CPU s/step",
)  # fmt: skip
#: The mismatch table's columns.
MISMATCH_COLUMNS: tuple[str, ...] = (
    "dtype", "k3 mean", "max |Δp|", "1 − grad cos", "|seq log-ratio|", "skipped", "NaN",
)  # fmt: skip

#: The consequence table's columns (each step's telemetry:
# precision_plugin._core.metrics.consequence).
CONSEQUENCE_COLUMNS: tuple[str, ...] = (
    "dtype", "ESS", "ESS worst step", "TRL mask", "verl mask", "TIS clip",
)  # fmt: skip


def _pm(stat: dict[str, Any] | None, spec: str, sd_spec: str | None = None) -> str:
    """``mean ± sd`` (``mean`` alone for one seed), ``-`` when missing."""
    if stat is None:
        return "-"
    mean = format(stat["mean"], spec)
    if stat["n"] < 2:
        return mean
    return f"{mean} ± {format(stat['sd'], sd_spec or spec)}"


def _rel(stat: dict[str, Any] | None) -> str:
    """``mean ±r%`` (relative standard deviation) for small positive quantities."""
    if stat is None:
        return "-"
    mean = f"{stat['mean']:.1e}"
    if stat["n"] < 2 or not stat["mean"]:
        return mean
    return f"{mean} ±{100 * stat['sd'] / abs(stat['mean']):.0f}%"


def _one_minus(stat: dict[str, Any] | None) -> dict[str, Any] | None:
    if stat is None:
        return None
    return {"mean": 1.0 - stat["mean"], "sd": stat["sd"], "n": stat["n"]}


def _seeds(data: dict[str, Any]) -> list[int]:
    return [s["seed"] for s in data["seeds"]]


def accuracy_rows(data: dict[str, Any]) -> list[list[str]]:
    """Per dtype of the JSON form ``data``: training accuracy over the first, best and last
    windows, mean ± sample standard deviation over the seeds; the final window's paired
    difference from float32; the seeds where it collapsed; CPU seconds per GRPO step."""
    out = []
    for dtype, agg in data["aggregate"].items():
        paired = data["paired"].get(dtype, {}).get("final_accuracy_minus_float32")
        collapsed = agg["collapsed_seeds"]
        out.append([
            dtype,
            _pm(agg["first_accuracy"], ".2f"),
            _pm(agg["peak_accuracy"], ".2f"),
            _pm(agg["final_accuracy"], ".2f"),
            _pm(paired, "+.2f", ".2f"),
            ",".join(map(str, collapsed)) if collapsed else "none",
            _pm(data["timing"]["grpo_cpu_seconds_per_step"].get(dtype), ".2f"),
        ])  # fmt: skip
    return out


def mismatch_rows(data: dict[str, Any]) -> list[list[str]]:
    """Per dtype: mean k3, largest probability gap, 1 − gradient cosine and the mean
    |sequence log-ratio| (mean ±relative sd over seeds), skipped steps, NaN values (max)."""
    out = []
    for dtype, agg in data["aggregate"].items():
        skipped, nan = agg["skipped_steps"], agg["nan_values"]
        out.append([
            dtype,
            _rel(agg["mean_k3_kl"]),
            _rel(agg["max_prob_diff_max"]),
            _rel(_one_minus(agg["mean_grad_cosine"])),
            _pm(agg["mean_seq_log_ratio_abs"], ".3f"),
            "-" if skipped is None else f"{skipped['mean']:.1f}",
            "-" if nan is None else f"{nan['max']:.0f}",
        ])  # fmt: skip
    return out


def with_consequence(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a sanity JSON document) with every run's ``CONSEQUENCE_FIELDS`` and their
    spread over seeds in ``aggregate``, computed from the steps' telemetry where the document
    lacks them (one written before the summaries had them); a copy, ``data`` is left as is."""
    out = copy.deepcopy(data)
    for seed in out["seeds"]:
        for run in seed["runs"].values():
            summary = run.setdefault("summary", {})
            if any(f not in summary for f in CONSEQUENCE_FIELDS):
                telemetry = (step.get("telemetry") for step in run["steps"])
                summary.update(consequence_summary(telemetry))
    for dtype, agg in out["aggregate"].items():
        for f in CONSEQUENCE_FIELDS:
            if f not in agg:
                agg[f] = spread(seed["runs"][dtype]["summary"][f] for seed in out["seeds"])
    return out


def _share(stat: dict[str, Any] | None) -> str:
    """A mean share over seeds as a percentage (``± sd`` with several seeds)."""
    if stat is None:
        return "-"
    text = f"{stat['mean']:.2%}"
    return text if stat["n"] < 2 else f"{text} ± {stat['sd']:.2%}"


def consequence_rows(data: dict[str, Any]) -> list[list[str]]:
    """Per dtype: the effective sample size of the sequence importance weights (mean over the
    steps, then mean ± sd over the seeds; and the worst step of any seed), the shares of
    sequences TRL's default sequence_mask and verl's Seq-MIS preset would drop, and the share
    of tokens a TIS clip at 2 clips: what an importance-sampling correction would have done to
    these plain-policy-gradient batches. Empty when no step logged them."""
    out = []
    for dtype, c in with_consequence(data)["aggregate"].items():
        if all(c[f] is None for f in CONSEQUENCE_FIELDS):
            continue
        worst = c["min_ess"]
        out.append([
            dtype,
            _pm(c["mean_ess"], ".4f"),
            "-" if worst is None else f"{worst['min']:.3f}",
            _share(c["mean_seq_mask_fraction_trl"]),
            _share(c["mean_seq_mask_fraction_verl"]),
            _share(c["mean_tis_clip_fraction"]),
        ])  # fmt: skip
    return out


def consequence_markdown(data: dict[str, Any]) -> str:
    """``consequence_rows`` in Markdown (for docs rendered from results files)."""
    lines = [
        "| " + " | ".join(CONSEQUENCE_COLUMNS) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(CONSEQUENCE_COLUMNS) - 1)) + "|",
    ]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in consequence_rows(data)])


def size_needed(data: dict[str, Any]) -> dict[str, Any] | None:
    """How long the answers would have to be for bfloat16's mismatch to matter, from a run's
    own figures (None without a bfloat16 k3 or CPU times).

    If the per-token log-ratios add up as a random walk of per-token variance ``2·k3``, the
    expected ``|Σ(log π − log μ)|`` of an ``L``-token answer is ``√(2/π)·√(2·k3·L)``: 1 (a
    sequence weight off by a factor of e) at ``L = π / (4·k3)``. ``tokens`` is that for the
    mean k3 over seeds (``tokens_low`` / ``tokens_high`` for the largest and smallest seed's);
    ``protocol_cpu_hours`` the run's CPU time per GRPO step of every dtype, scaled linearly to
    answers of ``tokens`` (a lower bound: attention grows faster), times the steps and seeds."""
    k3 = data["aggregate"].get("bfloat16", {}).get("mean_k3_kl")
    per_step = data["timing"]["grpo_cpu_seconds_per_step"]
    answer = data["task"]["max_completion_tokens"]
    if not k3 or not k3["mean"] > 0 or any(v is None for v in per_step.values()):
        return None
    tokens = math.pi / (4 * k3["mean"])
    steps, seeds = data["config"]["steps"], len(data["config"]["seeds"])
    step_seconds = sum(v["mean"] for v in per_step.values()) * tokens / answer
    return {
        "k3": k3["mean"],
        "answer_tokens": answer,
        "tokens": tokens,
        "tokens_low": math.pi / (4 * k3["max"]),
        "tokens_high": math.pi / (4 * k3["min"]),
        "times_the_answers": tokens / answer,
        "protocol_cpu_hours": steps * seeds * step_seconds / 3600,
    }


def size_needed_text(data: dict[str, Any]) -> str:
    """``size_needed`` in one sentence (for the docs)."""
    n = size_needed(data)
    if n is None:
        return "(no bfloat16 k3 or CPU time to size it from)"

    def two(x: float) -> str:  # two significant figures: these are orders of magnitude
        return f"{float(f'{x:.2g}'):,.0f}"

    return (
        f"With the k3 bfloat16 had here ({n['k3']:.1e}), |Σ(log π − log μ)| reaches 1 on average "
        f"after π/(4·k3) ≈ {two(n['tokens'])} tokens ({two(n['tokens_low'])}–"
        f"{two(n['tokens_high'])} over the seeds), {two(n['times_the_answers'])}x these "
        f"{n['answer_tokens']}-token answers; at this run's CPU time per step, scaled only "
        f"linearly with the answer length, the same protocol would take at least "
        f"{two(n['protocol_cpu_hours'])} CPU hours"
    )


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
    """The headline ratio and, with float32 as the control, the degradation criterion's reading
    (the pre-registered verdict when the run is the full protocol, else marked indicative)."""
    ratio = data["k3_ratio_bf16_over_fp16"]
    parts = []
    if ratio is not None:
        spread = f" ± {ratio['sd']:.0f}" if ratio["n"] > 1 else ""
        parts.append(f"mean k3 bf16/fp16: {ratio['mean']:.0f}x{spread}")
    verdict = data["verdict"]
    degrades = {d: v["degrades"] for d, v in verdict["dtypes"].items()}
    if degrades:
        text = ", ".join(f"{d} {'degrades' if v else 'holds'}" for d, v in degrades.items())
        if verdict["protocol_complete"]:
            reproduced = verdict["paper_consequence_reproduced"]
            tail = "" if reproduced is None else f" (paper's consequence reproduced: {reproduced})"
            parts.append(f"pre-registered verdict vs float32: {text}{tail}")
        else:
            parts.append(f"criterion vs float32, indicative (not the full protocol): {text}")
    return "; ".join(parts)


def render_sanity_table(result: Any) -> Any:
    """The two tables (accuracy, mismatch) of a ``SanityResult`` or its JSON form, as one rich
    renderable."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

    data = result if isinstance(result, dict) else result.to_dict()
    tables = []
    sections = [
        (title(data), ACCURACY_COLUMNS, accuracy_rows(data)),
        ("train/rollout mismatch", MISMATCH_COLUMNS, mismatch_rows(data)),
    ]
    consequence = consequence_rows(data)
    if consequence:
        what = "what an importance-sampling correction would do to the batches"
        sections.append((what, CONSEQUENCE_COLUMNS, consequence))
    for name, columns, body in sections:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=name)
        for column in columns:
            table.add_column(column, justify="left" if column == "dtype" else "right")
        for row in body:
            table.add_row(*row)
        tables.append(table)
    tables[-1].caption = caption(data) or None
    return Group(*tables)


def markdown_table(data: dict[str, Any]) -> str:
    """The same two tables in Markdown (for docs rendered from results files)."""

    def table(columns: tuple[str, ...], body: list[list[str]]) -> list[str]:
        lines = [
            "| " + " | ".join(c.replace("|", "\\|") for c in columns) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|",
        ]
        return lines + ["| " + " | ".join(r) + " |" for r in body]

    accuracy = table(ACCURACY_COLUMNS, accuracy_rows(data))
    mismatch = table(MISMATCH_COLUMNS, mismatch_rows(data))
    return "\n".join([*accuracy, "", *mismatch])


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
