"""Accelerate adapter on CPU with the real Accelerate: fp16 autocast, policy scaler, checkpoints."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate")

import accelerate
from accelerate import Accelerator
from accelerate.state import AcceleratorState

import precision_plugin as pp
from precision_plugin import PrecisionMismatchError
from precision_plugin._core.scaler import TelemetryGradScaler
from precision_plugin.accelerate import accelerator_stats

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _prepared(accelerator: Accelerator):
    model = _model()
    seen: list[torch.dtype] = []
    model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return model, optimizer, seen


def _step(accelerator, model, optimizer, *, poison: float | None = None) -> None:
    x = torch.randn(4, 8)
    loss = model(x).pow(2).mean()
    accelerator.backward(loss)
    if poison is not None:
        model[0].weight.grad[0, 0] = poison
    optimizer.step()
    optimizer.zero_grad()


def test_without_plugin_cpu_fp16_silently_runs_fp32():
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    model, optimizer, seen = _prepared(accelerator)
    _step(accelerator, model, optimizer)
    assert accelerator.scaler is None and seen == [torch.float32]


def test_cpu_fp16_after_enable_runs_fp16_with_policy_scaler():
    pp.enable(loss_scaler={"growth_interval": 123, "init_scale": 1024.0})
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    assert isinstance(accelerator.scaler, TelemetryGradScaler)
    assert accelerator.scaler.get_growth_interval() == 123
    model, optimizer, seen = _prepared(accelerator)
    _step(accelerator, model, optimizer)
    assert seen == [torch.float16]  # the Linear really ran fp16 inside the training forward
    assert model[0].weight.dtype == torch.float32  # master weights stay fp32
    before = [p.detach().clone() for p in model.parameters()]
    _step(accelerator, model, optimizer, poison=math.inf)
    assert accelerator.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    stats = accelerator_stats(accelerator)
    assert stats.scale == 512.0 and stats.skipped_steps == 1 and stats.steps == 2


def test_unspecified_mixed_precision_follows_the_policy():
    pp.enable()
    accelerator = Accelerator(cpu=True)
    assert accelerator.mixed_precision == "fp16" and accelerator.scaler is not None


def test_bf16_request_is_coerced_with_a_warning(caplog):
    pp.enable()
    accelerator = Accelerator(mixed_precision="bf16", cpu=True)
    assert accelerator.mixed_precision == "fp16"
    assert "mixed_precision='bf16'" in caplog.text and "float16" in caplog.text


def test_bf16_request_is_refused_in_strict_mode():
    pp.enable(strictness="error")
    with pytest.raises(PrecisionMismatchError, match=r"mixed_precision='fp16'"):
        Accelerator(mixed_precision="bf16", cpu=True)


def test_fp16_model_is_given_fp32_master_weights_at_prepare():
    pp.enable()
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    model = _model().half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    _step(accelerator, model, optimizer)  # a fp16 model would die in unscale_


def test_save_and_load_state_keep_scale_and_skips(tmp_path):
    pp.enable(loss_scaler={"init_scale": 256.0})
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    model, optimizer, _ = _prepared(accelerator)
    for poison in (math.inf, None, math.nan):
        _step(accelerator, model, optimizer, poison=poison)
    saved = accelerator_stats(accelerator)
    assert (saved.scale, saved.skipped_steps, saved.steps) == (64.0, 2, 3)
    accelerator.save_state(str(tmp_path / "ckpt"))

    AcceleratorState._reset_state(True)
    resumed = Accelerator(mixed_precision="fp16", cpu=True)
    model2, optimizer2, _ = _prepared(resumed)
    assert accelerator_stats(resumed).scale == 256.0
    resumed.load_state(str(tmp_path / "ckpt"))
    assert accelerator_stats(resumed) == saved
    _step(resumed, model2, optimizer2, poison=math.inf)
    assert accelerator_stats(resumed).skipped_steps == 3


def test_disable_restores_accelerator_exactly():
    init = vars(Accelerator)["__init__"]
    prepare_model = vars(Accelerator)["prepare_model"]
    pp.enable()
    assert vars(Accelerator)["__init__"] is not init
    pp.disable()
    assert vars(Accelerator)["__init__"] is init
    assert vars(Accelerator)["prepare_model"] is prepare_model
    assert accelerate.Accelerator is Accelerator


@pytest.mark.slow
def test_recipe_yaml_runs_with_accelerate_launch():
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / "integrations/accelerate/fp16.yaml"),
            str(ROOT / "integrations/accelerate/train_fp16.py"),
            "--steps",
            "12",
            "--growth-interval",
            "50",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["accelerate_mixed_precision"] == "fp16"
    assert report["forward_dtype"] == "float16"
    assert report["growth_interval"] == 50
    assert report["steps"] == 12 and math.isfinite(report["final_loss"])
