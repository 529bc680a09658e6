"""The command line's exit codes are one ``ExitCode`` enum with the documented values, and its
subcommands one registry that matches the parser's."""

from __future__ import annotations

import argparse

from precision_plugin.cli import COMMANDS, EXIT_OUTPUT, EXIT_USAGE, build_parser, main
from precision_plugin.cli.exit_codes import ExitCode


def test_exit_code_values_are_the_contract() -> None:
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0, "FAILED": 1, "USAGE": 2, "OUTPUT": 74, "INTERRUPTED": 130, "TERMINATED": 143,
    }  # fmt: skip
    assert EXIT_USAGE is ExitCode.USAGE and EXIT_OUTPUT is ExitCode.OUTPUT


def test_registry_matches_the_parser() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(COMMANDS) == set(sub.choices)
    assert {n for n, c in COMMANDS.items() if c.loads_models} == {
        "probe", "sanity", "gguf-checkpoint",
    }  # fmt: skip


def test_bad_input_exits_usage(capsys) -> None:
    assert main(["verl-overrides", "--dtype", "fp8"]) == ExitCode.USAGE == 2
    assert "error" in capsys.readouterr().err
