"""The cascade-attention guard against a real vLLM of the FA2-bug era (0.8.2 - 0.10.x), on CPU.

Runs in the old contract environment (scripts/setup_vllm_env.sh DIR old, vLLM 0.10.1) and skips
itself on any vLLM >= 0.11, where the flag is not passed (or is deprecated).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from conftest import run_installed
from vllm.engine.arg_utils import EngineArgs

import precision_plugin as pp
from precision_plugin import vllm as adapter

VLLM_VERSION = adapter.vllm_version().version

pytestmark = pytest.mark.skipif(
    not ((0, 8, 2) <= VLLM_VERSION.release < (0, 11)),
    reason=f"vLLM {VLLM_VERSION} is outside 0.8.2 - 0.10.x, the era the flag is passed in",
)


def policy(mode: str) -> pp.PrecisionPolicy:
    return pp.PrecisionPolicy.from_dict({"vllm": {"cascade_guard": mode}})


def test_the_flag_is_a_live_field_defaulting_to_false():
    fields = adapter.engine_arg_fields()
    assert fields is not None and fields["disable_cascade_attn"] is False
    decision = adapter.cascade_guard(policy("auto"))
    # no GPU here: the guard disables cascade attention to be safe
    assert (decision.era, decision.action) == ("buggy", "pass_flag")


@pytest.mark.parametrize("mode", ["auto", "force"])
def test_guard_disables_cascade_and_forces_fp16(llama_dir, mode):
    kwargs = adapter.engine_kwargs({"model": llama_dir, "skip_tokenizer_init": True}, policy(mode))
    assert kwargs["disable_cascade_attn"] is True and kwargs["dtype"] == "float16"
    config = EngineArgs(**kwargs).create_model_config()
    assert config.disable_cascade_attn is True
    assert config.dtype == torch.float16


def test_guard_overrides_an_explicit_false(llama_dir):
    request = {"model": llama_dir, "skip_tokenizer_init": True, "disable_cascade_attn": False}
    kwargs = adapter.engine_kwargs(request, policy("auto"))
    assert EngineArgs(**kwargs).create_model_config().disable_cascade_attn is True


def test_guard_off_leaves_vllm_as_configured(llama_dir):
    kwargs = adapter.engine_kwargs({"model": llama_dir, "skip_tokenizer_init": True}, policy("off"))
    assert "disable_cascade_attn" not in kwargs
    config = EngineArgs(**kwargs).create_model_config()
    assert config.disable_cascade_attn is False
    assert config.dtype == torch.float16  # the dtype is still the policy's


@pytest.mark.parametrize(("mode", "expected"), [("auto", True), ("force", True), ("off", False)])
def test_enable_reaches_colocated_engines(llama_dir, mode, expected):
    pp.enable(vllm={"cascade_guard": mode})
    config = EngineArgs(model=llama_dir, skip_tokenizer_init=True).create_model_config()
    assert config.disable_cascade_attn is expected
    assert config.dtype == torch.float16
    pp.disable()
    config = EngineArgs(model=llama_dir, skip_tokenizer_init=True).create_model_config()
    assert config.disable_cascade_attn is False
    assert config.dtype == torch.bfloat16


PROBE = textwrap.dedent(
    """
    import precision_plugin
    from vllm.engine.arg_utils import EngineArgs
    config = EngineArgs(model={model!r}, dtype="bfloat16", skip_tokenizer_init=True)
    config = config.create_model_config()
    print("FILE", precision_plugin.__file__)
    print("DTYPE", config.dtype)
    print("CASCADE_OFF", config.disable_cascade_attn)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "dtype", "cascade_off"),
    [
        ({"PRECISION_PLUGIN": "float16"}, "torch.float16", "True"),
        ({}, "torch.bfloat16", "False"),
    ],
    ids=["PRECISION_PLUGIN=float16", "unset"],
)
def test_general_plugin_entry_point(llama_dir, tmp_path: Path, env, dtype, cascade_off):
    out = run_installed(PROBE.format(model=llama_dir), tmp_path, **env)
    assert out["DTYPE"] == dtype
    assert out["CASCADE_OFF"] == cascade_off
