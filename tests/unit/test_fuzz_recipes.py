"""Every flag of the Python recipes (``integrations/*/*.py``) fuzzed as ``test_fuzz_cli.py``
fuzzes the CLI's options: the same typed values and paths, each command line run through the
recipe's ``main()`` in a forked child up to its work, which starts where the first
``torch.nn.Module`` is built (a model, or the recipe's tiny one): every flag must be checked
before that, and a bad value refused in one line that names the flag or the value (argparse's
error line, or the recipe's ``stopped:`` line). No traceback, no hang. The recipes' parsers are
read from the recipes themselves, so a new flag is fuzzed by being added.

``PRECISION_PLUGIN_FUZZ=full`` (a benchmark-sized run, a few seconds a command line) runs each
command line on to the optimizer's construction instead: model, trainer and engine built on the
values, so a value that only fails there (a NaN learning rate) is found too.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import io
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit import fuzz_types as fz
from tests.unit.fuzz_known import KNOWN
from tests.unit.test_fuzz_cli import TYPED, ReachedWork

ROOT = Path(__file__).resolve().parents[2]
#: Each Python recipe with the arguments of a valid command line (the fuzzed flag is added).
RECIPES: dict[str, list[str]] = {
    "integrations/trl/grpo_fp16.py": [],
    "integrations/accelerate/train_fp16.py": [],
    "integrations/deepspeed/train.py": ["--deepspeed", "integrations/deepspeed/zero2_fp16.json"],
}


class _Captured(BaseException):
    """Carries a recipe's parser out of its ``main()``."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@functools.cache
def recipe(path: str) -> dict[str, Any]:
    """The recipe's module globals (its ``main``), loaded without running it."""
    return runpy.run_path(str(ROOT / path), run_name="precision_plugin_recipe")


def call_main(path: str, argv: list[str]) -> Any:
    """The recipe's ``main`` on ``argv`` (as its arguments, or as ``sys.argv``)."""
    main = recipe(path)["main"]
    if inspect.signature(main).parameters:
        return main(argv)
    sys.argv = [path, *argv]
    return main()


def parser_of(path: str) -> argparse.ArgumentParser:
    """The parser ``main()`` builds, taken at its ``parse_args``."""
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        call_main(path, [])
    except _Captured as captured:
        return captured.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise AssertionError(f"{path}: main() did not parse its arguments")


def flags() -> list[tuple[str, argparse.Action]]:
    """``(recipe, action)`` for every flag of every recipe that takes a value (hidden ones,
    such as a deprecated alias, included)."""
    out = []
    for path in RECIPES:
        for action in parser_of(path)._actions:
            takes_value = action.option_strings and action.nargs != 0
            if takes_value and not isinstance(action, argparse._HelpAction):
                out.append((path, action))
    return out


FLAGS = flags()


def _label(path: str, action: argparse.Action) -> str:
    return f"{Path(path).name} {action.option_strings[-1]}"


def values(action: argparse.Action, tmp: Path) -> list[tuple[str, str]]:
    """The typed values, a non-choice where there are choices, and the fuzzer's paths."""
    out = list(TYPED)
    if action.choices:
        out += [("not a choice", "not-a-choice")]
    out += [(label, str(v)) for label, v in fz.paths(tmp) if "\x00" not in str(v)]
    return out


def run_recipe(path: str, argv: list[str]) -> tuple[int | str, str]:
    """The recipe run as ``python RECIPE argv`` in this (forked) process, stopped where the
    first module is built: ``(exit code, or "work", what it wrote)``."""
    import torch

    if os.environ.get("PRECISION_PLUGIN_FUZZ") == "full":  # the benchmark: to the optimizer
        built = torch.optim.Optimizer.__init__

        def stop(self: Any, *args: Any, **kwargs: Any) -> None:
            built(self, *args, **kwargs)
            raise ReachedWork("the optimizer")

        torch.optim.Optimizer.__init__ = stop  # type: ignore[method-assign]
    else:

        def stop(self: Any, *args: Any, **kwargs: Any) -> None:
            raise ReachedWork("a torch.nn.Module")

        torch.nn.Module.__init__ = stop  # type: ignore[method-assign]
    os.chdir(ROOT)
    sys.argv = [path, *argv]
    written = io.StringIO()
    code: int | str
    with contextlib.redirect_stdout(written), contextlib.redirect_stderr(written):
        try:  # as ``python RECIPE ...`` runs it: its __main__ block turns a stop into one line
            runpy.run_path(str(ROOT / path), run_name="__main__")
            code = 0
        except ReachedWork:
            code = "work"
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
            if not isinstance(exc.code, int) and exc.code is not None:
                written.write(f"{exc.code}\n")
    return code, written.getvalue()


def judge_recipe(action: argparse.Action, value: str, outcome: tuple[Any, ...]) -> str | None:
    """What is wrong with one command line's outcome, ``None`` when nothing is."""
    if outcome[0] == "hang":
        return f"hang: no answer in {fz.CALL_SECONDS} s"
    if outcome[0] != "returned":
        return f"traceback: {outcome[1]}: {outcome[2][:200]}"
    code, text = outcome[1]
    if "Traceback (most recent call last)" in text:
        return f"traceback: {text.strip().splitlines()[-1][:200]}"
    if code in (0, "work"):
        return None
    refusals = [ln for ln in text.splitlines() if "error:" in ln or "stopped:" in ln]
    if len(refusals) != 1:
        return f"misleading: {len(refusals)} refusal lines: {text.strip()[-200:]}"
    names = {action.dest, action.dest.replace("_", "-"), *action.option_strings}
    if not (any(n in refusals[0] for n in names) or fz.names(refusals[0], action.dest, value)):
        return f"misleading: the refusal names neither the flag nor the value: {refusals[0][:200]}"
    return None


def fuzz_flag(path: str, action: argparse.Action, tmp: Path) -> tuple[int, list[str]]:
    """The number of command lines run and the findings for one flag."""
    rows = values(action, tmp)
    flag = action.option_strings[-1]
    calls: list[tuple[str, str, Callable[[], Any]]] = [
        (action.dest, label, functools.partial(run_recipe, path, [*RECIPES[path], f"{flag}={v}"]))
        for label, v in rows
    ]
    by_label = dict(rows)
    findings = []
    for _, label, outcome in fz.run_each_isolated(calls, budget=60.0):
        wrong = judge_recipe(action, by_label[label], outcome)
        if wrong is not None:
            findings.append(f"{_label(path, action)}=<{label}>: {wrong}")
    return len(calls), findings


@pytest.mark.parametrize(("path", "action"), FLAGS, ids=[_label(p, a) for p, a in FLAGS])
def test_a_recipe_flag_is_checked_before_any_work(path, action, tmp_path):
    """No finding beyond ``fuzz_known.KNOWN``'s, and none listed there that no longer
    happens."""
    _, findings = fuzz_flag(path, action, tmp_path)
    new = [f for f in findings if f.split(": ", 1)[0] not in KNOWN]
    prefix = f"{_label(path, action)}=<"
    seen = {f.split(": ", 1)[0] for f in findings}
    fixed = sorted(k for k in KNOWN if k.startswith(prefix) and k not in seen)
    assert not new, "\n".join(new)
    assert not fixed, f"fixed: take these off tests/unit/fuzz_known.py: {fixed}"


def test_every_recipe_is_fuzzed():
    """Every Python recipe under integrations/ with a ``main`` is in :data:`RECIPES`."""
    found = {
        str(p.relative_to(ROOT))
        for p in ROOT.glob("integrations/*/*.py")
        if "def main(" in p.read_text(encoding="utf-8")
    }
    assert found == set(RECIPES)
