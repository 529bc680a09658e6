"""``precision_plugin.deepspeed.apply_config``: a pure translation of the config entry."""

from __future__ import annotations

import copy
import json
import logging

import pytest

import precision_plugin as pp
from precision_plugin.deepspeed import apply_config, config_policy, load_config
from precision_plugin.policy import PrecisionPolicy

STRICT = PrecisionPolicy(strictness="error")


#: The fp16 section the default policy writes.
FP16_SECTION = {
    "enabled": True,
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 400,
    "hysteresis": 2,
    "min_loss_scale": 1.0,
}


def test_float16_mapping_from_policy_defaults():
    out = apply_config({"zero_optimization": {"stage": 2}})
    assert out["fp16"] == FP16_SECTION
    assert out["bf16"] == {"enabled": False}
    assert out["zero_optimization"] == {"stage": 2}
    assert "precision_plugin" not in out  # nothing added at the top level but fp16/bf16


def test_section_keys_map_to_deepspeed_keys():
    section = {
        "loss_scaler": {
            "init_scale": 1024,
            "growth_interval": 50,
            "hysteresis": 3,
            "min_scale": 2,
        }
    }
    out = apply_config({"precision_plugin": section})
    fp16 = out["fp16"]
    assert fp16["initial_scale_power"] == 10
    assert fp16["loss_scale_window"] == 50
    assert fp16["hysteresis"] == 3
    assert fp16["min_loss_scale"] == 2
    assert out["precision_plugin"] == section  # kept as written (DeepSpeed ignores it)
    for key in ("fp16", "bf16"):  # plugin keys never go inside DeepSpeed's sections
        assert set(out[key]) <= {
            "enabled",
            "loss_scale",
            "initial_scale_power",
            "loss_scale_window",
            "hysteresis",
            "min_loss_scale",
        }


def test_deepspeed_accepts_the_output():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config

    out = apply_config({"bf16": {"enabled": True}, "precision_plugin": {"dtype": "fp16"}})
    fp16 = get_float16_config(out)
    assert fp16.enabled and fp16.loss_scale == 0
    assert fp16.dynamic_loss_scale_args()["scale_window"] == 400
    assert not get_bfloat16_config(out).enabled


def test_bfloat16_is_the_mirror_image():
    cfg = {"fp16": {"enabled": "auto", "loss_scale": 0}, "precision_plugin": {"dtype": "bf16"}}
    out = apply_config(cfg)
    assert out["bf16"] == {"enabled": True}
    assert out["fp16"] == {"enabled": False, "loss_scale": 0}


def test_float32_turns_both_off():
    out = apply_config({"precision_plugin": {"dtype": "float32"}})
    assert out["fp16"] == {"enabled": False} and out["bf16"] == {"enabled": False}


def test_auto_values_stay_for_hf_and_accelerate():
    cfg = {
        "fp16": {"enabled": "auto"},
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
    }
    out = apply_config(cfg)
    assert out["train_micro_batch_size_per_gpu"] == "auto"
    assert out["gradient_clipping"] == "auto"
    assert out["zero_optimization"]["reduce_bucket_size"] == "auto"
    # The precision keys are the policy's decision, not TrainingArguments': resolved here.
    assert out["fp16"]["enabled"] is True and out["bf16"]["enabled"] is False


def test_input_not_mutated_and_idempotent():
    cfg = {
        "bf16": {"enabled": True},
        "fp16": {"loss_scale": 128},
        "torch_autocast": {"enabled": True, "dtype": "bfloat16"},
        "precision_plugin": {"loss_scaler": {"growth_interval": 100}},
    }
    frozen = copy.deepcopy(cfg)
    out = apply_config(cfg)
    assert cfg == frozen
    assert apply_config(out) == out
    out["fp16"]["enabled"] = "changed"
    assert cfg == frozen  # no shared nested objects


def test_path_and_json_string(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"precision_plugin": {"dtype": "bfloat16"}}))
    assert apply_config(str(path))["bf16"]["enabled"] is True
    assert apply_config(path)["bf16"]["enabled"] is True
    assert load_config('{"a": 1}') == {"a": 1}


@pytest.mark.parametrize(
    ("cfg", "key", "coerced"),
    [
        ({"bf16": {"enabled": True}}, "bf16.enabled", ("bf16", "enabled", False)),
        ({"bf16": {"enabled": "true"}}, "bf16.enabled", ("bf16", "enabled", False)),
        ({"bfloat16": {"enabled": True}}, "bfloat16.enabled", ("bfloat16", "enabled", False)),
        ({"fp16": {"enabled": False}}, "fp16.enabled", ("fp16", "enabled", True)),
        ({"fp16": {"loss_scale": 128}}, "fp16.loss_scale", ("fp16", "loss_scale", 0)),
        (
            {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}},
            "torch_autocast.dtype",
            ("torch_autocast", "enabled", False),
        ),
        (
            {"torch_autocast": {"enabled": True}},
            "torch_autocast.enabled",
            ("torch_autocast", "enabled", False),
        ),
        (
            {"data_types": {"param_dtype": "bf16"}},
            "data_types.param_dtype",
            ("data_types", "param_dtype", "float16"),
        ),
    ],
)
def test_conflicts_warn_and_coerce_or_refuse(cfg, key, coerced, caplog):
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config(cfg)
    assert key in caplog.text and "contradicts the precision policy" in caplog.text
    section, name, value = coerced
    assert out[section][name] == value
    with pytest.raises(pp.PrecisionMismatchError, match=key.replace(".", r"\.")) as info:
        apply_config(cfg, STRICT)
    assert "Fix:" in str(info.value)


def test_bf16_policy_refuses_fp16_enabled():
    with pytest.raises(pp.PrecisionMismatchError, match=r"fp16\.enabled"):
        apply_config(
            {"fp16": {"enabled": True}}, PrecisionPolicy(dtype="bfloat16", strictness="error")
        )


def test_torch_autocast_in_the_policy_dtype_is_replaced_not_refused(caplog):
    cfg = {"torch_autocast": {"enabled": True, "dtype": "float16"}}
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config(cfg, STRICT)
    assert out["torch_autocast"]["enabled"] is False and out["fp16"]["enabled"] is True
    assert "torch_autocast" in caplog.text


def test_static_scale_kept_when_scaler_disabled():
    out = apply_config(
        {"fp16": {"loss_scale": 128}, "precision_plugin": {"loss_scaler": {"enabled": False}}}
    )
    assert out["fp16"] == {"loss_scale": 128, "enabled": True}


def test_no_conflict_no_warning(caplog):
    cfg = {"fp16": {"enabled": True, "loss_scale": 0}, "bf16": {"enabled": False}}
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        apply_config(cfg, STRICT)
    assert caplog.text == ""


def test_precedence_defaults_policy_section():
    base = PrecisionPolicy(loss_scaler={"growth_interval": 123, "hysteresis": 4})
    out = apply_config({"precision_plugin": {"loss_scaler": {"hysteresis": 1}}}, base)
    assert out["fp16"]["loss_scale_window"] == 123  # from the policy argument
    assert out["fp16"]["hysteresis"] == 1  # the section wins over it
    pp.enable(loss_scaler={"growth_interval": 77})
    assert apply_config({})["fp16"]["loss_scale_window"] == 77  # the active policy
    assert apply_config({}, base)["fp16"]["loss_scale_window"] == 123  # argument beats active


def test_section_dtype_cannot_contradict_active_policy(caplog):
    pp.enable(dtype="float16")
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config({"precision_plugin": {"dtype": "bfloat16"}})
    assert out["fp16"]["enabled"] is True and "precision_plugin.dtype" in caplog.text
    with pytest.raises(pp.PrecisionMismatchError, match=r"precision_plugin\.dtype"):
        apply_config({"precision_plugin": {"dtype": "bfloat16", "strictness": "error"}})
    pp.disable()
    # Without an active or explicit policy the section chooses the dtype freely.
    assert config_policy({"precision_plugin": {"dtype": "bfloat16"}}).dtype == "bfloat16"


@pytest.mark.parametrize(
    ("cfg", "pattern"),
    [
        ({"precision_plugin": {"dtpye": "float16"}}, r"Did you mean 'dtype'"),
        (
            {"precision_plugin": {"loss_scaler": {"growth_intervall": 5}}},
            r"Did you mean 'loss_scaler.growth_interval'",
        ),
        ({"precision_plugin": {"dtype": "fp8"}}, r"not a supported precision"),
        ({"precision_plugin": "float16"}, r"expected an object"),
        ({"precision_plugin": {"loss_scaler": {"hysteresis": 0}}}, r"loss_scaler.hysteresis"),
        ({"fp16": True}, r"'fp16': expected an object"),
    ],
)
def test_bad_input_messages(cfg, pattern):
    with pytest.raises(pp.PrecisionConfigError, match=pattern) as info:
        apply_config(cfg)
    assert "DeepSpeed config" in str(info.value)


def test_bad_config_types():
    with pytest.raises(pp.PrecisionConfigError, match="neither an existing file nor JSON"):
        apply_config("/no/such/ds_config.json")
    with pytest.raises(pp.PrecisionConfigError, match="expected a dict"):
        apply_config(42)  # type: ignore[arg-type]


def test_a_broken_json_file_is_one_clear_error(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"fp16": {"enabled": true,}}')
    with pytest.raises(pp.PrecisionConfigError, match=r"not valid JSON .* line 1") as info:
        apply_config(path)
    assert str(path) in str(info.value) and info.value.__cause__ is None


@pytest.mark.parametrize(
    ("dtype", "written"),
    [
        ("float16", {"fp16": FP16_SECTION, "bf16": {"enabled": False}}),
        ("bfloat16", {"bf16": {"enabled": True}, "fp16": {"enabled": False}}),
    ],
)
def test_the_written_config_is_exact_and_names_the_enabled_section_first(dtype, written):
    """The whole written config, key order included (the written JSON keeps it): the section the
    policy runs comes first, whatever the dtype's place in DeepSpeed's own order."""
    out = apply_config({}, PrecisionPolicy(dtype=dtype))
    assert out == written and list(out) == list(written)


def test_the_enabled_sections_contradiction_is_the_one_refused():
    """Both sections contradict a bfloat16 policy: the refusal names the enabled one (bf16),
    settled first."""
    cfg = {"fp16": {"enabled": True}, "bf16": {"enabled": False}}
    with pytest.raises(
        pp.PrecisionMismatchError, match=r"^precision_plugin: DeepSpeed config bf16\.enabled=false"
    ):
        apply_config(cfg, PrecisionPolicy(dtype="bfloat16", strictness="error"))


def test_the_legacy_bfloat16_section_alone_is_turned_off_without_adding_bf16():
    """DeepSpeed reads "bfloat16" only when "bf16" is absent: the legacy section is turned off
    and no "bf16" section is added; with both, both are turned off."""
    out = apply_config({"bfloat16": {"enabled": False}}, STRICT)
    assert out == {"bfloat16": {"enabled": False}, "fp16": FP16_SECTION}
    both = apply_config({"bfloat16": {"enabled": False}, "bf16": {"enabled": False}}, STRICT)
    assert both == {
        "bfloat16": {"enabled": False},
        "bf16": {"enabled": False},
        "fp16": FP16_SECTION,
    }


def test_torch_autocast_without_a_dtype_is_deepspeeds_default_bfloat16(caplog):
    """``torch_autocast`` enabled without a dtype computes in bfloat16 (DeepSpeed's default): a
    bfloat16 policy replaces it without refusing, a float16 policy refuses naming bfloat16."""
    bf16 = PrecisionPolicy(dtype="bfloat16", strictness="error")
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config({"torch_autocast": {"enabled": True}}, bf16)
    assert out == {
        "torch_autocast": {"enabled": False},
        "bf16": {"enabled": True},
        "fp16": {"enabled": False},
    }
    assert "torch_autocast (dtype bfloat16) replaced by DeepSpeed's bf16 section" in caplog.text
    with pytest.raises(pp.PrecisionMismatchError) as info:
        apply_config({"torch_autocast": {"enabled": True}}, STRICT)
    assert str(info.value).startswith(
        "precision_plugin: DeepSpeed config torch_autocast.enabled=true contradicts the precision policy "
        "(dtype='float16'): torch_autocast would compute in bfloat16 (DeepSpeed's documented "
        "default)"
    )


def test_a_disabled_scaler_with_no_static_scale_is_no_scaling(caplog):
    # Before: the fp16 section got no loss_scale, which DeepSpeed reads as 0 (its dynamic
    # scaler): loss_scaler.enabled=false still ran dynamic scaling, unlike torch's GradScaler.
    off = {"loss_scaler": {"enabled": False}}
    assert apply_config({"precision_plugin": off})["fp16"] == {"enabled": True, "loss_scale": 1}
    auto = apply_config({"fp16": {"loss_scale": "auto"}, "precision_plugin": off})
    assert auto["fp16"] == {"loss_scale": 1, "enabled": True}
    assert caplog.text == ""
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        zero = apply_config({"fp16": {"loss_scale": 0}, "precision_plugin": off})
    assert zero["fp16"]["loss_scale"] == 1
    assert caplog.messages == [
        "precision_plugin: DeepSpeed config fp16.loss_scale=0 contradicts the precision policy "
        "(dtype='float16'): 0 is DeepSpeed's dynamic scaling, and the policy has "
        "loss_scaler.enabled=false (set a static scale such as 1024, or enable the policy's "
        "scaler); precision_plugin set fp16.loss_scale=1 (no scaling)."
    ]


@pytest.mark.parametrize("bad", [-5, float("nan"), "x", True])
def test_a_loss_scale_that_is_no_scale_is_named_as_such(bad, caplog):
    # Before: -5, NaN, "x" and true were each called "a static loss scale".
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config({"fp16": {"loss_scale": bad}})
    assert out["fp16"]["loss_scale"] == 0
    assert caplog.messages == [
        f"precision_plugin: DeepSpeed config fp16.loss_scale={json.dumps(bad)} contradicts the "
        f"precision policy (dtype='float16'): it is no loss scale (DeepSpeed takes 0, dynamic, "
        f"or a static scale > 0); precision_plugin set fp16.loss_scale=0 (dynamic)."
    ]


def test_a_replaced_scaler_key_is_a_warning_naming_the_policy_key(caplog):
    # Before: logged at INFO, which no default logging shows: the user's value vanished.
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config({"fp16": {"initial_scale_power": 100, "min_loss_scale": 1}})
    assert out["fp16"]["initial_scale_power"] == 16
    assert caplog.messages == [
        "precision_plugin: DeepSpeed fp16.initial_scale_power=100 is replaced by 16 from the "
        'precision policy; to change it, set it in the "precision_plugin" section '
        "(loss_scaler.init_scale)"
    ]


@pytest.mark.parametrize(("dtype", "name"), [("float16", "fp16"), ("bfloat16", "bf16")])
def test_half_master_weights_contradict_the_policy(dtype, name, caplog):
    # Before: fp16_master_weights_and_grads=true passed unflagged, so ZeRO kept the master
    # weights in float16 under a policy whose master weights are float32.
    key = f"{name}_master_weights_and_grads"
    cfg = {name: {key: True}, "precision_plugin": {"dtype": dtype}}
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config(cfg)
    assert out[name][key] is False
    assert caplog.messages == [
        f"precision_plugin: DeepSpeed config {name}.{key}=true contradicts the precision policy "
        f"(dtype={dtype!r}): it keeps master weights and gradients in {name}, where small "
        f"updates round away; the policy keeps float32 master weights; precision_plugin set "
        f"{name}.{key}=false."
    ]
    with pytest.raises(pp.PrecisionMismatchError):
        apply_config(
            cfg, STRICT if dtype == "float16" else PrecisionPolicy(dtype=dtype, strictness="error")
        )
    assert (
        apply_config({name: {key: False}, "precision_plugin": {"dtype": dtype}})[name][key] is False
    )


def _deep(levels: int = 10_000) -> dict:
    root: dict = {}
    node = root
    for _ in range(levels):
        node["a"] = node = {}
    return root


def _cyclic() -> dict:
    cfg: dict = {"fp16": {"enabled": "auto"}}
    cfg["fp16"]["self"] = cfg
    return cfg


@pytest.mark.parametrize("make", [_deep, _cyclic])
def test_an_endless_dict_is_refused_naming_cfg_in_every_entry(make):
    """load_config, apply_config and translate walk the dict before copying it (deepcopy of a
    10,000-deep dict was a RecursionError) and name the parameter."""
    from precision_plugin.deepspeed import translate

    for call in (load_config, apply_config, lambda cfg: translate(cfg, None)):
        with pytest.raises(pp.PrecisionConfigError, match=r"^DeepSpeed config \(cfg, a dict\)"):
            call(make())
