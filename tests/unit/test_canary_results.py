"""The canary's published results files say what the docs claim: no false alarm over the long
clean run, each drill detected within 2 checks with its verdict, the overhead at the default K."""

from __future__ import annotations

import json
import math
from pathlib import Path

from precision_plugin.policy import PrecisionPolicy

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def test_the_long_clean_run_raised_no_false_alarm() -> None:
    data = _load("canary-false-alarms.json")
    assert data["steps"] >= 500 and data["false_alarms"] == 0 and data["alarm"] is None
    assert len(data["timeline"]) == data["checks"] == data["steps"] // data["canary_every"] + 1
    assert data["out_of_band_checks"] == sum(not c["canary_in_band"] for c in data["timeline"])
    assert all(c["canary_verdict"] in (0.0, 3.0) for c in data["timeline"])  # none, or a note


def test_each_drill_is_named_within_two_checks_and_the_clean_runs_are_quiet() -> None:
    data = _load("canary-drills.json")
    at, every = data["drill_step"], data["canary_every"]
    second = math.ceil(at / every) * every + every
    verdicts = {"stale-weights": "weights_out_of_sync", "engine-drift": "engine_state_drift"}
    for name, run in data["runs"].items():
        alarm = run["alarm"]
        if name in verdicts:
            assert alarm["verdict"] == verdicts[name] and at <= alarm["step"] <= second, name
        else:
            assert alarm is None, name
    assert data["runs"]["engine-drift"]["learning_rate"] == 0.0


def test_the_overhead_is_measured_at_the_default_k() -> None:
    data = _load("canary-overhead.json")
    assert data["canary_every_default"] == PrecisionPolicy().metrics.canary_every
    expected = 100 * data["median_check_s"] / data["canary_every_default"] / data["median_step_s"]
    assert data["overhead_pct_at_default"] == expected
    assert data["overhead_pct_at_default"] < 1.0


def test_cpu_configurations_reach_the_levels_the_docs_state() -> None:
    configs = _load("canary-levels.json")["configs"]
    assert {name: c["level"] for name, c in configs.items()} == {
        "float16, HFRollout padding its batch": 1.0,
        "bfloat16, HFRollout padding its batch": 1.0,
        "float16, HFRollout(max_batch=1)": 2.0,
        "bfloat16, HFRollout(max_batch=1)": 2.0,
    }
