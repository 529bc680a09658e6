"""``precision-plugin sanity``: FP16 vs BF16 GRPO on a task the model partly solves (the
paper's sanity test)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from precision_plugin.cli.argtypes import (
    dtype_list,
    non_negative_int,
    positive_float,
    positive_int,
    seed_list,
)
from precision_plugin.cli.exit_codes import ExitCode
from precision_plugin.cli.output import check_outputs, run_and_report


def add_parser(sub: Any, engines: Sequence[str] = ()) -> None:
    """The ``sanity`` subcommand (its engines are its own: hf, vllm)."""
    from precision_plugin.sanity.model import MODEL_SIZES
    from precision_plugin.sanity.schema import ENGINES, PRESETS, SMOKE, SanityConfig

    def default(name: str, preset: str = "default") -> Any:
        return PRESETS[preset].get(name, getattr(SanityConfig, name))

    def smoke(name: str, preset: str = "default") -> Any:
        return SMOKE[preset].get(name, default(name, preset))

    sanity = sub.add_parser(
        "sanity",
        help="FP16 vs BF16 GRPO on a task the model partly solves (the paper's sanity test)",
        description=(
            "Pretrain a small Llama (built in code) to partial accuracy on a string task, then "
            "run TRL GRPO with the plugin and HFRollout in each dtype from the same weights and "
            "seeds, for each seed; report accuracy and the precision/* mismatch per step, mean "
            "and spread over seeds. --preset long: 96-token answers, 3 seeds, 300 steps, the "
            "gradient-cosine readout and the pre-registered degradation verdict."
        ),
    )
    sanity.add_argument(
        "--preset",
        choices=list(PRESETS),
        default="default",
        help="default: string reversal, short answers; long: 96-letter answers, 3 seeds, "
        "300 steps (see docs/sanity.md)",
    )
    sanity.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"GRPO steps per dtype (default: {default('steps')}; long: "
        f"{default('steps', 'long')}; --smoke: {smoke('steps')} / {smoke('steps', 'long')})",
    )
    seeds = sanity.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds",
        type=seed_list,
        default=None,
        metavar="LIST",
        help="comma list of seeds, each paired across dtypes (default: "
        f"{','.join(map(str, default('seeds')))}; long: "
        f"{','.join(map(str, default('seeds', 'long')))})",
    )
    seeds.add_argument(
        "--seed", type=non_negative_int, default=None, help="one seed (same as --seeds N)"
    )
    sanity.add_argument(
        "--dtypes",
        type=dtype_list,
        default=None,
        metavar="LIST",
        help="comma list of dtypes (default: float32,float16,bfloat16)",
    )
    sanity.add_argument(
        "--model-size",
        choices=list(MODEL_SIZES),
        default=None,
        help=f"model size (default: {default('model_size')}; --smoke: {smoke('model_size')})",
    )
    sanity.add_argument(
        "--learning-rate",
        type=positive_float,
        default=None,
        metavar="LR",
        help=f"GRPO learning rate (default: {default('learning_rate'):g}; long: "
        f"{default('learning_rate', 'long'):g}, chosen on float32)",
    )
    sanity.add_argument(
        "--grad-cosine",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record the cosine between the plain and the importance-corrected policy "
        "gradient each step (one extra backward pass; default: on with --preset long)",
    )
    sanity.add_argument(
        "--engine",
        choices=list(ENGINES),
        default="hf",
        help="rollout engine: hf (HFRollout, CPU ok) or vllm (CUDA + vLLM)",
    )
    sanity.add_argument(
        "--smoke", action="store_true", help="CI-sized run of the preset (tiny model, few steps)"
    )
    sanity.add_argument("--json", metavar="FILE", help="write the results as JSON ('-': stdout)")
    sanity.add_argument(
        "--plot", metavar="FILE.png", help="write accuracy/mismatch per step (needs matplotlib)"
    )


def _plot(result: Any, path: Path) -> None:
    from precision_plugin.sanity.plot import plot_sanity

    plot_sanity(result, path)


def _tables(result: Any) -> Iterable[Any]:
    from precision_plugin.sanity.table import render_sanity_table

    yield render_sanity_table(result)


def run(args: argparse.Namespace) -> int:
    """Run the sanity benchmark."""
    from precision_plugin.sanity import check_engine, preset_config, run_sanity

    check_outputs(args)
    check_engine(args.engine)
    config = preset_config(
        args.preset,
        smoke=args.smoke,
        seeds=(args.seed,) if args.seed is not None else args.seeds,
        dtypes=args.dtypes,
        engine=args.engine,
        steps=args.steps,
        model_size=args.model_size,
        learning_rate=args.learning_rate,
        grad_cosine=args.grad_cosine,
    )
    run_and_report(args, lambda progress: run_sanity(config, progress=progress), _tables, _plot)
    return ExitCode.OK
