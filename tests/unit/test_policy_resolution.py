"""One policy resolution: every public entry point that takes ``policy=None`` answers alike.

Order: explicit argument -> the active ``enable()`` policy -> ``PRECISION_PLUGIN`` -> defaults.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

import precision_plugin as pp
from precision_plugin._core.master_weights import prepare_model
from precision_plugin.callback import PrecisionCallback
from precision_plugin.deepspeed import apply_config, config_policy
from precision_plugin.doctor import doctor_policy
from precision_plugin.vllm import check_model_config, engine_kwargs, verify_engine


def _frozen_half_model() -> torch.nn.Module:
    model = torch.nn.Linear(4, 4).to(torch.bfloat16)
    model.weight.requires_grad_(False)
    model.bias.requires_grad_(False)
    return model


def _answers(tmp_path) -> dict[str, str]:
    """The dtype each public ``policy=None`` entry point acts on, read from what it does."""
    gemma = tmp_path / "gemma2"
    gemma.mkdir(exist_ok=True)
    (gemma / "config.json").write_text(json.dumps({"model_type": "llama"}))
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(
            vllm_config=SimpleNamespace(
                model_config=SimpleNamespace(dtype=torch.float16, disable_cascade_attn=None),
                cache_config=SimpleNamespace(cache_dtype="auto"),
            )
        )
    )
    ds = apply_config({})
    frozen = prepare_model(_frozen_half_model())
    engine_findings = verify_engine(llm)
    return {
        "resolve_policy": pp.resolve_policy().dtype,
        "engine_kwargs": engine_kwargs({"model": "m"})["dtype"],
        "apply_config": "float16"
        if ds["fp16"]["enabled"]
        else ("bfloat16" if ds["bf16"]["enabled"] else "float32"),
        "config_policy": config_policy({}).dtype,
        "prepare_model": str(frozen.weight.dtype).removeprefix("torch."),
        "PrecisionCallback": PrecisionCallback().policy.dtype,
        "doctor_policy": doctor_policy().dtype,
        # an fp16 engine agrees with an fp16 policy and contradicts any other
        "verify_engine": "float16"
        if not any(f.status in ("error", "warning") for f in engine_findings)
        else "not float16",
        "check_model_config": "ok" if check_model_config(gemma) == [] else "findings",
    }


@pytest.mark.parametrize(
    ("env", "enabled", "expected"),
    [
        (None, None, "float16"),
        ("bfloat16", None, "bfloat16"),
        ("float16", "bfloat16", "bfloat16"),  # the active policy wins over the variable
        (None, "bfloat16", "bfloat16"),
    ],
)
def test_every_entry_point_resolves_the_same_policy(tmp_path, monkeypatch, env, enabled, expected):
    if env is None:
        monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    else:
        monkeypatch.setenv("PRECISION_PLUGIN", env)
    if enabled:
        pp.enable(
            dtype=enabled, skip_adapters=["deepspeed", "vllm", "accelerate", "transformers", "trl"]
        )
    answers = _answers(tmp_path)
    frozen = "float16" if expected == "float16" else "bfloat16"
    assert answers == {
        "resolve_policy": expected,
        "engine_kwargs": expected,
        "apply_config": expected,
        "config_policy": expected,
        "prepare_model": frozen,
        "PrecisionCallback": expected,
        "doctor_policy": expected,
        "verify_engine": "float16" if expected == "float16" else "not float16",
        "check_model_config": "ok",
    }


def test_gemma2_refusal_follows_the_environment(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma2"}))
    monkeypatch.setenv("PRECISION_PLUGIN", "bfloat16")
    assert check_model_config(tmp_path) == []  # consistent bf16: vLLM serves gemma2
    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    with pytest.raises(pp.PrecisionConfigError, match="gemma2"):
        check_model_config(tmp_path)


def test_explicit_argument_beats_everything(monkeypatch):
    monkeypatch.setenv("PRECISION_PLUGIN", "bfloat16")
    pp.enable(dtype="bfloat16", skip_adapters=["deepspeed", "vllm"])
    assert pp.resolve_policy("float32").dtype == "float32"
    assert engine_kwargs({"model": "m"}, pp.PrecisionPolicy())["dtype"] == "float16"
    assert PrecisionCallback("float16").policy.dtype == "float16"


def test_enable_keeps_the_variable_for_child_processes_and_disable_restores_it(monkeypatch):
    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    pp.enable(dtype="bfloat16", skip_adapters=["vllm"])  # whether or not vLLM is installed
    assert pp.PrecisionPolicy.from_env().dtype == "bfloat16"
    pp.disable()
    assert os.environ["PRECISION_PLUGIN"] == "float16"


def test_disable_leaves_a_variable_changed_since_enable(monkeypatch):
    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    pp.enable()
    os.environ["PRECISION_PLUGIN"] = "bfloat16"  # the user's later choice stays
    pp.disable()
    assert os.environ.pop("PRECISION_PLUGIN") == "bfloat16"


def test_wrong_kind_of_policy_is_refused_at_once():
    with pytest.raises(
        pp.PrecisionConfigError, match=r"PrecisionCallback\(\): argument .policy. got int 3"
    ):
        PrecisionCallback(3)  # type: ignore[arg-type]
    with pytest.raises(pp.PrecisionConfigError, match="dtype"):
        PrecisionCallback("fp8")
