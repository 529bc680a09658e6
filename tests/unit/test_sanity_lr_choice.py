"""The long preset's learning-rate rule (scripts/sanity_lr_choice.py): float32 only, the highest
final-window accuracy among runs that do not collapse."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location(
        "sanity_lr_choice", ROOT / "scripts" / "sanity_lr_choice.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lr_choice = _script()


def _run(lr, final, collapsed=False):
    return {"learning_rate": lr, "final_accuracy": final, "collapsed": collapsed}


def test_highest_final_accuracy_among_runs_that_do_not_collapse():
    runs = [_run(1e-5, 0.5), _run(1e-4, 0.75), _run(1e-3, 0.875, collapsed=True)]
    assert lr_choice.choose(runs) == 1e-4
    assert lr_choice.choose([_run(1e-5, 0.5), _run(3e-5, 0.5)]) == 1e-5  # the first of equals
    assert lr_choice.choose([_run(1e-3, 0.9, collapsed=True)]) is None


def test_the_grid_and_seed_are_the_preregistered_ones():
    from precision_plugin.sanity import PRESETS

    assert lr_choice.GRID == (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
    assert lr_choice.SEED == 100 and lr_choice.SEED not in PRESETS["long"]["seeds"]


def test_the_preset_uses_the_published_choice():
    import json

    from precision_plugin.sanity import PRESETS

    data = json.loads((ROOT / "docs" / "results" / "sanity-long-lr.json").read_text())
    assert data["seed"] == lr_choice.SEED and data["steps"] == PRESETS["long"]["steps"]
    assert [r["learning_rate"] for r in data["runs"]] == list(lr_choice.GRID)
    assert data["chosen_learning_rate"] == lr_choice.choose(data["runs"])
    assert PRESETS["long"]["learning_rate"] == data["chosen_learning_rate"]
