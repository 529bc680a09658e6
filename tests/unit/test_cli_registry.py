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


def test_one_module_per_command() -> None:
    """Each subcommand's parser and run live in its own module, precision_plugin.cli.<name>."""
    for name, command in COMMANDS.items():
        module = f"precision_plugin.cli.{name.replace('-', '_')}"
        assert command.run.__module__ == command.add_parser.__module__ == module, name


def test_measuring_commands_share_one_output_path() -> None:
    """probe and sanity hand their results out through cli/output.py, not a copy of it."""
    import inspect

    from precision_plugin.cli import probe, sanity

    for module in (probe, sanity):
        source = inspect.getsource(module.run)
        assert "check_outputs(args)" in source and "run_and_report(" in source, module
        assert "emit_json" not in inspect.getsource(module) and "_write" not in source


def test_rollout_means_the_rollouts_settings_and_its_old_engine_meaning_is_renamed(capsys):
    """Issue 54: --rollout took sampling settings in probe and the engine in grpo_fp16.py and
    verl-overrides. It is --engine there now; --rollout still works there and says so."""
    assert main(["verl-overrides", "--engine", "sglang", "--verl-version", "0.9.1"]) == 0
    new = capsys.readouterr()
    assert main(["verl-overrides", "--rollout", "sglang", "--verl-version", "0.9.1"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and "engine_kwargs.sglang.dtype" in new.out
    assert old.err == (
        "precision-plugin: warning: --rollout sglang is deprecated here: use --engine sglang "
        "(--rollout means the rollout's own settings, as in probe).\n"
    )
    assert new.err == ""


def test_the_trl_recipe_takes_engine_and_its_old_name(capsys):
    import importlib.util
    from pathlib import Path

    import pytest

    path = Path(__file__).parents[2] / "integrations" / "trl" / "grpo_fp16.py"
    spec = importlib.util.spec_from_file_location("grpo_fp16_recipe", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    for flag in ("--engine", "--rollout"):
        with pytest.raises(SystemExit) as stop:  # refused after parsing: the drill needs hf
            recipe.main([flag, "trl", "--drill", "stale-weights@2"])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "--drill needs --engine hf" in err
        assert ("--rollout trl is deprecated here: use --engine trl" in err) == (
            flag == "--rollout"
        )


def test_the_command_table_of_the_docs_lists_every_command() -> None:
    """Issue 54: docs/cli.md's table of commands left out openrlhf-args."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    table = text[text.index("| command |") : text.index("All exit with")]
    listed = re.findall(r"^\| \[`([\w-]+)`\]\(#precision-plugin-[\w-]+\)", table, re.M)
    assert sorted(listed) == sorted(COMMANDS)
    for name in COMMANDS:  # each links to its own section
        assert f"## `precision-plugin {name}`" in text
