"""Real DeepSpeed engines on CPU (one process, gloo): the config entry applied by
``deepspeed.initialize``, inf/NaN skipping, telemetry, the loss-scale floor, checkpoints."""

from __future__ import annotations

import argparse
import json
import logging
import random

import pytest

pytest.importorskip("deepspeed")

import torch

import precision_plugin as pp
from precision_plugin._core.manager import get_plugin_manager
from precision_plugin.deepspeed import apply_config, engine_dtype, engine_scaler_stats, track_engine
from tests.integration import ds_cpu

STAGES = [0, 1, 2, 3]


@pytest.fixture(autouse=True)
def _fp16_branch(record_property):
    """Each test records which way DeepSpeed's fp16 branch ran here (native or forced)."""
    ds_cpu.record_fp16_branch(record_property)


@pytest.fixture(scope="module")
def deepspeed():
    """DeepSpeed on a one-process CPU world, fp16 allowed (see ds_cpu)."""
    with ds_cpu.one_process_world() as ds:
        yield ds


def _init(deepspeed, cfg, seed=0, **kwargs):
    model = ds_cpu.tiny_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg, **kwargs)
    return engine


@pytest.mark.parametrize("stage", STAGES)
def test_bf16_config_runs_fp16_and_skips_inf_step(deepspeed, stage, caplog):
    pp.enable()
    cfg = ds_cpu.ds_config(stage)
    original = json.dumps(cfg, sort_keys=True)
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        engine = _init(deepspeed, cfg)
    assert json.dumps(cfg, sort_keys=True) == original  # the caller's dict is untouched
    assert "bf16.enabled=true" in caplog.text
    assert engine.fp16_enabled() and not engine.bfloat16_enabled()
    assert engine.dynamic_loss_scale()
    assert {p.dtype for p in engine.module.parameters()} == {torch.float16}
    assert engine.config["fp16"]["loss_scale_window"] == 1000  # from the section

    stats = engine_scaler_stats(engine)
    assert stats.scale == 256 and stats.skipped_steps == 0

    ds_cpu.train_step(engine, seed=1)
    assert engine.was_step_applied()
    before = ds_cpu.full_params(engine)
    ds_cpu.train_step(engine, inject="inf", seed=2)
    assert not engine.was_step_applied()
    after = ds_cpu.full_params(engine)
    assert all(
        torch.equal(a, b) for a, b in zip(before, after, strict=True)
    )  # the step was skipped

    stats = engine_scaler_stats(engine)
    assert stats.skipped_steps == 1 and stats.overflow_count == 1
    assert stats.consecutive_skips == 1 and stats.steps == 2
    assert stats.scale == 128  # hysteresis 1: halved at the first overflow

    metrics = {}
    for result in get_plugin_manager().hook.precision_collect_metrics(
        policy=pp.current_policy(), trainer=None, logs={}, optimizer=None, mismatch_due=True
    ):
        metrics.update(result or {})
    assert metrics["loss_scale"] == 128 and metrics["skipped_steps"] == 1

    ds_cpu.train_step(engine, seed=3)
    assert engine.was_step_applied()
    assert engine_scaler_stats(engine).consecutive_skips == 0
    assert all(torch.isfinite(p).all() for p in ds_cpu.full_params(engine))


def test_config_from_args_path_and_config_params(deepspeed, tmp_path):
    pp.enable()
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds_cpu.ds_config(2)))
    args = argparse.Namespace(deepspeed_config=str(path), local_rank=0)
    model = ds_cpu.tiny_model()
    engine, *_ = deepspeed.initialize(
        args=args, model=model, optimizer=torch.optim.AdamW(model.parameters())
    )
    assert args.deepspeed_config == str(path)  # the caller's args are untouched
    assert engine.fp16_enabled() and engine_scaler_stats(engine).scale == 256

    model = ds_cpu.tiny_model()
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters()), config_params=str(path)
    )
    assert engine.fp16_enabled() and not engine.bfloat16_enabled()


def test_strict_policy_refuses_bf16_config(deepspeed):
    pp.enable(strictness="error")
    with pytest.raises(pp.PrecisionMismatchError, match=r"bf16\.enabled"):
        _init(deepspeed, ds_cpu.ds_config(2))


@pytest.mark.parametrize("keep", [True, False], ids=["float32_buffers", "off"])
def test_fp16_engine_keeps_the_buffers_vllm_keeps_in_float32(deepspeed, keep, caplog):
    """DeepSpeed casts buffers with data_types.buffer_dtype (older releases cast the whole
    module); policy.float32_buffers puts the RoPE frequencies back, exactly."""
    from transformers import LlamaConfig, LlamaForCausalLM

    pp.enable(float32_buffers=keep)
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, max_position_embeddings=64)
    )  # fmt: skip
    reference = {name: buf.clone() for name, buf in model.named_buffers()}
    cfg = ds_cpu.ds_config(0, data_types={"buffer_dtype": "fp16"})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.INFO, logger="precision_plugin"):
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg)
    assert {p.dtype for p in engine.module.parameters()} == {torch.float16}
    buffers = dict(engine.module.named_buffers())
    assert set(buffers) == {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"}
    for name, buf in buffers.items():
        if keep:
            assert buf.dtype == torch.float32 and torch.equal(buf, reference[name])
        else:  # what DeepSpeed's cast leaves without the option
            assert buf.dtype == torch.float16 and not torch.equal(buf.float(), reference[name])
    assert ("back in float32" in caplog.text) == keep


def test_a_buffer_that_cannot_be_recomputed_keeps_its_float32_value(deepspeed, caplog):
    """A MoE routing bias (e_score_correction_bias) has no function to recompute it: its float32
    value is saved before DeepSpeed's cast and put back exactly, not widened from float16."""
    pp.enable()
    model = ds_cpu.tiny_model()
    bias = torch.tensor([1 / 3, 1e-4 + 1 / 7, -2 / 3, 0.1], dtype=torch.float32)
    assert not torch.equal(bias.half().float(), bias)  # float16 cannot hold these values
    model[2].register_buffer("e_score_correction_bias", bias.clone())
    cfg = ds_cpu.ds_config(0, data_types={"buffer_dtype": "fp16"})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.INFO, logger="precision_plugin"):
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg)
    assert {p.dtype for p in engine.module.parameters()} == {torch.float16}
    kept = engine.module[2].e_score_correction_bias
    assert kept.dtype == torch.float32 and torch.equal(kept, bias)
    assert "2.e_score_correction_bias (saved)" in caplog.text


def test_disable_restores_initialize(deepspeed):
    original = deepspeed.initialize
    pp.enable()
    assert deepspeed.initialize is not original
    pp.disable()
    assert deepspeed.initialize is original


def test_floor_without_plugin_is_deepspeeds_bare_exception(deepspeed):
    section = {"loss_scaler": {"init_scale": 2, "min_scale": 1, "hysteresis": 1}}
    cfg = apply_config(ds_cpu.ds_config(2, section=section))
    engine = _init(deepspeed, cfg)  # no enable(): DeepSpeed's own behaviour
    ds_cpu.train_step(engine, inject="inf")  # 2 -> 1
    with pytest.raises(Exception, match="loss scale already at minimum"):
        ds_cpu.train_step(engine, inject="inf")


@pytest.mark.parametrize("stage", [0, 2])
def test_floor_raises_actionable_error(deepspeed, stage):
    section = {
        "loss_scaler": {"init_scale": 4, "min_scale": 1, "hysteresis": 1, "max_skips_at_min": 4}
    }
    pp.enable()
    engine = _init(deepspeed, ds_cpu.ds_config(stage, section=section))
    ds_cpu.train_step(engine, inject="inf")  # 4 -> 2
    ds_cpu.train_step(engine, inject="inf")  # 2 -> 1
    ds_cpu.train_step(engine, inject="inf")  # at the floor: DeepSpeed alone would exit here
    with pytest.raises(pp.LossScaleAtMinimumError, match="stuck at its minimum"):
        ds_cpu.train_step(engine, inject="inf")
    stats = engine_scaler_stats(engine)
    assert stats.at_min_scale and stats.consecutive_skips == 4 and stats.skipped_steps == 4


def test_floor_warns_and_continues(deepspeed, caplog):
    section = {
        "loss_scaler": {
            "init_scale": 2,
            "min_scale": 1,
            "hysteresis": 1,
            "max_skips_at_min": 2,
            "on_min_scale": "warn",
        }
    }
    pp.enable()
    engine = _init(deepspeed, ds_cpu.ds_config(2, section=section))
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        for _ in range(5):
            ds_cpu.train_step(engine, inject="nan")
    assert "stuck at its minimum" in caplog.text
    ds_cpu.train_step(engine)
    assert engine.was_step_applied() and engine.skipped_steps == 5


@pytest.mark.parametrize("stage", [0, 2])
def test_floor_counts_optimizer_steps_not_micro_steps(deepspeed, stage):
    """Gradient accumulation 2: the floor rule counts skipped optimizer steps, not micro-steps."""
    section = {
        "loss_scaler": {"init_scale": 2, "min_scale": 1, "hysteresis": 1, "max_skips_at_min": 3}
    }
    pp.enable()
    cfg = ds_cpu.ds_config(stage, section=section, gradient_accumulation_steps=2)
    engine = _init(deepspeed, cfg)
    assert engine.gradient_accumulation_steps() == 2
    for micro in range(1, 5):  # two optimizer steps, four overflowing micro-steps
        ds_cpu.train_step(engine, inject="inf")
        stats = engine_scaler_stats(engine)
        assert (stats.steps, stats.skipped_steps, stats.consecutive_skips) == (
            micro // 2,
            micro // 2,
            micro // 2,
        )
    assert stats.at_min_scale and stats.scale == 1  # 2 -> 1 at the first skipped step
    ds_cpu.train_step(engine, inject="inf")  # micro-step 5: no optimizer step, no check
    with pytest.raises(pp.LossScaleAtMinimumError, match="last 3 steps all overflowed"):
        ds_cpu.train_step(engine, inject="inf")  # the third skipped optimizer step
    stats = engine_scaler_stats(engine)
    assert (stats.steps, stats.skipped_steps, stats.consecutive_skips) == (3, 3, 3)


def test_fp16_on_an_accelerator_without_it_is_refused_before_deepspeed(
    deepspeed, monkeypatch, caplog, record_property
):
    """Without the seam: the plugin refuses (error) or runs fp32 and says so (warn)."""
    ds_cpu.refuse_fp16(monkeypatch, record_property)  # on any CPU, native or forced
    pp.enable(strictness="error")
    with pytest.raises(pp.PrecisionMismatchError, match="cpu accelerator does not support fp16"):
        _init(deepspeed, ds_cpu.ds_config(2))
    pp.enable(strictness="warn")
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        engine = _init(deepspeed, ds_cpu.ds_config(2, section={}))
    assert "this engine runs float32 instead" in caplog.text
    assert not engine.fp16_enabled() and not engine.bfloat16_enabled()
    assert engine_dtype(engine) == "float32"
    assert {p.dtype for p in engine.module.parameters()} == {torch.float32}


def test_track_engine_without_enable(deepspeed):
    cfg = apply_config(ds_cpu.ds_config(1))
    engine = track_engine(_init(deepspeed, cfg))
    for inject in ("inf", "nan", None):
        ds_cpu.train_step(engine, inject=inject)
    stats = engine_scaler_stats(engine)
    assert stats.skipped_steps == 2 and stats.consecutive_skips == 0 and stats.steps == 3
    assert stats.scale == 64


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 2])
def test_long_run_random_faults(deepspeed, stage):
    """Hundreds of steps with random inf/NaN: no NaN in the weights, exact skip count, recovery."""
    # Kept small: a scale above ~2**16 overflows this model's fp16 gradients by itself.
    section = {"loss_scaler": {"init_scale": 2**6, "hysteresis": 1, "growth_interval": 20}}
    pp.enable()
    engine = _init(deepspeed, ds_cpu.ds_config(stage, section=section))
    rng = random.Random(1234)
    injected = 0
    for step in range(300):
        inject = None
        if step < 150 and rng.random() < 0.15:
            inject = rng.choice(["inf", "nan", "-inf"])
            injected += 1
        ds_cpu.train_step(engine, inject=inject, seed=step)
        assert engine.was_step_applied() == (inject is None)
        if inject is not None or step % 25 == 0:
            assert all(torch.isfinite(p).all() for p in engine.module.parameters()), step
        if step == 149:
            scale_at_fault_end = engine_scaler_stats(engine).scale
    stats = engine_scaler_stats(engine)
    assert injected > 10
    assert stats.skipped_steps == injected and stats.steps == 300
    # At least 150 clean steps with growth every 20 clean steps: 7 doublings or more.
    assert stats.scale >= scale_at_fault_end * 2**7
    assert stats.scale >= 2**6  # back at or above where it started
    assert all(torch.isfinite(p).all() for p in ds_cpu.full_params(engine))


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_checkpoint_keeps_scale_and_skips(deepspeed, stage, tmp_path):
    pp.enable()
    cfg = ds_cpu.ds_config(stage)
    engine = _init(deepspeed, cfg)
    for inject in (None, "inf", None, "nan", "inf", None):
        ds_cpu.train_step(engine, inject=inject)
    saved = engine_scaler_stats(engine)
    assert saved.skipped_steps == 3 and saved.scale == 32
    engine.save_checkpoint(str(tmp_path), tag="t")

    resumed = _init(deepspeed, cfg, seed=99)
    assert engine_scaler_stats(resumed).scale == 256  # fresh engine
    resumed.load_checkpoint(str(tmp_path), tag="t")
    stats = engine_scaler_stats(resumed)
    assert stats.scale == saved.scale
    assert stats.skipped_steps == saved.skipped_steps and stats.steps == saved.steps
    assert all(
        torch.equal(a, b)
        for a, b in zip(ds_cpu.full_params(engine), ds_cpu.full_params(resumed), strict=True)
    )
    ds_cpu.train_step(resumed, inject="inf")
    assert engine_scaler_stats(resumed).skipped_steps == 4
    assert engine_scaler_stats(resumed).scale == 16


@pytest.mark.parametrize("stage", [0, 2])
def test_policy_scale_factor_reaches_engine(deepspeed, stage):
    section = {
        "loss_scaler": {
            "init_scale": 256,
            "hysteresis": 1,
            "growth_factor": 4.0,
            "backoff_factor": 0.25,
        }
    }
    pp.enable()
    engine = _init(deepspeed, ds_cpu.ds_config(stage, section=section))
    ds_cpu.train_step(engine, inject="inf")
    assert engine_scaler_stats(engine).scale == 64  # DeepSpeed's fixed factor would give 128


def test_doctor_reports_version_changes_and_device(deepspeed):
    from precision_plugin.deepspeed.adapter import precision_doctor

    findings = precision_doctor(policy=pp.PrecisionPolicy())
    text = "\n".join(f.message for f in findings)
    assert f"deepspeed {deepspeed.__version__}" in text
    assert any(f.status == "change" and "'enabled': True" in f.message for f in findings)
    # the seam lifts DeepSpeed's CPU fp16 check, and doctor reads DeepSpeed's own answer
    assert any(f.status == "ok" and "accelerator runs float16" in f.message for f in findings)


def test_enable_does_not_import_deepspeed_but_patches_it_on_import():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, precision_plugin as pp
        from precision_plugin._base.patching import is_patched
        pp.enable()
        before = "deepspeed" in sys.modules
        import deepspeed
        patched = is_patched(deepspeed.initialize)
        pp.disable()
        hooks = [h for h in sys.meta_path if hasattr(h, "__dict__") and "deepspeed" in repr(vars(h))]
        print("RESULT", before, patched, is_patched(deepspeed.initialize), len(hooks))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT"))
    assert line == "RESULT False True False 0", out.stderr[-2000:]


def test_enable_imports_neither_accelerate_nor_transformers():
    """The DeepSpeed adapter patches Accelerate's and HF's DeepSpeed config classes on import."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, precision_plugin as pp
        from precision_plugin._base.patching import is_patched
        pp.enable()
        heavy = [m for m in ("accelerate", "transformers", "deepspeed") if m in sys.modules]
        from accelerate.utils import dataclasses as acc, deepspeed as acc_ds
        from transformers.integrations import deepspeed as hf_ds
        targets = (acc_ds.HfDeepSpeedConfig.__init__, acc.DeepSpeedPlugin.set_mixed_precision,
                   hf_ds.HfTrainerDeepSpeedConfig.trainer_config_process)
        on = [is_patched(t) for t in targets]
        pp.disable()
        off = [is_patched(t) for t in (acc_ds.HfDeepSpeedConfig.__init__,
               acc.DeepSpeedPlugin.set_mixed_precision,
               hf_ds.HfTrainerDeepSpeedConfig.trainer_config_process)]
        print("RESULT", heavy, on, off)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")), out.stderr)
    assert line == "RESULT [] [True, True, True] [False, False, False]", out.stderr[-2000:]


def test_disable_gives_deepspeed_its_floor_abort_back(deepspeed):
    """The tracker's override of raise_error_at_min_scale is a patch: disable() restores it."""
    pp.enable()
    engine = _init(deepspeed, ds_cpu.ds_config(2))
    ds_cpu.train_step(engine, seed=1)
    scaler = engine.optimizer.loss_scaler
    assert scaler.raise_error_at_min_scale is False
    assert "step" in vars(engine)
    pp.disable()
    assert scaler.raise_error_at_min_scale is True
    assert "step" not in vars(engine)
