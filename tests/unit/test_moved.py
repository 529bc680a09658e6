"""The one alias table (precision_plugin/_base/moved.py): every old path still imports, is the
module that moved, and warns once that it moved; nothing else is caught by it."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from precision_plugin._base import moved


@pytest.mark.parametrize("old", sorted(moved.MODULES))
def test_every_old_module_path_is_the_module_that_moved(old: str) -> None:
    new = moved.MODULES[old]
    assert importlib.import_module(old) is importlib.import_module(new)
    module = importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new


@pytest.mark.parametrize(("module", "name"), sorted(moved.NAMES))
def test_every_old_name_is_the_object_that_moved(module: str, name: str) -> None:
    owner = importlib.import_module(moved.NAMES[(module, name)])
    assert getattr(importlib.import_module(module), name) is getattr(owner, name)


def test_an_old_path_warns_once_with_the_new_one() -> None:
    """In a fresh interpreter (the suite has imported the old paths already): a FutureWarning
    naming both paths, pointing at the importing line, the first time only."""
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    import precision_plugin.buffers\n"
        "    import precision_plugin.buffers\n"
        "    from precision_plugin.scoring import hf\n"
        "    from precision_plugin.transformers import PrecisionCallback\n"
        "    from precision_plugin.transformers import PrecisionCallback\n"
        "for w in seen:\n"
        "    print(w.category.__name__, w.filename, '|', w.message)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()  # fmt: skip
    assert out == [
        "FutureWarning <string> | precision_plugin.buffers moved to precision_plugin._core."
        "buffers; import it from there (the old path keeps working for now)",
        "FutureWarning <string> | precision_plugin.scoring moved to precision_plugin._core."
        "scoring; import it from there (the old path keeps working for now)",
        "FutureWarning <string> | precision_plugin.transformers.PrecisionCallback moved to "
        "precision_plugin.callback.PrecisionCallback; import it from there (the old path "
        "keeps working for now)",
    ]


def test_the_table_catches_only_old_paths() -> None:
    assert moved.new_path("precision_plugin.scoring.hf") == "precision_plugin._core.scoring.hf"
    assert moved.new_path("precision_plugin.probe.engine") == "precision_plugin._core.hf_engine"
    assert moved.new_path("precision_plugin.probe") is None
    assert moved.new_path("precision_plugin.policy") is None
    assert moved.new_path("precision_plugin.scoringx") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("precision_plugin.scoring.no_such_module")
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        importlib.import_module("precision_plugin.transformers").nothing  # noqa: B018


def test_no_module_of_the_package_imports_an_old_path() -> None:
    """The package itself uses the new paths: importing everything under it warns nothing."""
    code = (
        "import warnings, pkgutil, importlib\n"
        "warnings.simplefilter('error', FutureWarning)\n"
        "import precision_plugin\n"
        "for m in pkgutil.walk_packages(precision_plugin.__path__, 'precision_plugin.'):\n"
        "    if m.name.endswith('__main__'):\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(m.name)\n"
        "    except ImportError:\n"
        "        pass  # an optional framework this environment lacks\n"
    )
    with warnings.catch_warnings():
        subprocess.run([sys.executable, "-c", code], check=True, timeout=600)
