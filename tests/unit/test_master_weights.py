"""Master weights: check_model / prepare_model on real torch and transformers models."""

from __future__ import annotations

import logging

import pytest
import torch

import precision_plugin as pp
from precision_plugin import PrecisionMismatchError, PrecisionPolicy
from precision_plugin._core.master_weights import check_model, prepare_model


def _lora_like(base_dtype: torch.dtype, adapter_dtype: torch.dtype) -> torch.nn.Module:
    """A frozen base plus trainable low-rank adapters, the way TRL leaves a QLoRA model."""
    model = torch.nn.Module()
    model.base = torch.nn.Linear(16, 16).to(base_dtype).requires_grad_(False)
    model.lora_A = torch.nn.Linear(16, 4, bias=False).to(adapter_dtype)
    model.lora_B = torch.nn.Linear(4, 16, bias=False).to(adapter_dtype)
    return model


def test_fp16_loaded_model_gets_fp32_master_weights(caplog):
    model = torch.nn.Linear(8, 8).half()
    weight = model.weight
    findings = check_model(model, PrecisionPolicy())
    assert [f.status for f in findings] == ["change"]
    assert "Attempting to unscale FP16 gradients" in findings[0].message
    assert model.weight.dtype == torch.float16  # check_model changes nothing
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        assert prepare_model(model, PrecisionPolicy()) is model
    assert model.weight is weight and weight.dtype == torch.float32  # same Parameter object
    assert "float16 -> float32" in caplog.text
    assert [f.status for f in check_model(model, PrecisionPolicy())] == ["ok"]


def test_qlora_style_bf16_adapters_and_frozen_base():
    model = _lora_like(torch.bfloat16, torch.bfloat16)
    prepare_model(model, PrecisionPolicy())
    assert model.lora_A.weight.dtype == torch.float32
    assert model.lora_B.weight.dtype == torch.float32
    assert model.base.weight.dtype == torch.float16  # frozen: stored in the policy dtype


def test_frozen_fp16_base_stays_fp16():
    model = _lora_like(torch.float16, torch.float32)
    assert [f.status for f in check_model(model, PrecisionPolicy())] == ["ok"]


def test_strict_mode_refuses_and_changes_nothing():
    model = torch.nn.Linear(8, 8).half()
    policy = PrecisionPolicy(strictness="error")
    with pytest.raises(PrecisionMismatchError, match=r"dtype=torch.float32.*strictness='warn'"):
        prepare_model(model, policy)
    assert model.weight.dtype == torch.float16


def test_bf16_policy_keeps_bf16_trainable_but_not_fp16():
    model = _lora_like(torch.bfloat16, torch.bfloat16)
    assert [f.status for f in check_model(model, PrecisionPolicy(dtype="bfloat16"))] == ["ok"]
    half = torch.nn.Linear(4, 4).half()
    prepare_model(half, PrecisionPolicy(dtype="bfloat16"))
    assert half.weight.dtype == torch.float32


def test_keep_in_fp32_modules_of_a_transformers_model():
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=32,
        d_model=16,
        d_kv=4,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        decoder_start_token_id=0,
    )
    model = T5ForConditionalGeneration(config)
    assert "wo" in model._keep_in_fp32_modules
    model.requires_grad_(False).half()
    prepare_model(model, PrecisionPolicy())
    wo = model.encoder.block[0].layer[1].DenseReluDense.wo.weight
    wi = model.encoder.block[0].layer[1].DenseReluDense.wi.weight
    assert wo.dtype == torch.float32 and wi.dtype == torch.float16
    # _keep_in_fp32_modules applies to fp16 only (transformers does the same)
    model.half()
    prepare_model(model, PrecisionPolicy(dtype="bfloat16"))
    assert wo.dtype == torch.bfloat16


def test_grad_follows_the_cast():
    model = torch.nn.Linear(4, 4).half()
    model(torch.randn(2, 4, dtype=torch.float16)).sum().backward()
    prepare_model(model, PrecisionPolicy())
    assert model.weight.grad.dtype == torch.float32
    model(torch.randn(2, 4)).sum().backward()  # accumulation works after the cast


def test_lazy_export_and_default_policy():
    assert pp.prepare_model is prepare_model
    model = torch.nn.Linear(4, 4).half()
    pp.prepare_model(model)  # no policy, nothing enabled: the default float16 policy
    assert model.weight.dtype == torch.float32


def _tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_learner_cast_with_half_gets_its_rope_frequencies_back_in_float32(dtype, caplog):
    """model.half() rounds the RoPE frequencies vLLM keeps in float32; prepare_model (run by
    enable() and the callback on every learner) recomputes them exactly, and says so."""
    model = _tiny_llama()
    reference = model.model.rotary_emb.inv_freq.clone()
    model.to(getattr(torch, dtype))
    assert model.model.rotary_emb.inv_freq.dtype == getattr(torch, dtype)
    (finding,) = [
        f for f in check_model(model, PrecisionPolicy(dtype=dtype)) if "buffers" in f.details
    ]
    # inv_freq and original_inv_freq: head_dim / 2 = 4 values each
    assert finding.status == "change" and finding.details["buffers"] == {dtype: 8}
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        prepare_model(model, PrecisionPolicy(dtype=dtype))
    rotary = model.model.rotary_emb
    assert rotary.inv_freq.dtype == rotary.original_inv_freq.dtype == torch.float32
    assert torch.equal(rotary.inv_freq, reference) and torch.equal(
        rotary.original_inv_freq, reference
    )
    assert "model.rotary_emb.inv_freq (recomputed)" in caplog.text
    assert not [
        f for f in check_model(model, PrecisionPolicy(dtype=dtype)) if "buffers" in f.details
    ]


def test_float32_buffers_off_leaves_the_rounded_frequencies_alone():
    model = _tiny_llama().half()
    policy = PrecisionPolicy(float32_buffers=False)
    assert all("buffers" not in f.details for f in check_model(model, policy))
    prepare_model(model, policy)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float16


def test_strict_mode_restores_buffers_only_where_parameters_need_no_cast():
    """Under strictness='error' a parameter cast is refused before anything changes; the
    buffers, which no setting of the user's asked to round, are restored when nothing is
    refused."""
    model = _tiny_llama().half()
    with pytest.raises(PrecisionMismatchError):
        prepare_model(model, PrecisionPolicy(strictness="error"))
    assert model.model.rotary_emb.inv_freq.dtype == torch.float16  # nothing changed
    frozen = _tiny_llama().requires_grad_(False).half()  # frozen fp16 weights are fine
    prepare_model(frozen, PrecisionPolicy(strictness="error"))
    assert frozen.model.rotary_emb.inv_freq.dtype == torch.float32
