"""import-linter's contracts (pyproject.toml ``[tool.importlinter]``) mirror the layer table of
precision_plugin/_base/layers.py: they hold on the source, and they catch an up-the-table import made
inside a function (grimp reads those too). tests/unit/test_layers.py's AST check stays the
authority; this is the same table in the tool other projects use."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[2]
LINT = [
    sys.executable,
    "-c",
    "from importlinter.cli import lint_imports_command; lint_imports_command()",
]


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [*LINT, "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_contracts_hold() -> None:
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 3 kept, 0 broken." in proc.stdout


def test_function_level_import_up_the_table_is_caught(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "precision_plugin", tmp_path / "precision_plugin")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    errors = tmp_path / "precision_plugin" / "errors.py"
    errors.write_text(
        errors.read_text() + "\n\ndef _planted() -> None:\n    from precision_plugin import cli\n"
    )
    proc = _lint(tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert "precision_plugin.errors -> precision_plugin.cli" in proc.stdout


def test_the_contracts_are_the_layer_table() -> None:
    """pyproject.toml's contracts are generated from LAYERS (import_linter_toml), with no
    ignore_imports: the tree is the table, with no exception."""
    import tomllib

    from precision_plugin._base.layers import import_linter_contracts

    written = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert written["contracts"] == import_linter_contracts(), (
        "pyproject.toml's [[tool.importlinter.contracts]] differ from precision_plugin/_base/"
        "layers.py's LAYERS; paste the output of python -c 'from precision_plugin._base.layers "
        "import import_linter_toml; print(import_linter_toml())' in their place"
    )
