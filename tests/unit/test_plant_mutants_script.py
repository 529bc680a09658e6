"""``scripts/plant_mutants.py``: its seven planted bugs still match the code (each line occurs
once where it says), each names tests that exist, and each is caught (the whole script, about a
minute on 2 cores)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "plant_mutants.py"


def _script():
    spec = importlib.util.spec_from_file_location("plant_mutants", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["plant_mutants"] = module
    spec.loader.exec_module(module)
    return module


def test_each_mutant_is_one_line_of_the_code_and_names_existing_tests() -> None:
    script = _script()
    assert len(script.MUTANTS) == 7
    for mutant in script.MUTANTS:
        text = (ROOT / mutant.path).read_text()
        assert text.count(mutant.old) == 1, mutant.name
        assert "\n" not in mutant.old and mutant.old != mutant.new, mutant.name
        for node in mutant.tests:
            path, _, name = node.partition("::")
            assert f"def {name}(" in (ROOT / path).read_text(), node


@pytest.mark.slow
def test_every_planted_bug_fails_a_test() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 of 7 planted bugs caught" in done.stdout
