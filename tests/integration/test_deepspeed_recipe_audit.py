"""The project's own DeepSpeed fp16 recipe, ``integrations/deepspeed/train.py --deepspeed
integrations/deepspeed/zero2_fp16.json``, runs clean: DeepSpeed's fp16 (and bf16) engine keeps
float32 master weights inside its optimizer, so its float16 module parameters are no
contradiction, in warn mode (no warning) and in strict mode (the run is not stopped), at every
ZeRO stage. DeepSpeed's fp16 capability check is lifted on CPUs without fp16 kernels (ds_cpu)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import runpy
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from precision_plugin.audit import contradictions
from precision_plugin.policy import PrecisionPolicy
from tests.integration import ds_cpu

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "integrations" / "deepspeed" / "zero2_fp16.json"
SCRIPT = ROOT / "integrations" / "deepspeed" / "train.py"


@pytest.fixture(scope="module")
def ds_env():
    with ds_cpu.one_process_world():
        yield


def _run_recipe(tmp_path: Path, stage: int, strictness: str, dtype: str = "float16") -> dict:
    """``python integrations/deepspeed/train.py --deepspeed <recipe at this stage>``, in this
    process (where the capability check is lifted); returns its JSON line."""
    config = json.loads(RECIPE.read_text())
    config["zero_optimization"]["stage"] = stage
    config["precision_plugin"]["strictness"] = strictness
    path = tmp_path / f"zero{stage}_{strictness}.json"
    path.write_text(json.dumps(config))
    argv = [str(SCRIPT), "--deepspeed", str(path), "--max-steps", "2", "--dtype", dtype]
    out = io.StringIO()
    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = saved
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("strictness", ["warn", "error"])
def test_fp16_recipe_runs_clean(ds_env, tmp_path, caplog, stage, strictness):
    with caplog.at_level(logging.INFO, logger="precision_plugin"):
        report = _run_recipe(tmp_path, stage, strictness)
    assert report["deepspeed_fp16"] and report["engine_dtype"] == "float16"
    assert report["zero_stage"] == stage and report["steps"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any("master weights" in w for w in warnings), warnings
    # the audit table names where the float32 master copy lives
    tables = [r.getMessage() for r in caplog.records if "asked vs ran" in r.getMessage()]
    assert tables and all("fp32_master_weights" in t and "DeepSpeed" in t for t in tables)


@pytest.mark.slow
def test_bf16_engine_keeps_master_weights_too(ds_env, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        report = _run_recipe(tmp_path, 2, "error", dtype="bfloat16")
    assert report["deepspeed_bf16"] and report["steps"] == 2
    assert not any("master weights" in r.getMessage() for r in caplog.records)


def test_half_parameters_without_a_master_copy_still_contradict():
    """Only a master copy that exists clears the check (a plain fp16 model under a torch
    scaler is the 'Attempting to unscale FP16 gradients' case)."""
    policy = PrecisionPolicy()
    learner = {"trainable_params": {"float16": 8}, "loss_scaler": {"class": "GradScaler"}}
    assert set(contradictions(policy, learner, {})) == {"trainable"}
    learner["fp32_master_weights"] = None
    assert set(contradictions(policy, learner, {})) == {"trainable"}
    learner["fp32_master_weights"] = "DeepSpeed ZeRO-1/2 optimizer (...)"
    assert contradictions(policy, learner, {}) == {}


@pytest.mark.slow
def test_a_strict_stop_of_the_recipe_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """Issue 54: a strict DeepSpeed stop printed a 40-line ``[rank0]:`` traceback above its
    one-line fix. Run as a user runs it (a subprocess), on a CPU made to refuse fp16."""
    import os
    import subprocess

    from tests.kernels import fp16_override_env

    config = json.loads(RECIPE.read_text())
    config["precision_plugin"] = {**config.get("precision_plugin", {}), "strictness": "error"}
    path = tmp_path / "strict.json"
    path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env.update(fp16_override_env(False, str(ROOT)))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--deepspeed", str(path), "--max-steps", "1"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "[rank0]" not in proc.stderr, proc.stderr[-3000:]
    stop = [ln for ln in proc.stderr.splitlines() if ln.startswith("train.py: stopped: ")]
    assert len(stop) == 1 and "does not support fp16" in stop[0] and "Fix: " in stop[0]
