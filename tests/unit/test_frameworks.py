"""The one policy -> framework table (``precision_plugin._core.frameworks``), for all three dtypes."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

import precision_plugin as pp
from precision_plugin._core import frameworks
from precision_plugin.deepspeed import apply_config
from precision_plugin.policy import PrecisionPolicy

# dtype -> (HF/TRL flags, Accelerate mixed_precision, DeepSpeed sections enabled, vLLM dtype)
TABLE = {
    "float16": ((True, False), "fp16", {"fp16": True, "bf16": False}, "float16"),
    "bfloat16": ((False, True), "bf16", {"fp16": False, "bf16": True}, "bfloat16"),
    "float32": ((False, False), "no", {"fp16": False, "bf16": False}, "float32"),
}


@pytest.mark.parametrize("dtype", sorted(TABLE))
def test_each_framework_spelling(dtype):
    policy = PrecisionPolicy(dtype=dtype)
    flags, mixed, sections, vllm = TABLE[dtype]
    got = frameworks.trainer_flags(policy)
    assert (got.fp16, got.bf16) == flags
    assert got.to_kwargs() == {"fp16": flags[0], "bf16": flags[1]}
    assert str(got) == f"fp16={flags[0]}, bf16={flags[1]}"
    assert frameworks.mixed_precision(policy) == mixed
    assert frameworks.deepspeed_enabled_sections(policy) == sections
    assert frameworks.vllm_dtype(policy) == vllm
    # What the DeepSpeed translation writes is what the table says.
    out = apply_config({}, policy)
    assert {name: out[name]["enabled"] for name in ("fp16", "bf16")} == sections


@pytest.mark.parametrize("dtype", sorted(TABLE))
def test_transformers_reads_the_flags_back_as_the_same_precision(dtype):
    """TrainingArguments built from the table's flags derive the table's mixed_precision."""
    transformers = pytest.importorskip("transformers")
    policy = PrecisionPolicy(dtype=dtype)
    flags = frameworks.trainer_flags(policy)
    args = transformers.TrainingArguments(output_dir="unused", use_cpu=True, **flags.to_kwargs())
    assert frameworks.flags_of(args) == flags
    assert args.mixed_precision == frameworks.mixed_precision(policy)


def test_flags_of_reads_trl_unset_as_off():
    class Config:
        fp16 = False
        bf16 = None

    assert frameworks.flags_of(Config()) == frameworks.TrainerFlags()


@pytest.mark.parametrize("dtype", sorted(TABLE))
def test_grad_scaler_kwargs_build_torch_and_accelerate_scalers(dtype):
    policy = PrecisionPolicy(dtype=dtype, loss_scaler={"init_scale": 1024, "growth_interval": 7})
    kwargs = frameworks.grad_scaler(policy.loss_scaler).to_kwargs()
    assert kwargs == {
        "init_scale": 1024.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 7,
        "enabled": True,
    }
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    assert scaler.get_scale() == 1024.0 and scaler.get_growth_interval() == 7
    accelerate_utils = pytest.importorskip("accelerate.utils")
    known = [f.name for f in dataclasses.fields(accelerate_utils.GradScalerKwargs)]
    handler = accelerate_utils.GradScalerKwargs(
        **frameworks.grad_scaler(policy.loss_scaler).to_kwargs(known)
    )
    assert handler.to_kwargs() == {"init_scale": 1024.0, "growth_interval": 7}  # non-defaults
    assert frameworks.grad_scaler(policy.loss_scaler).to_kwargs(["enabled"]) == {"enabled": True}


@pytest.mark.parametrize("dtype", sorted(TABLE))
def test_deepspeed_dynamic_scaling_is_read_back_exactly_by_deepspeed(dtype):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config

    policy = PrecisionPolicy(
        dtype=dtype, loss_scaler={"init_scale": 2.0**12, "growth_interval": 50, "min_scale": 4}
    )
    out = apply_config({}, policy)
    fp16, bf16 = get_float16_config(out), get_bfloat16_config(out)
    assert (fp16.enabled, bf16.enabled) == tuple(TABLE[dtype][2].values())
    if dtype == "float16":
        args = fp16.dynamic_loss_scale_args()
        assert fp16.loss_scale == 0  # dynamic
        assert args["init_scale"] == policy.loss_scaler.init_scale
        assert args["scale_window"] == 50 and args["min_scale"] == 4


# -- issue 14 class 2: a setting a framework cannot represent exactly -------------------------
@pytest.mark.parametrize(
    ("init_scale", "power"), [(2.0**16, 16), (1.0, 0), (2.0**40, 40), (3.0, 1), (100.0, 6)]
)
def test_initial_scale_power(init_scale, power):
    settings = PrecisionPolicy(loss_scaler={"init_scale": init_scale}).loss_scaler
    assert frameworks.deepspeed_scale_power(settings, "warn") == power


def test_inexact_initial_scale_warns_with_the_scale_that_runs(caplog):
    policy = PrecisionPolicy(loss_scaler={"init_scale": 100})
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config({}, policy)
    assert out["fp16"]["initial_scale_power"] == 6
    assert "loss_scaler.init_scale=100" in caplog.text
    assert "DeepSpeed starts at 64 (initial_scale_power=6)" in caplog.text


def test_inexact_initial_scale_is_refused_under_strictness_error():
    policy = PrecisionPolicy(strictness="error", loss_scaler={"init_scale": 100})
    with pytest.raises(pp.PrecisionMismatchError, match=r"init_scale=100.*Fix: set .*=64 or 128"):
        apply_config({}, policy)


def test_exact_settings_say_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        apply_config({}, PrecisionPolicy(strictness="error", loss_scaler={"init_scale": 1024}))
    assert caplog.text == ""


def test_fractional_min_scale_is_warned_or_refused(caplog):
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config({}, PrecisionPolicy(loss_scaler={"min_scale": 0.5}))
    assert out["fp16"]["min_loss_scale"] == 1 and "DeepSpeed's floor is 1" in caplog.text
    with pytest.raises(pp.PrecisionMismatchError, match=r"min_scale=2\.5"):
        apply_config({}, PrecisionPolicy(strictness="error", loss_scaler={"min_scale": 2.5}))


def test_bf16_and_fp32_never_check_the_loss_scaler(caplog):
    """DeepSpeed's scaler runs only under fp16: an unrepresentable scale is moot otherwise."""
    for dtype in ("bfloat16", "float32"):
        policy = PrecisionPolicy(dtype=dtype, strictness="error", loss_scaler={"init_scale": 100})
        assert "initial_scale_power" not in apply_config({}, policy)["fp16"]


# -- issue 14 class 3: read every flag as the framework does ----------------------------------
DS_VALUES = [True, False, 1, 0, 1.0, 0.0, 2, -1, 0.5, "1", "0", "true", "True", "TRUE", "false",
             "yes", "no", "on", "off", "y", "n", "t", "f", " true", "enabled", "", None, [], {}]  # fmt: skip


@pytest.mark.parametrize("value", DS_VALUES, ids=repr)
def test_deepspeed_flag_matches_deepspeeds_own_parsing(value):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config

    for model in (DeepSpeedFP16Config, DeepSpeedBF16Config):
        try:
            theirs = model(enabled=value).enabled
        except Exception:
            theirs = None  # DeepSpeed refuses the value
        assert frameworks.deepspeed_flag(value) == theirs, (model.__name__, value)


@pytest.mark.parametrize("one", [1, "1", "yes", "on", 1.0])
def test_truthy_bf16_enabled_is_read_as_true(one, caplog):
    """``"enabled": 1`` is true to DeepSpeed: under fp16 it is a contradiction, not ignored."""
    with pytest.raises(pp.PrecisionMismatchError, match=r"bf16\.enabled"):
        apply_config({"bf16": {"enabled": one}}, PrecisionPolicy(strictness="error"))
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        assert apply_config({"bf16": {"enabled": one}})["bf16"]["enabled"] is False
    assert "bf16.enabled" in caplog.text


@pytest.mark.parametrize("one", [1, "1", "yes", "on", 1.0])
def test_truthy_fp16_enabled_agrees_with_a_float16_policy(one, caplog):
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config({"fp16": {"enabled": one}}, PrecisionPolicy(strictness="error"))
    assert out["fp16"]["enabled"] is True and caplog.text == ""


def test_falsy_values_agree_with_a_disabled_section(caplog):
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config(
            {"bf16": {"enabled": 0}, "bfloat16": {"enabled": "off"}},
            PrecisionPolicy(strictness="error"),
        )
    assert out["bf16"]["enabled"] is False and caplog.text == ""


def test_a_value_deepspeed_refuses_is_a_conflict(caplog):
    with pytest.raises(pp.PrecisionMismatchError, match=r"fp16\.enabled=2.*reads only"):
        apply_config({"fp16": {"enabled": 2}}, PrecisionPolicy(strictness="error"))
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        assert apply_config({"fp16": {"enabled": 2}})["fp16"]["enabled"] is True
    assert "fp16.enabled=2" in caplog.text


def test_torch_autocast_enabled_is_a_plain_truth_test():
    """DeepSpeed reads ``torch_autocast.enabled`` raw (``if enabled:``): "false" is true there."""
    assert frameworks.deepspeed_autocast_flag("false") is True
    assert frameworks.deepspeed_autocast_flag(0) is False
    with pytest.raises(pp.PrecisionMismatchError, match=r"torch_autocast\.enabled"):
        apply_config({"torch_autocast": {"enabled": 1}}, PrecisionPolicy(strictness="error"))
    out = apply_config({"torch_autocast": {"enabled": 0}}, PrecisionPolicy(strictness="error"))
    assert out["torch_autocast"] == {"enabled": 0}  # off: left alone


# -- one decision per object ------------------------------------------------------------------
def test_settle_once_per_object_and_policy():
    class Args:
        pass

    calls = []
    fp16, bf16 = PrecisionPolicy(), PrecisionPolicy(dtype="bfloat16")
    a, b = Args(), Args()
    for obj, policy in [(a, fp16), (a, fp16), (b, fp16), (a, bf16), (a, bf16)]:
        frameworks.settle_once(obj, "flags", policy, lambda o=obj, p=policy: calls.append((o, p)))
    assert calls == [(a, fp16), (b, fp16), (a, bf16)]


def test_settle_once_settles_a_copy_anew_and_retries_after_a_refusal():
    import copy

    class Args:
        pass

    calls = []
    a = Args()
    frameworks.settle_once(a, "flags", PrecisionPolicy(), lambda: calls.append("a"))
    frameworks.settle_once(copy.copy(a), "flags", PrecisionPolicy(), lambda: calls.append("copy"))
    assert calls == ["a", "copy"]

    def refuse():
        raise pp.PrecisionMismatchError("no")

    b = Args()
    for _ in range(2):
        with pytest.raises(pp.PrecisionMismatchError):
            frameworks.settle_once(b, "flags", PrecisionPolicy(), refuse)


def test_settle_once_on_objects_without_attributes_settles_every_time():
    calls = []
    for _ in range(2):
        frameworks.settle_once(3, "flags", PrecisionPolicy(), lambda: calls.append(1))
    assert calls == [1, 1]


def test_doctor_reports_a_scale_deepspeed_cannot_run_as_an_error():
    pytest.importorskip("deepspeed")
    from precision_plugin.deepspeed.doctor import doctor_findings

    findings = doctor_findings(PrecisionPolicy(strictness="error", loss_scaler={"init_scale": 100}))
    errors = [f for f in findings if f.status == "error"]
    assert len(errors) == 1 and "initial_scale_power" in errors[0].message
