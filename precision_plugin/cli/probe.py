"""``precision-plugin probe``: measure the train/rollout mismatch of a model in each dtype."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from precision_plugin.cli.argtypes import (
    UsageError,
    dtype_list,
    non_negative_int,
    positive_int,
)
from precision_plugin.cli.exit_codes import ExitCode
from precision_plugin.cli.output import check_outputs, run_and_report
from precision_plugin.errors import PrecisionConfigError


def engine_names() -> list[str]:
    """The rollout engines installed (plugins add more); asking can be slow (vLLM)."""
    from precision_plugin.probe import available_engines

    return sorted(available_engines())


def add_parser(sub: Any, engines: Sequence[str]) -> None:
    """The ``probe`` subcommand; ``engines`` are the ``--engine`` choices."""
    from precision_plugin.policy import OverflowSettings
    from precision_plugin.probe import (
        DEFAULT_BATCH_SIZE,
        DEFAULT_DTYPES,
        DEFAULT_MAX_NEW_TOKENS,
        DEFAULT_NUM_PROMPTS,
        DEFAULT_SEED,
        DEFAULT_TARGET_LENGTH,
        ProbeConfig,
    )

    # The library's defaults, one definition each (ProbeConfig's fields, the overflow policy's
    # margin): an option left out means what the Python API means without it.
    config = {f.name: f.default for f in fields(ProbeConfig)}
    engine, device, min_new_tokens = config["engine"], config["device"], config["min_new_tokens"]
    margin_bits = OverflowSettings.margin_bits

    probe = sub.add_parser(
        "probe",
        help="measure the train/rollout mismatch of a model in each dtype",
        description=(
            "Sample completions with a rollout engine in each dtype, score the same tokens the "
            "way a trainer does (fp32 master weights, autocast), and report the mismatch. "
            "float32 always runs first as the self-check."
        ),
    )
    probe.add_argument(
        "--model",
        metavar="PATH",
        help="local HF causal-LM checkpoint folder with tokenizer (default: embedded tiny Llama)",
    )
    probe.add_argument(
        "--engine",
        default=engine,
        choices=list(engines),
        help=f"rollout engine (default: {engine}; plugins add more, e.g. vllm)",
    )
    probe.add_argument(
        "--dtypes",
        type=dtype_list,
        default=DEFAULT_DTYPES,
        metavar="LIST",
        help=f"comma list of dtypes, aliases ok (default: {','.join(DEFAULT_DTYPES)})",
    )
    probe.add_argument(
        "--prompts",
        metavar="FILE",
        help="your prompts: one per line, or JSONL with a 'prompt' or chat 'messages' field "
        "(default: built-in prompts)",
    )
    probe.add_argument(
        "--num-prompts",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"completions per dtype, prompts cycled (default: every prompt of --prompts, "
        f"else {DEFAULT_NUM_PROMPTS})",
    )
    probe.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=DEFAULT_MAX_NEW_TOKENS,
        metavar="N",
        help=f"longest completion; lengths are spread up to it (default: {DEFAULT_MAX_NEW_TOKENS})",
    )
    probe.add_argument(
        "--min-new-tokens",
        type=non_negative_int,
        default=min_new_tokens,
        metavar="N",
        help="suppress EOS until a completion has N tokens, so weak or random models produce "
        f"long sequences (default: {min_new_tokens})",
    )
    probe.add_argument(
        "--seed",
        type=non_negative_int,
        default=DEFAULT_SEED,
        help=f"sampling seed (default: {DEFAULT_SEED})",
    )
    probe.add_argument(
        "--device",
        default=device,
        help=f"torch device: {device} (default), cpu, cuda, cuda:1, mps, xpu",
    )
    probe.add_argument(
        "--margin-bits",
        type=float,
        default=margin_bits,
        metavar="BITS",
        help="flag modules whose largest activation is within 2**BITS of float16's max "
        f"(default: {margin_bits:g})",
    )
    probe.add_argument(
        "--target-length",
        type=positive_int,
        default=DEFAULT_TARGET_LENGTH,
        metavar="N",
        help="completion length you train at: the consequence section projects to it "
        f"(default: {DEFAULT_TARGET_LENGTH})",
    )
    probe.add_argument(
        "--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE, metavar="N",
        help=f"sequences per batch the ESS is given for (default: {DEFAULT_BATCH_SIZE})",
    )  # fmt: skip
    probe.add_argument(
        "--layerwise",
        action="store_true",
        help="also replay each dtype's longest sample through both sides layer by layer and "
        "report where they part",
    )
    from precision_plugin.cli.probe_attribution import add_attribution_options

    add_attribution_options(probe)
    probe.add_argument(
        "--explain",
        action="store_true",
        help="also say what each column and verdict of the table means",
    )
    probe.add_argument("--json", metavar="FILE", help="write the results as JSON ('-': stdout)")
    probe.add_argument(
        "--plot", metavar="FILE.png", help="write the offline-mismatch figure (needs matplotlib)"
    )


def _plot(result: Any, path: Path) -> None:
    from precision_plugin.probe.plot import plot_probe

    plot_probe(result, path)


def _tables(result: Any, explain: bool = False) -> Iterable[Any]:
    """What the probe prints, in order: its table, the headroom, the layerwise replay and the
    attribution, then the decision (``do:`` and ``apply:``), last."""
    from rich.text import Text

    from precision_plugin.probe.table import (
        render_decision,
        render_headroom_table,
        render_layerwise_table,
        render_probe_table,
    )

    yield render_probe_table(result, explain=explain)
    headroom = render_headroom_table(result)
    if headroom is not None:
        yield headroom
    if result.layerwise is not None:
        yield render_layerwise_table(result)
    if result.attribution is not None:
        from precision_plugin.probe.attribution.render import render_attribution_table

        decision = result.consequence.decision if result.consequence is not None else None
        yield render_attribution_table(result.attribution, decision)
    decision_lines = render_decision(result)
    if decision_lines:
        yield Text(decision_lines)


def run(args: argparse.Namespace) -> int:
    """Run the probe; exit 1 when the float32 self-check fails (the measurement is invalid)."""
    from precision_plugin.cli.probe_attribution import attribution_settings, write_attribution_plot
    from precision_plugin.policy import OverflowSettings
    from precision_plugin.probe import DEFAULT_NUM_PROMPTS, ProbeConfig, run_probe
    from precision_plugin.probe.inputs import read_prompts_file
    from precision_plugin.probe.run import preflight_engine

    try:  # an engine that cannot run here is refused with the arguments, before any work
        preflight_engine(args.engine, args.device)
    except PrecisionConfigError as refused:
        raise UsageError(str(refused)) from None
    check_outputs(args)
    if args.prompts is not None and not args.prompts.strip():
        raise UsageError(
            "--prompts: the path is empty; pass a prompts file, or leave --prompts "
            "out for the built-in prompts"
        )
    prompts = read_prompts_file(args.prompts) if args.prompts is not None else None
    num_prompts = args.num_prompts or (len(prompts) if prompts else DEFAULT_NUM_PROMPTS)
    config = ProbeConfig(
        model=args.model,
        engine=args.engine,
        dtypes=args.dtypes,
        num_prompts=num_prompts,
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens,
        seed=args.seed,
        device=args.device,
        overflow=OverflowSettings(margin_bits=args.margin_bits),
        prompts=tuple(prompts) if prompts else None,
        target_length=args.target_length,
        layerwise=args.layerwise,
        batch_size=args.batch_size,
        attribution=attribution_settings(args),
    )
    result, err = run_and_report(
        args,
        lambda progress: run_probe(config, progress=progress),
        lambda result: _tables(result, explain=args.explain),
        _plot,
    )
    if write_attribution_plot(args, result, result.model):
        err.print(f"wrote {args.attribution_plot}")
    if not result.valid:
        err.print(f"[bold red]INVALID MEASUREMENT[/]: {result.self_check.message}")
        return ExitCode.FAILED
    return ExitCode.OK
