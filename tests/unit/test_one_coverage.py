"""One coverage level for every interval (issue 53): ``intervals.COVERAGE``, 90 %, defined once.

The canary's false-alarm ``alpha`` and the misfit test's ``ALPHA`` are levels of tests, not
coverages of intervals, and are not parameters named like one; everything below reads the
package's source (no import of optional modules), then checks the attribution's bootstrap at
run time.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import precision_plugin
from precision_plugin._core.intervals import COVERAGE
from precision_plugin.probe.attribution.decompose import k3_interval
from precision_plugin.probe.attribution.render import render_attribution_table

PACKAGE = Path(precision_plugin.__file__).parent
#: Parameter names that set an interval's coverage.
COVERAGE_NAMES = {"coverage", "level", "confidence", "confidence_level", "ci", "conf"}
#: The modules that compute intervals: no two-sided tail written as a number in them.
INTERVAL_MODULES = (
    "_core/intervals.py",
    "_core/metrics/consequence.py",
    "probe/advice.py",
    "probe/schema.py",
    "probe/attribution/decompose.py",
    "probe/attribution/measure.py",
    "probe/attribution/report.py",
)
#: A 95 % interval's coverage and tails, and 90 %'s tails (derived from ``COVERAGE``).
LEVEL_LITERALS = {0.025, 0.975, 0.05, 0.95}


def _trees() -> list[tuple[str, ast.Module]]:
    return [
        (str(p.relative_to(PACKAGE)), ast.parse(p.read_text(encoding="utf-8")))
        for p in sorted(PACKAGE.rglob("*.py"))
    ]


def _is_coverage(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "COVERAGE") or (
        isinstance(node, ast.Attribute) and node.attr == "COVERAGE"
    )


def test_every_coverage_parameter_defaults_to_COVERAGE():
    """Every function's parameter named like a coverage (``coverage``, ``level``, ...) that has
    a default has ``COVERAGE`` (catches ``coverage: float = 0.95``)."""
    wrong = []
    for name, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = node.args
            positional = args.posonlyargs + args.args
            tail = positional[len(positional) - len(args.defaults) :]
            pairs = list(zip(tail, args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d]
            for arg, default in pairs:
                if arg.arg in COVERAGE_NAMES and not _is_coverage(default):
                    wrong.append(f"{name}:{node.lineno} {node.name}({arg.arg}=...)")
    assert not wrong, wrong


def test_COVERAGE_is_defined_once():
    """Only ``intervals.py`` assigns ``COVERAGE``; every other module imports it."""
    where = [
        name
        for name, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id == "COVERAGE"
    ]
    assert where == ["_core/intervals.py"]
    assert COVERAGE == 0.90


def test_no_interval_module_writes_a_level_as_a_number():
    """No float literal of a usual level or tail (0.025, 0.975, 0.05, 0.95, ...) in the modules
    that compute intervals: their ends come from ``COVERAGE`` (catches the attribution's old
    ``torch.quantile(estimates, [0.025, 0.975])``)."""
    trees = dict(_trees())
    found = [
        f"{name}:{node.lineno} {node.value!r}"
        for name in INTERVAL_MODULES
        for node in ast.walk(trees[name])
        if isinstance(node, ast.Constant)
        and isinstance(node.value, float)
        and node.value in LEVEL_LITERALS
    ]
    assert not found, found


def test_the_attribution_bootstrap_is_at_COVERAGE():
    """``k3_interval``'s default is ``COVERAGE``, and its interval equals the explicit 90 % one
    and is narrower than a 95 % one (catches a bootstrap at another level)."""
    default = inspect.signature(k3_interval).parameters["coverage"].default
    assert default is COVERAGE
    rows = [[0.01 * ((i * 7 + j) % 5 - 2) for j in range(4 + i % 3)] for i in range(12)]
    ours = k3_interval(rows)
    assert ours == k3_interval(rows, coverage=0.90)
    wider = k3_interval(rows, coverage=0.95)
    assert wider.low < ours.low <= ours.value <= ours.high < wider.high


@pytest.mark.parametrize(("coverage", "header"), [(COVERAGE, "k3 [90% CI]"), (None, "k3 [95% CI]")])
def test_the_attribution_table_states_the_level_of_its_file(coverage, header):
    """A section that states its ``coverage`` (every one written now: 0.9) is headed ``k3 [90%
    CI]``; a results file written before it stated one had a 95 % bootstrap and keeps that
    header."""
    from rich.console import Console

    section = {"rollout": {}, "learning_rate": 1e-6, "dtypes": {}}
    if coverage is not None:
        section["coverage"] = coverage
    console = Console(width=200, record=True)
    console.print(render_attribution_table(section))
    assert header in console.export_text()
