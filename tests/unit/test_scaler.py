"""Loss-scaler factory and torch GradScaler telemetry (real torch, CPU)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from precision_plugin import LossScaleAtMinimumError, PrecisionPolicy
from precision_plugin._core.scaler import (
    STATE_KEY,
    Fp16GradScaler,
    TelemetryGradScaler,
    attach_telemetry,
    make_grad_scaler,
    scaler_stats,
)


def _model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(
        dtype
    )


def _step(model, opt, scaler, *, poison: float | None = None) -> None:
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x.to(next(model.parameters()).dtype)).float().pow(2).mean()
    scaler.scale(loss).backward()
    if poison is not None:
        next(model.parameters()).grad.view(-1)[0] = poison
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


def test_factory_uses_policy_settings():
    policy = PrecisionPolicy(loss_scaler={"init_scale": 1024.0, "growth_interval": 7})
    scaler = make_grad_scaler(policy, "cpu")
    assert isinstance(scaler, TelemetryGradScaler)
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler.is_enabled()
    assert scaler.get_scale() == 1024.0
    assert scaler.get_growth_interval() == 7
    assert scaler.get_backoff_factor() == 0.5


def test_factory_disabled_outside_fp16():
    assert not make_grad_scaler(PrecisionPolicy(dtype="bfloat16"), "cpu").is_enabled()
    policy = PrecisionPolicy(loss_scaler={"enabled": False})
    assert not make_grad_scaler(policy, "cpu").is_enabled()
    assert scaler_stats(make_grad_scaler(policy, "cpu")) is None


def test_factory_fp16_trainable_params_get_an_fp16_capable_scaler():
    model = _model(torch.float16)
    scaler = make_grad_scaler(PrecisionPolicy(), "cpu", model=model)
    if torch.distributed.is_initialized():  # left by another test module: all-reducing scaler
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        assert isinstance(scaler, ShardedGradScaler)
    else:
        assert isinstance(scaler, Fp16GradScaler)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    _step(model, opt, scaler)  # a plain GradScaler raises "Attempting to unscale FP16 gradients"
    assert scaler_stats(scaler).steps == 1


def test_plain_scaler_refuses_fp16_grads():
    model = _model(torch.float16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        _step(model, opt, torch.amp.GradScaler("cpu"))


def test_sharded_scaler_under_a_process_group(tmp_path):
    import torch.distributed as dist

    owns_group = not dist.is_initialized()  # another test module may have left one
    if owns_group:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        model = _model(torch.float16)
        scaler = make_grad_scaler(PrecisionPolicy(), "cpu", model=model)
        assert isinstance(scaler, ShardedGradScaler)
        _step(model, torch.optim.SGD(model.parameters(), lr=1e-3), scaler, poison=math.inf)
        assert scaler_stats(scaler).skipped_steps == 1
    finally:
        if owns_group:
            dist.destroy_process_group()


def test_inf_skips_step_halves_scale_and_counts():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_grad_scaler(PrecisionPolicy(loss_scaler={"init_scale": 256.0}), "cpu")
    before = [p.detach().clone() for p in model.parameters()]
    _step(model, opt, scaler, poison=math.inf)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    stats = scaler_stats(scaler)
    assert (stats.scale, stats.steps, stats.skipped_steps, stats.consecutive_skips) == (
        128.0,
        1,
        1,
        1,
    )
    _step(model, opt, scaler)
    stats = scaler_stats(scaler)
    assert (stats.steps, stats.skipped_steps, stats.consecutive_skips) == (2, 1, 0)
    assert stats.as_metrics()["loss_scale"] == 128.0


def test_long_run_random_faults_exact_counts_and_recovery():
    """Hundreds of steps with random inf/NaN: weights stay finite, skips counted exactly."""
    rng = random.Random(1234)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    policy = PrecisionPolicy(loss_scaler={"init_scale": 2.0**10, "growth_interval": 10})
    scaler = make_grad_scaler(policy, "cpu")
    expected_skips = 0
    for step in range(400):
        poison = None
        if step < 250 and rng.random() < 0.2:
            poison = rng.choice([math.inf, -math.inf, math.nan])
        x = torch.randn(4, 8)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        if poison is not None:
            next(model.parameters()).grad.view(-1)[step % 8] = poison
        scaler.unscale_(opt)
        expected_skips += not all(torch.isfinite(p.grad).all() for p in model.parameters())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        assert all(torch.isfinite(p).all() for p in model.parameters()), step
        if step == 249:
            scale_after_faults = scaler.get_scale()
    stats = scaler_stats(scaler)
    assert stats.steps == 400
    assert stats.skipped_steps == expected_skips >= 30
    assert stats.scale >= scale_after_faults * 2**10  # 150 clean steps, growth every 10


def test_floor_raises_with_actionable_message():
    policy = PrecisionPolicy(loss_scaler={"init_scale": 4.0, "max_skips_at_min": 5})
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_grad_scaler(policy, "cpu")
    with pytest.raises(LossScaleAtMinimumError, match="stuck at its minimum") as info:
        for _ in range(10):
            _step(model, opt, scaler, poison=math.nan)
    assert "on_min_scale='warn'" in str(info.value)
    stats = scaler_stats(scaler)
    assert stats.scale == 1.0  # clamped at min_scale, torch alone would reach 1/64
    assert stats.consecutive_skips == 5 and stats.at_min_scale


def test_floor_warn_keeps_going(caplog):
    policy = PrecisionPolicy(
        loss_scaler={"init_scale": 2.0, "max_skips_at_min": 3, "on_min_scale": "warn"}
    )
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_grad_scaler(policy, "cpu")
    for _ in range(6):
        _step(model, opt, scaler, poison=math.inf)
    assert scaler_stats(scaler).skipped_steps == 6
    # Acts at 3 and 6 consecutive skips, not on every skipped step.
    assert caplog.text.count("stuck at its minimum") == 2


@pytest.mark.parametrize(
    ("consecutive", "at_min", "acts"),
    [(2, True, False), (3, True, True), (4, True, False), (6, True, True), (3, False, False)],
)
def test_check_scale_floor_acts_at_multiples_of_the_limit(consecutive, at_min, acts):
    from precision_plugin._core.scaler import ScalerStats, check_scale_floor
    from precision_plugin.policy import LossScalerSettings

    stats = ScalerStats(scale=1.0, consecutive_skips=consecutive, at_min_scale=at_min)
    warn = LossScalerSettings(max_skips_at_min=3, on_min_scale="warn")
    assert check_scale_floor(stats, warn, backend="torch") is acts
    error = LossScalerSettings(max_skips_at_min=3, on_min_scale="error")
    if acts:
        with pytest.raises(LossScaleAtMinimumError, match="torch loss scale is stuck"):
            check_scale_floor(stats, error, backend="torch")
    else:
        assert check_scale_floor(stats, error, backend="torch") is False


def test_state_dict_round_trip_keeps_counters_and_plain_scaler_compat():
    policy = PrecisionPolicy(loss_scaler={"init_scale": 64.0})
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_grad_scaler(policy, "cpu")
    for poison in (math.inf, None, math.inf, math.inf):
        _step(model, opt, scaler, poison=poison)
    state = scaler.state_dict()
    assert state[STATE_KEY] == {"steps": 4, "skipped_steps": 3, "consecutive_skips": 2}
    restored = make_grad_scaler(policy, "cpu")
    restored.load_state_dict(state)
    assert scaler_stats(restored) == scaler_stats(scaler)
    plain = torch.amp.GradScaler("cpu")
    plain.load_state_dict(state)  # torch ignores the extra key
    assert plain.get_scale() == 8.0


def test_attach_telemetry_to_a_foreign_scaler():
    scaler = torch.amp.GradScaler("cpu", init_scale=32.0)
    assert scaler_stats(scaler).steps == 0  # plain scaler: scale only
    assert attach_telemetry(scaler, PrecisionPolicy().loss_scaler)
    assert type(scaler) is TelemetryGradScaler
    model = _model()
    _step(model, torch.optim.SGD(model.parameters(), lr=0.1), scaler, poison=math.inf)
    assert scaler_stats(scaler).skipped_steps == 1
    assert not attach_telemetry(
        object.__new__(type("Other", (), {})), PrecisionPolicy().loss_scaler
    )
