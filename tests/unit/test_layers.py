"""The package's layers hold: no import cycle (module or package level, imports inside functions
included), no import up the layer table or across independent adapters, every module placed in
the table, and the allow-list used only by lazy re-exports. The checks are proven on planted
violations in a copy of the package (tmp_path), so a check that sees nothing cannot pass.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from precision_plugin._base import layers as _layers
from precision_plugin._base.layers import (
    ALLOWED,
    KNOWN_VIOLATIONS,
    cross_layer_imports,
    import_cycles,
    import_graph,
    layer_of,
    package_cycles,
    unit_of,
    unused_allowances,
)

PACKAGE = Path(_layers.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph() -> _layers.ImportGraph:
    return import_graph(PACKAGE)


def test_every_module_is_placed(graph: _layers.ImportGraph) -> None:
    """Each module of the package has a layer (a new top-level module must be placed)."""
    unplaced = [m for m in graph.paths if unit_of(m) not in _layers.LAYERS]
    assert unplaced == []


def test_no_import_cycles(graph: _layers.ImportGraph) -> None:
    """No module-level and no package-level import cycle, function-level imports included."""
    assert import_cycles(graph) == []
    assert package_cycles(graph) == []


def test_no_cross_layer_imports(graph: _layers.ImportGraph) -> None:
    """Nothing imports up the table or across independent adapters, except the ratchet list,
    which must match the source exactly (fixing one means deleting its entry)."""
    bad = cross_layer_imports(graph)
    new = [line for line in bad if not line.endswith("[known]")]
    assert new == []
    known = {
        (unit_of(line.split(": ")[1].split(" -> ")[0]), unit_of(line.split(" -> ")[1].split()[0]))
        for line in bad
    }
    assert known == set(KNOWN_VIOLATIONS)


def test_allow_list_is_lazy_and_used(graph: _layers.ImportGraph) -> None:
    """Each allow-listed pair is used, and only inside a module-level ``__getattr__``."""
    assert unused_allowances(graph) == []
    for module, targets in graph.edges.items():
        for target in targets:
            if (unit_of(module), unit_of(target)) in ALLOWED:
                assert target in graph.lazy[module], (module, target)


def test_core_leaves(graph: _layers.ImportGraph) -> None:
    """errors imports nothing of the package at import time; dtypes only errors; the meaning
    constraints nothing; the checker only errors, dtypes and the constraints; the policy is
    above the checker."""
    assert set(graph.edges["errors"]) - graph.lazy["errors"] == set()
    assert set(graph.edges["_base.dtypes"]) == {"errors"}
    checker = [m for m in graph.paths if m.startswith("_base.boundary")]
    assert len(checker) >= 2  # the boundary package: decorator and type engine
    outside = {t for m in checker for t in graph.edges[m] if not t.startswith("_base.boundary")}
    assert set(graph.edges["_base.constraints"]) == set()
    assert outside == {"errors", "_base.dtypes", "_base.constraints"}
    assert layer_of("policy") > layer_of("_base.boundary")


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A copy of the package source to plant violations in."""
    copy = tmp_path / "precision_plugin"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_planted_function_level_cycle_is_found(planted: Path) -> None:
    """An import inside a function closing a loop (errors -> policy) is a cycle."""
    _append(
        planted / "errors.py",
        "\n\ndef _planted():\n    from precision_plugin.policy import PrecisionPolicy\n"
        "    return PrecisionPolicy\n",
    )
    planted_graph = import_graph(planted)
    cycles = import_cycles(planted_graph)
    assert any({"errors", "policy"} <= set(c) for c in cycles)
    assert any(
        "errors.py" in line and "-> policy (layer 1 -> 2)" in line
        for line in cross_layer_imports(planted_graph)
    )


def test_planted_cross_adapter_import_is_found(planted: Path) -> None:
    """An engine adapter importing an orchestrator (vllm -> verl), or another engine (sglang ->
    vllm), from a planted temp module, is reported with its file and line."""
    (planted / "vllm" / "planted.py").write_text(
        "def f():\n    import precision_plugin.verl.layout\n\n\n"
        "from precision_plugin.sglang import args  # noqa\n"
    )
    bad = cross_layer_imports(import_graph(planted))
    assert "precision_plugin/vllm/planted.py:2: vllm.planted -> verl.layout (layer 3 -> 4)" in bad
    assert "precision_plugin/vllm/planted.py:5: vllm.planted -> sglang.args (layer 3 -> 3)" in bad


def test_planted_reexport_from_above_is_not_allowed(planted: Path) -> None:
    """An adapter re-exporting an orchestrator's name (sglang -> slime), even lazily inside a
    module ``__getattr__``, is a violation: old paths go through the alias table, by name."""
    _append(
        planted / "sglang" / "__init__.py",
        "\n\ndef __getattr__(name):\n    from precision_plugin import slime\n\n"
        "    return getattr(slime, name)\n",
    )
    bad = cross_layer_imports(import_graph(planted))
    assert any("sglang -> slime (layer 3 -> 4)" in line for line in bad)


def test_planted_relative_import_is_resolved(planted: Path) -> None:
    """``from ..trl import adapter`` inside vllm is resolved like an absolute import."""
    (planted / "vllm" / "rel.py").write_text("from ..trl import adapter  # noqa\n")
    bad = cross_layer_imports(import_graph(planted))
    assert "precision_plugin/vllm/rel.py:1: vllm.rel -> trl.adapter (layer 3 -> 4)" in bad


def test_contributor_guide_lists_the_table() -> None:
    """docs/contributing.md names every unit of the table and every allow-listed pair (none)."""
    text = (PACKAGE.parent / "docs" / "contributing.md").read_text()
    missing = [u for u in _layers.LAYERS if u and f"`{u}`" not in text]
    assert missing == []
    for importer, imported in ALLOWED:
        assert f"| `{importer}` | `{imported}` |" in text
