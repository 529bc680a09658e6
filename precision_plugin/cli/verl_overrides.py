"""``precision-plugin verl-overrides``: the Hydra overrides that make a verl run follow the
policy."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from precision_plugin.cli.argtypes import RenamedOption, single_dtype
from precision_plugin.cli.exit_codes import ExitCode
from precision_plugin.cli.process import writing_stdout


def add_parser(sub: Any, engines: Sequence[str] = ()) -> None:
    """The ``verl-overrides`` subcommand."""
    verl = sub.add_parser(
        "verl-overrides",
        help="the Hydra overrides that make a verl run follow the policy",
        description=(
            "Print the overrides for `python -m verl.trainer.main_ppo ... "
            "$(precision-plugin verl-overrides)`, one per line."
        ),
    )
    verl.add_argument(
        "--dtype",
        type=single_dtype,
        default=None,
        help="policy dtype (default: $PRECISION_PLUGIN, else float16)",
    )
    verl.add_argument(
        "--strategy",
        choices=("fsdp", "fsdp2", "fsdp_turbo", "megatron"),
        default="fsdp",
        help="verl learner strategy (default: fsdp)",
    )
    verl.add_argument(
        "--verl-version", default=None, help="verl version to target (default: the installed one)"
    )
    verl.add_argument(
        "--engine",
        choices=("vllm", "sglang"),
        default="vllm",
        help="rollout engine, verl's actor_rollout_ref.rollout.name (default: vllm)",
    )
    verl.add_argument(
        "--rollout",
        dest="engine",
        choices=("vllm", "sglang"),
        action=RenamedOption,
        new="--engine",
        help=argparse.SUPPRESS,  # the old name of --engine
    )


def run(args: argparse.Namespace) -> int:
    """Print the overrides, one per line."""
    from precision_plugin._core.manager import resolve_policy
    from precision_plugin.verl import overrides

    policy = resolve_policy()
    if args.dtype:
        policy = policy.replace(dtype=args.dtype)
    lines = overrides(
        policy, verl_version=args.verl_version, strategy=args.strategy, rollout=args.engine
    )
    with writing_stdout():
        sys.stdout.write("\n".join(lines) + "\n")
    return ExitCode.OK
