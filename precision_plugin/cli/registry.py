"""The command registry (as TRL's ``trl/cli``): each subcommand is a ``Command`` with its name,
the function that adds its parser, and the function that runs it; ``build_parser`` is the
registry's parsers in order."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from precision_plugin.cli import (
    doctor,
    gguf_checkpoint,
    openrlhf_args,
    probe,
    sanity,
    verl_overrides,
)
from precision_plugin.cli.argtypes import Parser
from precision_plugin.cli.process import PROG


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, what adds its parser (given the subparsers and the probe's
    engine names), what runs it, and whether it loads transformers models (whose warnings the
    CLI quiets)."""

    name: str
    add_parser: Callable[[Any, Sequence[str]], None]
    run: Callable[[argparse.Namespace], int]
    loads_models: bool = False


#: Each subcommand by name, in the order ``--help`` lists them. ``doctor`` also runs for a bare
#: ``precision-plugin``.
COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command("probe", probe.add_parser, probe.run, loads_models=True),
        Command("sanity", sanity.add_parser, sanity.run, loads_models=True),
        Command("doctor", doctor.add_parser, doctor.run),
        Command("verl-overrides", verl_overrides.add_parser, verl_overrides.run),
        Command("openrlhf-args", openrlhf_args.add_parser, openrlhf_args.run),
        Command(
            "gguf-checkpoint", gguf_checkpoint.add_parser, gguf_checkpoint.run, loads_models=True
        ),
    )
}


def build_parser(engine_names: Sequence[str] = ("hf",)) -> argparse.ArgumentParser:
    """The argument parser; ``engine_names`` are the probe's ``--engine`` choices."""
    from precision_plugin import __version__

    parser = Parser(
        prog=PROG,
        description="One consistent precision (FP16 by default) for RL rollouts and training.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log what the plugin does (to stderr)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for command in COMMANDS.values():
        command.add_parser(sub, engine_names)
    return parser
