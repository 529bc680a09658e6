"""The buffers vLLM keeps in float32 stay float32 in a float16/bfloat16 copy, in every family the
probe supports and every scaled RoPE variant transformers has; cos/sin are computed from them in
float32, scaled, then cast, as vLLM builds its cos/sin cache."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers

from precision_plugin._core.buffers import (
    buffer_dtypes,
    cast_model,
    float32_buffers,
    keep_float32_buffers,
    keeps_float32,
)
from tests.integration.test_probe_families import FAMILIES
from tests.rope_variants import SCALED, rope_parameters

#: Positions far beyond the checkpoints' contexts: where a rounded frequency shows most.
POSITIONS = torch.arange(0, 4096).unsqueeze(0)


def _small(name: str, **extra) -> transformers.PreTrainedModel:
    config = getattr(transformers, name)(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _family(family: str) -> transformers.PreTrainedModel:
    name, extra = FAMILIES[family]
    return _small(name, **extra)


def _scaled(rope_type: str) -> transformers.PreTrainedModel:
    return _small("LlamaConfig", rope_parameters=rope_parameters(rope_type))


def _rotary(model: torch.nn.Module) -> torch.nn.Module:
    (found,) = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    return found


def _cos_sin(rotary: torch.nn.Module, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return rotary(torch.zeros(1, dtype=dtype), POSITIONS)


def _expected(
    inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype, fn=torch.cos
) -> torch.Tensor:
    """vLLM's cos (``fn=torch.sin``: sin): positions times float32 frequencies, cos in float32,
    times the attention scaling in float32, then cast to the model dtype
    (rotary_embedding/base.py lines 94-103)."""
    freqs = POSITIONS[0].float()[:, None] * inv_freq.float()[None, :]
    return (fn(torch.cat((freqs, freqs), dim=-1)) * scaling).to(dtype)[None]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_probe_family_keeps_its_rope_frequencies_float32(family, dtype):
    model = _family(family)
    reference = dict(model.named_buffers())
    copy_ = cast_model(copy.deepcopy(model), dtype)
    assert {p.dtype for p in copy_.parameters()} == {dtype}
    rope = {n: b for n, b in copy_.named_buffers() if keeps_float32(n)}
    assert set(rope) >= {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"}
    for name, buf in copy_.named_buffers():
        if keeps_float32(name):
            assert buf.dtype == torch.float32 and torch.equal(buf, reference[name]), name
        else:  # Gemma's embed_scale: vLLM casts its normalizer to the model dtype too
            assert buf.dtype == dtype, name
    rotary = _rotary(copy_)
    cos, sin = _cos_sin(rotary, dtype)
    inv32 = reference["model.rotary_emb.inv_freq"]
    # cos/sin in the model dtype; OLMo-2 keeps them float32 and rotates q/k in float32
    assert cos.dtype == (torch.float32 if family == "olmo2" else dtype)
    assert torch.equal(cos, _expected(inv32, rotary.attention_scaling, cos.dtype))
    assert torch.equal(sin, _expected(inv32, rotary.attention_scaling, cos.dtype, torch.sin))
    # A plain .to(dtype) rounds the frequencies: far positions then get other angles.
    plain = _rotary(copy.deepcopy(model).to(dtype))
    assert plain.inv_freq.dtype == dtype
    assert not torch.equal(_cos_sin(plain, dtype)[0], cos)


@pytest.mark.parametrize("rope_type", sorted(SCALED))
def test_scaled_rope_variants_compute_cos_sin_as_the_float32_model_then_cast(rope_type):
    model = _scaled(rope_type)
    fp16 = cast_model(copy.deepcopy(model), torch.float16)
    rot32, rot16 = _rotary(model), _rotary(fp16)
    assert rot32.rope_type == rope_type
    # Past both contexts: dynamic recomputes inv_freq, longrope copies its long factors in.
    cos32, sin32 = _cos_sin(rot32, torch.float32)
    cos16, sin16 = _cos_sin(rot16, torch.float16)
    assert torch.equal(cos16, cos32.to(torch.float16)) and torch.equal(
        sin16, sin32.to(torch.float16)
    )
    assert rot16.inv_freq.dtype == rot16.original_inv_freq.dtype == torch.float32
    assert torch.equal(cos16, _expected(rot32.inv_freq, rot32.attention_scaling, torch.float16))
    # Back within the context: dynamic resets to original_inv_freq, still float32 and exact.
    short = POSITIONS[:, :100]
    with torch.no_grad():
        cos16 = rot16(torch.zeros(1, dtype=torch.float16), short)[0]
        cos32 = rot32(torch.zeros(1), short)[0]
    assert rot16.inv_freq.dtype == torch.float32 and torch.equal(cos16, cos32.to(torch.float16))


def test_attention_scaling_is_vllms_and_multiplies_float32_cos_sin():
    """yarn: vLLM's ``yarn_get_mscale(4) = 0.1 ln 4 + 1``; longrope: vLLM's
    ``sqrt(1 + ln(512 / 128) / ln 128)`` (phi3_long_rope_scaled_rope.py lines 66-73)."""
    yarn, longrope = _rotary(_scaled("yarn")), _rotary(_scaled("longrope"))
    assert yarn.attention_scaling == pytest.approx(0.1 * math.log(4.0) + 1.0, rel=1e-15)
    assert longrope.attention_scaling == pytest.approx(
        math.sqrt(1 + math.log(512 / 128) / math.log(128)), rel=1e-15
    )
    for rotary in (yarn, longrope):
        fp16 = cast_model(copy.deepcopy(rotary), torch.float16)
        cos = _cos_sin(fp16, torch.float16)[0]
        inv_freq = fp16.inv_freq  # longrope: its long factors now (float32, checked above)
        # scaling applied to the float32 cos before the cast, not to the float16 one after
        assert torch.equal(cos, _expected(inv_freq, rotary.attention_scaling, torch.float16))
        after = _expected(inv_freq, 1.0, torch.float16) * rotary.attention_scaling
        assert not torch.equal(cos, after.to(torch.float16))


@pytest.mark.parametrize(
    "build",
    [
        lambda: _family("llama"),
        lambda: _scaled("llama3"),
        lambda: _scaled("yarn"),
        lambda: _scaled("longrope"),
        lambda: _small("Gemma3TextConfig", head_dim=16, sliding_window=16),
    ],
    ids=["llama", "llama3", "yarn", "longrope", "gemma3-layer-types"],
)
def test_frequencies_never_float32_are_recomputed_exactly(build):
    """A learner cast wholesale (DeepSpeed's .half(), ZeRO-3's zero.Init) has no float32 copy
    to restore from: the module's own RoPE function recomputes them."""
    model = build()
    reference = {n: b for n, b in model.named_buffers() if keeps_float32(n)}
    half = copy.deepcopy(model).half()
    assert all(b.dtype == torch.float16 for n, b in half.named_buffers() if keeps_float32(n))
    assert keep_float32_buffers(half) == dict.fromkeys(reference, "recomputed")
    for name, buf in half.named_buffers():
        if keeps_float32(name):
            assert buf.dtype == torch.float32 and torch.equal(buf, reference[name]), name
    assert keep_float32_buffers(half) == {}  # already float32: nothing to do


def test_a_dynamic_rope_that_grew_is_recomputed_at_its_original_length():
    """A dynamic-NTK learner that already ran past its context holds the grown frequencies; cast
    wholesale, they are recomputed at the original length, and the module is told so: its next
    long forward grows them again in float32, exactly as the float32 model's did."""
    model = _scaled("dynamic")
    rot32 = _rotary(model)
    cos32, sin32 = _cos_sin(rot32, torch.float32)  # grows inv_freq for 4,096 positions
    assert int(rot32.max_seq_len_cached) == 4096
    half = copy.deepcopy(model).half()
    assert keep_float32_buffers(half) == {
        "model.rotary_emb.inv_freq": "recomputed",
        "model.rotary_emb.original_inv_freq": "recomputed",
    }
    rot16 = _rotary(half)
    assert rot16.max_seq_len_cached == rot16.original_max_seq_len == 512
    assert torch.equal(rot16.inv_freq, rot32.original_inv_freq)
    cos16, sin16 = _cos_sin(rot16, torch.float16)
    assert torch.equal(cos16, cos32.to(torch.float16)) and torch.equal(
        sin16, sin32.to(torch.float16)
    )


def test_cast_model_keeps_the_float32_values_it_cannot_recompute():
    """The MoE routing bias and a custom module's frequencies (no RoPE function to recompute
    them with) come back bit-exact from the values saved before the cast, not widened."""
    model = _small(
        "DeepseekV3Config", n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=None, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    )  # fmt: skip
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    values = torch.tensor([5.001, 5.002, 5.003, 5.004])
    with torch.no_grad():
        dict(model.named_buffers())[bias].copy_(values)
    custom = torch.nn.Module()
    custom.register_buffer("inv_freq", torch.tensor([1.0, 0.1, 0.01, 1e-3]) / 3)
    model.custom = custom
    reference = custom.inv_freq.clone()
    for dtype in (torch.bfloat16, torch.float16):
        cast = cast_model(copy.deepcopy(model), dtype)
        buffers = dict(cast.named_buffers())
        assert buffers[bias].dtype == torch.float32 and torch.equal(buffers[bias], values)
        assert torch.equal(buffers["custom.inv_freq"], reference)
        assert not torch.equal(reference.to(dtype).float(), reference)  # widening would differ


def test_saved_values_are_restored_exactly_and_the_moe_routing_bias_too():
    model = _small(
        "DeepseekV3Config", n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=None, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    )  # fmt: skip
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    with torch.no_grad():
        dict(model.named_buffers())[bias].copy_(torch.tensor([5.001, 5.002, 5.003, 5.004]))
    saved = float32_buffers(model)
    assert set(saved) == {bias, "model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"}
    half = copy.deepcopy(model).bfloat16()
    assert dict(half.named_buffers())[bias].unique().numel() == 1  # bf16 merged the four
    done = keep_float32_buffers(half, saved)
    assert done == dict.fromkeys(saved, "saved")
    for name, value in saved.items():
        assert torch.equal(dict(half.named_buffers())[name], value)
    assert buffer_dtypes(half) == {"float32": 4 + 2 * 4}


def test_plain_cast_when_asked_and_float32_copies_untouched():
    model = _family("llama")
    plain = cast_model(copy.deepcopy(model), "float16", float32=False)
    assert buffer_dtypes(plain) == {"float16": 16}
    same = cast_model(copy.deepcopy(model), "float32")
    assert all(torch.equal(a, b) for a, b in zip(same.buffers(), model.buffers(), strict=True))
