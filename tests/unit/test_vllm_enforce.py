"""The dtype enforcement inside vLLM processes, in the main suite (no vLLM installed here).

``enforce_on_engine_args`` and the ``EngineArgs.create_model_config`` wrapper run on a stand-in
``EngineArgs`` dataclass with the fields (and defaults) the plugin manages in current vLLM; the
contract tests run the same code against the real vLLM package.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from precision_plugin.errors import PrecisionConfigError, PrecisionMismatchError
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.vllm.enforce import _create_model_config, enforce_on_engine_args


@dataclass
class EngineArgs:
    """The fields of vLLM's ``EngineArgs`` the plugin reads or writes, with vLLM's defaults."""

    model: str = "facebook/opt-125m"
    hf_config_path: str | None = None
    revision: str | None = None
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    disable_cascade_attn: bool = False
    calls: int = 0

    def create_model_config(self) -> str:
        self.calls += 1
        return f"ModelConfig(dtype={self.dtype})"


STRICT = PrecisionPolicy(strictness="error")


def test_auto_dtype_becomes_the_policy_dtype() -> None:
    args = EngineArgs()
    enforce_on_engine_args(args, PrecisionPolicy())
    assert args.dtype == "float16"
    args = EngineArgs()
    enforce_on_engine_args(args, "bfloat16")
    assert args.dtype == "bfloat16"


def test_a_contradicting_dtype_is_coerced_with_a_warning(caplog) -> None:
    args = EngineArgs(dtype="bfloat16")
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        enforce_on_engine_args(args, PrecisionPolicy())
    assert args.dtype == "float16"
    assert "dtype='bfloat16' contradicts the policy dtype float16" in caplog.text


def test_a_contradicting_dtype_is_refused_and_left_alone_when_strict() -> None:
    args = EngineArgs(dtype="bfloat16", kv_cache_dtype="bfloat16")
    with pytest.raises(PrecisionMismatchError, match="dtype='bfloat16'"):
        enforce_on_engine_args(args, STRICT)
    assert (args.dtype, args.kv_cache_dtype) == ("bfloat16", "bfloat16")


def test_a_kv_cache_in_the_other_half_precision_goes_back_to_auto() -> None:
    args = EngineArgs(kv_cache_dtype="bfloat16")
    enforce_on_engine_args(args, PrecisionPolicy())
    assert (args.dtype, args.kv_cache_dtype) == ("float16", "auto")


def test_enforce_dtype_off_leaves_the_engine_alone() -> None:
    args = EngineArgs(dtype="bfloat16")
    enforce_on_engine_args(args, PrecisionPolicy(vllm={"enforce_dtype": False}))
    assert args.dtype == "bfloat16"


def _checkpoint(tmp_path: Path, model_type: str) -> str:
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(folder)


@pytest.fixture
def wrapped():
    """``EngineArgs.create_model_config`` with the advice the plugin puts around vLLM's."""
    return functools.partial(_create_model_config, EngineArgs.create_model_config)


def test_the_wrapper_follows_the_requested_policy(wrapped, monkeypatch) -> None:
    args = EngineArgs()
    assert wrapped(args) == "ModelConfig(dtype=auto)"  # nothing requested: vLLM's own choice
    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    args = EngineArgs(dtype="bfloat16")
    assert wrapped(args) == "ModelConfig(dtype=float16)"


def test_the_wrapper_refuses_a_model_vllm_refuses_in_fp16_before_vllm_runs(
    wrapped, monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    args = EngineArgs(model=_checkpoint(tmp_path, "gemma2"))
    with pytest.raises(PrecisionConfigError, match="gemma2"):
        wrapped(args)
    assert args.calls == 0
    monkeypatch.setenv("PRECISION_PLUGIN", "bfloat16")
    assert wrapped(args) == "ModelConfig(dtype=bfloat16)"


def test_vllms_own_fp16_refusal_is_translated(monkeypatch) -> None:
    def refuses(self: EngineArgs) -> str:
        raise ValueError("The model type 'gemma3' does not support float16. Reason: unstable")

    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    with pytest.raises(PrecisionConfigError, match=r"does not support float16.*bfloat16"):
        _create_model_config(refuses, EngineArgs())
