"""Every contract environment can import the package it tests.

The setup scripts install precision_plugin into each contract environment with ``--no-deps``
(so pip cannot replace the pinned framework stack), which means the package's own core
dependencies must be pinned in every contract requirements file; torch comes from the CPU wheel
the scripts install first. A core dependency added to pyproject.toml and missing from a file
fails here, not in CI's contract stage.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(ROOT.glob("tests/contract*/requirements-*.txt"))
INSTALLED_SEPARATELY = {"torch"}  # the CPU wheel, through constraints.txt, before the file


def core_dependencies() -> set[str]:
    """The canonical names of ``[project].dependencies``."""
    if sys.version_info < (3, 11):  # pragma: no cover - tomllib is 3.11+
        pytest.skip("reads pyproject.toml with tomllib (Python 3.11+)")
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {canonicalize_name(Requirement(dep).name) for dep in project["dependencies"]}


def pinned(path: Path) -> set[str]:
    """The canonical names a requirements file pins (``name==version`` lines)."""
    names = set()
    for line in path.read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^]]*\])?\s*==", line)
        if match:
            names.add(canonicalize_name(match[1]))
    return names


def test_there_are_contract_requirements_files():
    assert len(FILES) == 6, [str(f.relative_to(ROOT)) for f in FILES]


def test_pinned_reads_names_and_extras(tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_text(
        "# beartype==0\nbeartype==0.23.1\nray[default]==2.55.0\nRich_Toolkit == 0.2\n-e .\n"
    )
    assert pinned(path) == {"beartype", "ray", "rich-toolkit"}


def test_core_dependencies_are_read_from_pyproject():
    assert {"pluggy", "packaging", "rich", "beartype", "torch"} <= core_dependencies()


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_core_dependency_is_pinned_in_each_contract_environment(path):
    missing = core_dependencies() - INSTALLED_SEPARATELY - pinned(path)
    assert not missing, (
        f"{path.relative_to(ROOT)} lacks precision_plugin's core dependencies {sorted(missing)}: "
        f"the package is installed there with --no-deps, so pin them in that file"
    )
