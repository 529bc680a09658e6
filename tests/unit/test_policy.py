"""PrecisionPolicy: defaults, aliases, parsing, validation messages, env, round trips."""

from __future__ import annotations

import json

import pytest
import torch

from precision_plugin import PrecisionConfigError, PrecisionPolicy
from precision_plugin.policy import field_help, normalize_dtype


def test_defaults_follow_the_paper():
    p = PrecisionPolicy()
    assert p.dtype == "float16"
    assert p.torch_dtype is torch.float16
    assert p.uses_loss_scaler
    s = p.loss_scaler
    assert (s.init_scale, s.growth_factor, s.backoff_factor, s.growth_interval) == (
        2.0**16, 2.0, 0.5, 400,
    )  # fmt: skip
    assert p.vllm.cascade_guard == "auto"
    assert p.strictness == "warn"


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("fp16", "float16"), ("half", "float16"), ("FP16", "float16"), (torch.float16, "float16"),
        ("torch.float16", "float16"), ("bf16", "bfloat16"), (torch.bfloat16, "bfloat16"),
        ("fp32", "float32"), ("float", "float32"), (torch.float32, "float32"),
    ],
)  # fmt: skip
def test_dtype_aliases(alias, canonical):
    assert PrecisionPolicy(dtype=alias).dtype == canonical
    assert normalize_dtype(alias) == canonical


@pytest.mark.parametrize("bad", ["fp8", "int8", "auto", "", None, torch.float8_e4m3fn])
def test_unsupported_dtype_names_field_value_and_allowed(bad):
    with pytest.raises(PrecisionConfigError) as err:
        PrecisionPolicy.from_dict({"dtype": bad})
    text = str(err.value)
    assert text.startswith("dtype:") and repr(bad) in text
    assert "float16, bfloat16, float32" in text


def test_error_is_a_value_error():
    with pytest.raises(ValueError):
        PrecisionPolicy(dtype="fp8")


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(PrecisionConfigError, match=r"dtpye: unknown key.*Did you mean 'dtype'"):
        PrecisionPolicy.from_dict({"dtpye": "fp16"})
    with pytest.raises(
        PrecisionConfigError, match=r"loss_scaler.growth_intervall.*'loss_scaler.growth_interval'"
    ):
        PrecisionPolicy.from_dict({"loss_scaler": {"growth_intervall": 100}})


def test_unknown_key_without_close_match_lists_known_keys():
    with pytest.raises(PrecisionConfigError, match=r"Known keys: dtype, strictness"):
        PrecisionPolicy.from_dict({"zzz": 1})


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ({"loss_scaler": {"growth_interval": "400"}}, r"loss_scaler.growth_interval: expected an integer, got '400'"),
        ({"loss_scaler": {"growth_interval": True}}, r"expected an integer, got True"),
        ({"loss_scaler": {"init_scale": "big"}}, r"loss_scaler.init_scale: expected a number"),
        ({"loss_scaler": {"backoff_factor": 2.0}}, r"backoff_factor: 2.0 is out of range; allowed: a number in \(0, 1\)"),
        ({"loss_scaler": {"growth_interval": 0}}, r"growth_interval: 0 is out of range"),
        ({"loss_scaler": {"on_min_scale": "ignore"}}, r"on_min_scale: 'ignore' is not allowed; choose one of 'error', 'warn'"),
        ({"vllm": {"cascade_guard": "maybe"}}, r"vllm.cascade_guard: 'maybe' is not allowed"),
        ({"vllm": {"enforce_dtype": "yes"}}, r"vllm.enforce_dtype: expected true or false"),
        ({"strictness": "strict"}, r"strictness: 'strict' is not allowed; choose one of 'warn', 'error'"),
        ({"metrics": {"prob_diff_ok": 0.5}}, r"metrics.prob_diff_ok: 0.5 is out of range"),
        ({"vllm": 3}, r"vllm: expected a section"),
    ],
)  # fmt: skip
def test_bad_values_name_the_field(data, pattern):
    with pytest.raises(PrecisionConfigError, match=pattern):
        PrecisionPolicy.from_dict(data)


def test_not_a_dict():
    with pytest.raises(PrecisionConfigError, match="expected a dict"):
        PrecisionPolicy.from_dict(["float16"])  # type: ignore[arg-type]


def test_round_trip_and_json():
    p = PrecisionPolicy.from_dict(
        {"dtype": "bf16", "strictness": "error", "loss_scaler": {"growth_interval": 200},
         "vllm": {"cascade_guard": "force"}, "metrics": {"log_every": 5}}
    )  # fmt: skip
    assert PrecisionPolicy.from_dict(p.to_dict()) == p
    assert PrecisionPolicy.from_dict(json.loads(p.to_json())) == p
    assert p.loss_scaler.growth_interval == 200 and p.metrics.log_every == 5


def test_ints_widen_to_float():
    p = PrecisionPolicy.from_dict({"loss_scaler": {"init_scale": 1024}})
    assert isinstance(p.loss_scaler.init_scale, float) and p.loss_scaler.init_scale == 1024.0


def test_frozen_and_replace():
    p = PrecisionPolicy()
    with pytest.raises(AttributeError):
        p.dtype = "bfloat16"  # type: ignore[misc]
    q = p.replace(dtype="bf16", loss_scaler={"growth_interval": 50})
    assert (q.dtype, q.loss_scaler.growth_interval, q.loss_scaler.init_scale) == (
        "bfloat16", 50, 2.0**16,
    )  # fmt: skip
    assert p.dtype == "float16"


def test_direct_construction_is_validated_too():
    from precision_plugin.policy import LossScalerSettings

    with pytest.raises(PrecisionConfigError, match="on_min_scale"):
        LossScalerSettings(on_min_scale="nope")  # type: ignore[arg-type]
    assert PrecisionPolicy(loss_scaler={"growth_interval": 7}).loss_scaler.growth_interval == 7  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", [None, "", "0", "off", "false", "OFF"])
def test_env_off(raw):
    env = {} if raw is None else {"PRECISION_PLUGIN": raw}
    assert PrecisionPolicy.from_env(env) is None


def test_env_values():
    assert PrecisionPolicy.from_env({"PRECISION_PLUGIN": "1"}) == PrecisionPolicy()
    assert PrecisionPolicy.from_env({"PRECISION_PLUGIN": "bf16"}).dtype == "bfloat16"
    p = PrecisionPolicy.from_env(
        {"PRECISION_PLUGIN": '{"dtype": "float16", "vllm": {"cascade_guard": "force"}}'}
    )
    assert p.vllm.cascade_guard == "force"


def test_env_errors_are_clear():
    with pytest.raises(PrecisionConfigError, match=r"PRECISION_PLUGIN='fp8'"):
        PrecisionPolicy.from_env({"PRECISION_PLUGIN": "fp8"})
    with pytest.raises(PrecisionConfigError, match=r"looks like JSON but does not parse"):
        PrecisionPolicy.from_env({"PRECISION_PLUGIN": "{dtype: fp16}"})
    # A bad key inside valid JSON names the variable too: the user must know where to look.
    with pytest.raises(PrecisionConfigError, match=r"""PRECISION_PLUGIN='{"dtyp".*'dtype'\?"""):
        PrecisionPolicy.from_env({"PRECISION_PLUGIN": '{"dtyp": "fp16"}'})


def test_every_field_has_help():
    rows = field_help()
    assert {
        "dtype",
        "loss_scaler.growth_interval",
        "vllm.cascade_guard",
        "metrics.prob_diff_ok",
    } <= {r[0] for r in rows}
    assert all(help_text for _, _, help_text in rows)


def test_metric_settings_take_effect_in_the_callback():
    """metrics.enabled / metrics.log_every gate the mismatch metrics PrecisionCallback logs."""
    from types import SimpleNamespace

    from precision_plugin.callback import PrecisionCallback

    trl_logs = {"sampling/sampling_logp_difference/mean": 0.01}

    def logged(policy, times):
        cb = PrecisionCallback(policy)
        seen = []
        for _ in range(times):
            logs = dict(trl_logs)
            cb.on_log(None, SimpleNamespace(log_history=[]), None, logs=logs)
            seen.append("precision/logp_abs_diff_mean" in logs)
        return seen

    assert logged(PrecisionPolicy(), 2) == [True, True]
    assert logged(PrecisionPolicy(metrics={"log_every": 2}), 4) == [True, False, True, False]
    assert logged(PrecisionPolicy(metrics={"enabled": False}), 2) == [False, False]
