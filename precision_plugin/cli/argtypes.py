"""Argument types of the command line (argparse ``type=`` functions whose errors say what was
asked and the fix), the one-line-error parser, and the usage error raised after parsing."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

from precision_plugin.cli.exit_codes import ExitCode
from precision_plugin.cli.process import PROG
from precision_plugin.errors import PrecisionPluginError


class UsageError(PrecisionPluginError):
    """Bad command-line input found after parsing."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``precision-plugin: error: ...``."""

    def error(self, message: str) -> NoReturn:
        """Print one line (what was asked, what is wrong, the fix) and exit with code 2."""
        hint = f" (see '{self.prog} --help')"
        self.exit(ExitCode.USAGE, f"{PROG}: error: {message}{hint}\n")


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer; pass a number >= 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 0")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (``float('1e400')`` is inf: refused as the user typed it)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0; pass e.g. 1e-4")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (a learning rate of 0 freezes the policy, as the canary's drills
    do)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0; pass e.g. 1e-4")
    return value


def seed_list(text: str) -> tuple[int, ...]:
    """A comma list of distinct integers >= 0."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    seeds = tuple(non_negative_int(part) for part in parts)
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma list of distinct integers >= 0; pass e.g. 0,1,2"
        )
    return seeds


def dtype_list(text: str) -> tuple[str, ...]:
    """A comma list of dtype names (aliases accepted), normalized."""
    from precision_plugin.policy import normalize_dtype

    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(
            f"{text!r} names no dtype; pass a comma list such as float16,bfloat16"
        )
    try:
        return tuple(normalize_dtype(name, field_name="--dtypes") for name in names)
    except PrecisionPluginError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--dtypes: ")) from None


def single_dtype(text: str) -> str:
    """One dtype name (aliases accepted), normalized."""
    from precision_plugin.policy import normalize_dtype

    try:
        return normalize_dtype(text, field_name="--dtype")
    except PrecisionPluginError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--dtype: ")) from None


class RenamedOption(argparse.Action):
    """An old option name kept working for one renamed: it stores into the new option's ``dest``
    and says, once per use on stderr, which name to use (``--rollout`` took the engine in the
    recipes and ``verl-overrides``; it now means the rollout's settings, as in ``probe``)."""

    def __init__(self, *args: object, new: str, **kwargs: object) -> None:
        self.new = new
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        import sys

        sys.stderr.write(
            f"{PROG}: warning: {option_string} {values} is deprecated here: use {self.new} "
            f"{values} ({option_string} means the rollout's own settings, as in probe).\n"
        )
        setattr(namespace, self.dest, values)
