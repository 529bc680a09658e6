"""Bad inputs of the Python entry points found by a sweep, each accepted before without a word
or reported as something else; each test names what happened before. (The command line's are in
``BAD_ARGS`` of tests/integration/test_cli.py.)"""

from __future__ import annotations

import pytest

import precision_plugin as pp
from precision_plugin import PrecisionConfigError, PrecisionPolicy


@pytest.mark.parametrize("key", ["precision-plugin", "PrecisionPlugin", "precision_plugins"])
def test_a_misspelled_deepspeed_section_is_refused(key: str) -> None:
    # DeepSpeed ignores unknown top-level keys: the bf16 asked for was dropped, fp16 ran.
    from precision_plugin.deepspeed import apply_config

    with pytest.raises(PrecisionConfigError, match=f'key "{key}" is not "precision_plugin"'):
        apply_config({key: {"dtype": "bfloat16"}})


def test_deepspeed_keys_near_the_section_are_not_refused() -> None:
    from precision_plugin.deepspeed import apply_config

    cfg = {"prescale_gradients": False, "communication_data_type": "fp16", "zero_optimization": {}}
    assert apply_config(cfg)["fp16"]["enabled"] is True


@pytest.mark.parametrize("bad", [1.5, 2.0])
def test_prob_diff_bad_above_one_is_refused(bad: float) -> None:
    # prob_diff_mean is a mean of |p - q| <= 1: a threshold above 1 never flags anything.
    with pytest.raises(PrecisionConfigError, match=r"metrics.prob_diff_bad: .* in \(0, 1\]"):
        PrecisionPolicy(metrics={"prob_diff_bad": bad})
    assert PrecisionPolicy(metrics={"prob_diff_bad": 1.0}).metrics.prob_diff_bad == 1.0


def test_callback_refuses_a_bad_env_policy_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    # It was built, and inside train() every check then failed on the policy with a warning.
    monkeypatch.setenv("PRECISION_PLUGIN", "fp8")
    with pytest.raises(PrecisionConfigError, match="PRECISION_PLUGIN='fp8'"):
        pp.PrecisionCallback()
    assert pp.PrecisionCallback("bfloat16").policy.dtype == "bfloat16"  # an explicit policy wins


def test_bad_input_found_while_printing_is_not_an_output_error() -> None:
    # PrecisionConfigError is a ValueError, which writing_stdout read as a closed stdout.
    from precision_plugin.cli.process import writing_stdout

    with pytest.raises(PrecisionConfigError), writing_stdout():
        raise PrecisionConfigError("dtype: 'fp8' is not a supported precision")


@pytest.mark.parametrize(
    ("policy", "keyword"),
    [("bfloat16", "float16"), ({"dtype": "fp16", "strictness": "warn"}, "bfloat16")],
)
def test_enable_refuses_a_dtype_given_twice_with_two_meanings(policy, keyword) -> None:
    # enable("bfloat16", dtype="float16") silently ran float16: the keyword won.
    from precision_plugin._core.manager import coerce_policy

    with pytest.raises(PrecisionConfigError) as refused:
        coerce_policy(policy, dtype=keyword)
    given = policy if isinstance(policy, str) else policy["dtype"]
    assert str(refused.value) == (
        f"enable(): dtype is given twice with different values, {given!r} in the policy and "
        f"dtype={keyword!r} as a keyword; pass it once."
    )


def test_enable_takes_a_keyword_that_repeats_the_policy_or_adds_to_it() -> None:
    from precision_plugin._core.manager import coerce_policy

    assert coerce_policy("bfloat16", dtype="bf16").dtype == "bfloat16"
    assert coerce_policy({"dtype": "fp16"}, dtype="float16").dtype == "float16"
    assert coerce_policy("bfloat16", strictness="error").strictness == "error"
    assert coerce_policy(PrecisionPolicy(), dtype="bfloat16").dtype == "bfloat16"
    merged = coerce_policy({"loss_scaler": {"growth_interval": 200}}, loss_scaler={"hysteresis": 3})
    assert (merged.loss_scaler.growth_interval, merged.loss_scaler.hysteresis) == (200, 3)


def test_run_doctor_takes_a_dtype_name_or_dict_and_names_a_bad_framework() -> None:
    # Before: run_doctor("bf16") was AttributeError: 'str' object has no attribute 'dtype', and
    # frameworks=[None] an AttributeError on strip().
    from precision_plugin.doctor import run_doctor

    assert run_doctor("bf16").policy.dtype == "bfloat16"
    assert run_doctor({"dtype": "fp16"}, "trl").frameworks == run_doctor(None, ["trl"]).frameworks
    with pytest.raises(PrecisionConfigError) as refused:
        run_doctor(frameworks=["trl", None])
    assert str(refused.value) == (
        "run_doctor(): frameworks holds None, which is no framework name; pass names such as "
        "['trl', 'vllm'] (or 'trl,vllm')."
    )


def test_enable_under_an_env_var_that_says_off_says_so(monkeypatch, caplog) -> None:
    # Before: PRECISION_PLUGIN=off followed by enable() enabled float16 without a word.
    import logging

    from precision_plugin._core.manager import coerce_policy

    monkeypatch.setenv("PRECISION_PLUGIN", "off")
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        assert coerce_policy() == PrecisionPolicy()
        assert coerce_policy("bfloat16").dtype == "bfloat16"  # asked for in the call: no word
    assert caplog.messages == [
        "precision_plugin: PRECISION_PLUGIN='off' says off, and enable() was called: the "
        "defaults (dtype=float16) are enabled; unset the variable, or do not call enable(), to "
        "run without the plugin"
    ]
    monkeypatch.delenv("PRECISION_PLUGIN")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        coerce_policy()
    assert caplog.messages == []


def test_a_null_deepspeed_section_is_named_as_null() -> None:
    # Before: 'key "precision_plugin" is not "precision_plugin"', the right key called wrong.
    from precision_plugin.deepspeed import apply_config

    with pytest.raises(PrecisionConfigError) as refused:
        apply_config({"precision_plugin": None})
    assert str(refused.value) == (
        'DeepSpeed config "precision_plugin": expected an object with the policy\'s keys such as '
        '{"dtype": "float16"}, got None.'
    )
