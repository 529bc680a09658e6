"""Fire drills for the drift canary in real TRL GRPO runs on CPU (the recipe's tiny Llama).

Each drill must raise the alarm within 2 checks of the step it starts at, with the right
verdict; a clean run and one at learning rate 0 run with ``strictness="error"`` and must raise
nothing. 30 steps each, a check every 5 (the floor waits for a full 16-sequence canary set: 4
steps of 4 rollouts).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

pytest.importorskip("trl")

RECIPE = Path(__file__).resolve().parents[2] / "integrations/trl/grpo_fp16.py"
STEPS, EVERY, AT = 30, 5, 10

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_accelerator_state")]


def _recipe():
    spec = importlib.util.spec_from_file_location("grpo_fp16_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, *extra: str) -> dict:
    args = ["--max-steps", str(STEPS), "--canary-every", str(EVERY), *extra]
    return _recipe().main(
        [*args, "--output-dir", str(tmp_path), "--json", str(tmp_path / "r.json")]
    )


def _within_two_checks(step: int) -> int:
    """The second check at or after the drill's start."""
    return math.ceil(AT / EVERY) * EVERY + EVERY


def test_stale_weights_drill_is_named_within_two_checks(tmp_path: Path) -> None:
    report = _run(tmp_path, "--drill", f"stale-weights@{AT}")
    alarm = report["canary_alarm"]
    assert alarm is not None and alarm["verdict"] == "weights_out_of_sync"
    assert AT <= alarm["step"] <= _within_two_checks(AT)
    # The rollout copy kept the weights of its last refresh before the drill (step AT - 1);
    # the first check after it sees them unchanged.
    assert alarm["stale_since"] is not None and AT - EVERY < alarm["stale_since"] <= AT


def test_engine_drift_drill_at_learning_rate_zero(tmp_path: Path) -> None:
    report = _run(tmp_path, "--drill", f"engine-drift@{AT}", "--learning-rate", "0")
    alarm = report["canary_alarm"]
    assert alarm is not None and alarm["verdict"] == "engine_state_drift"
    assert AT <= alarm["step"] <= _within_two_checks(AT)
    assert alarm["stale_since"] is None and "have not changed since" in alarm["reason"]


@pytest.mark.parametrize("learning_rate", ["1e-3", "0"])
def test_clean_runs_raise_nothing(tmp_path: Path, learning_rate: str) -> None:
    report = _run(tmp_path, "--learning-rate", learning_rate, "--strict")
    assert report["canary_alarm"] is None
    # fp16 on both sides (level 1); level 2 once the HF engine is certified batch-invariant,
    # which its float16 path is where the float32 GEMM gives a row the same value in any batch
    # (precision_plugin._core.scoring.float16_cpu pads products to 16 rows for it), a CPU property.
    assert report["level"] in (1.0, 2.0)


def test_a_growing_batch_mismatch_with_a_steady_canary_is_the_policy_moving(
    tmp_path: Path,
) -> None:
    """batch-drift: the batch's reported rollout log-probs drift from STEP on, the engine does
    not; the canary holds its band, the note comes within 2 checks, nothing is raised."""
    report = _run(tmp_path, "--drill", f"batch-drift@{AT}", "--strict", "--max-steps", "15")
    assert report["canary_alarm"] is None
    checks = report["canary_checks"]
    assert all(c["canary_in_band"] == 1.0 for c in checks)
    noted = [c["step"] for c in checks if c["canary_verdict"] == 3.0]  # policy_moving
    assert noted and AT <= noted[0] <= _within_two_checks(AT)
    assert all(c["canary_verdict"] == 0.0 for c in checks if c["step"] < AT)
