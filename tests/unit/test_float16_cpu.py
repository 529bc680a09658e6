"""float16 linear layers on CPU (``precision_plugin._core.scoring.float16_cpu``): the product is the
float32 product of the exactly widened float16 operands, rounded once to float16, whatever the
number of rows; only plain float16 ``nn.Linear`` layers change; gradients and other dtypes run
PyTorch's own kernel."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from precision_plugin._core.scoring import float16_cpu, packed_cpu, trainer_precision
from precision_plugin._core.scoring.float16_cpu import (
    MIN_ROWS,
    Float16Linear,
    float16_autocast_linears,
    widen_float16_linears,
)


def _operands(rows: int, k: int = 96, n: int = 40, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).half()
    w = (torch.randn(n, k, generator=g) / k**0.5).half()
    b = torch.randn(n, generator=g).half()
    return x, w, b


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The contract, computed independently: float32 product of the float16 values, one
    rounding. ``MIN_ROWS`` rows or more, so the float32 GEMM takes its row-invariant path."""
    assert x.shape[0] >= MIN_ROWS
    return F.linear(x.float(), w.float(), None if b is None else b.float()).half()


def _layer(w: torch.Tensor, b: torch.Tensor | None) -> torch.nn.Linear:
    layer = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None).half()
    with torch.no_grad():
        layer.weight.copy_(w)
        if b is not None:
            layer.bias.copy_(b)
    return layer


@pytest.mark.parametrize("bias", [True, False])
def test_a_widened_layer_computes_the_float32_product_rounded_once(bias: bool) -> None:
    x, w, b = _operands(48)
    b = b if bias else None
    layer = _layer(w, b)
    assert widen_float16_linears(layer) == 1
    assert type(layer) is Float16Linear
    with torch.inference_mode():
        out = layer(x)
    assert out.dtype == torch.float16
    assert torch.equal(out, _reference(x, w, b))


@pytest.mark.kernel_sensitive
def test_a_row_gets_the_same_value_alone_in_a_batch_and_in_any_chunk() -> None:
    # SmolLM2's width: there the float32 GEMM's few-row path rounds differently (without the
    # padding to MIN_ROWS, rows 1-3 alone differed from the batch on an AVX512 CPU).
    x, w, b = _operands(64, k=576, n=512)
    layer = _layer(w, b)
    widen_float16_linears(layer)
    with torch.inference_mode():
        full = layer(x)
        for rows in (1, 2, 3, 5, 7, 9, 11, 13, MIN_ROWS - 1, MIN_ROWS, 33):
            assert torch.equal(layer(x[:rows]), full[:rows]), rows
        # Leading dimensions ([batch, positions, features]) are kept.
        assert torch.equal(layer(x.view(4, 16, -1)), full.view(4, 16, -1))


def test_only_plain_float16_linear_layers_on_cpu_change() -> None:
    class LoraLike(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), LoraLike(8, 8), torch.nn.LayerNorm(8)
    )
    assert widen_float16_linears(copy.deepcopy(model)) == 0  # float32: nothing to do
    half = model.half()
    keys = list(half.state_dict())
    assert widen_float16_linears(half) == 2
    assert [type(m).__name__ for m in half] == [
        "Float16Linear", "Float16Linear", "LoraLike", "LayerNorm"
    ]  # fmt: skip
    assert list(half.state_dict()) == keys


def test_a_weight_changed_in_place_is_widened_again() -> None:
    x, w, b = _operands(32)
    layer = _layer(w, b)
    widen_float16_linears(layer)
    with torch.inference_mode():
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    with torch.inference_mode():
        after = layer(x)
    assert not torch.equal(before, after)
    assert torch.equal(after, _reference(x, w * 2, b))


def test_gradients_and_other_dtypes_run_pytorchs_own_kernel() -> None:
    x, w, b = _operands(32)
    layer = _layer(w, b)
    native = copy.deepcopy(layer)
    widen_float16_linears(layer)
    # Recording gradients: nn.Linear's own forward, so gradients reach the weight.
    assert torch.equal(layer(x), native(x))
    layer(x).float().sum().backward()
    assert layer.weight.grad is not None
    # A float32 input (a layer the caller widened by hand) also runs nn.Linear's own.
    layer32 = _layer(w, b).float()
    layer32.__class__ = Float16Linear
    with torch.inference_mode():
        assert torch.equal(layer32(x.float()), F.linear(x.float(), w.float(), b.float()))


def test_float16_autocast_rounds_operands_then_multiplies_in_float32() -> None:
    x, w, b = _operands(40)
    x32 = x.float() + 1e-3  # not float16 values: autocast rounds them
    w32, b32 = w.float() * 1.001, b.float()
    expected = _reference(x32.half(), w32.half(), b32.half())
    with torch.inference_mode(), trainer_precision("float16", "cpu"):
        out = F.linear(x32, w32, b32)
    assert out.dtype == torch.float16
    assert torch.equal(out, expected)
    with torch.inference_mode(), trainer_precision("float16", "cpu"):
        assert torch.equal(F.linear(x32[:3], w32, b32), expected[:3])


def test_the_autocast_mode_leaves_native_bfloat16_and_recorded_gradients_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x, w, _ = _operands(24)
    x32, w32 = x.float(), w.float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native_bf16 = F.linear(x32, w32.detach())
        native_fp16_grad = None
    monkeypatch.setattr(float16_cpu, "widened_dtypes", lambda: (torch.float16,))  # AVX512
    with float16_autocast_linears(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(F.linear(x32, w32.detach()), native_bf16)
    with torch.autocast("cpu", dtype=torch.float16):
        native_fp16_grad = F.linear(x32, w32)
    with float16_autocast_linears(), torch.autocast("cpu", dtype=torch.float16):
        recorded = F.linear(x32, w32)
    assert recorded.requires_grad
    assert torch.equal(recorded, native_fp16_grad)


# -- bfloat16 on a CPU that cannot pack it (AVX2) ----------------------------------------------


@pytest.fixture
def widened_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 products widened, as on a CPU where oneDNN cannot pack bfloat16, on any CPU."""
    monkeypatch.setattr(float16_cpu, "widened_dtypes", lambda: (torch.float16, torch.bfloat16))


def _bfloat16_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Independently: the float32 product of the bfloat16 values, rounded once to bfloat16."""
    assert x.shape[0] >= MIN_ROWS
    bias = None if b is None else b.bfloat16().float()
    return F.linear(x.bfloat16().float(), w.bfloat16().float(), bias).bfloat16()


@pytest.mark.parametrize("bias", [True, False])
def test_a_widened_bfloat16_layer_computes_the_float32_product_rounded_once(
    widened_bfloat16: None, bias: bool
) -> None:
    from precision_plugin._core.scoring.packed_cpu import trainer_kernels

    x, w, b = (t.float().bfloat16() for t in _operands(48))
    b = b if bias else None
    layer = _layer(w, b).bfloat16()
    assert widen_float16_linears(layer) == 1
    assert type(layer) is Float16Linear
    expected = _bfloat16_reference(x, w, b)
    with torch.inference_mode():
        out = layer(x)  # the kept (packed where oneDNN can) widened weight
        with trainer_kernels():
            scored = layer(x)  # widened at the call, as the trainer's autocast computes it
    assert out.dtype == scored.dtype == torch.bfloat16
    assert torch.equal(out, expected)
    assert torch.equal(scored, expected)


def test_bfloat16_autocast_widens_the_products_where_bfloat16_is_widened(
    widened_bfloat16: None,
) -> None:
    x, w, b = _operands(40)
    x32 = x.float() + 1e-3  # not bfloat16 values: autocast rounds them
    w32, b32 = w.float() * 1.001, b.float()
    expected = _bfloat16_reference(x32, w32, b32)
    with torch.inference_mode(), trainer_precision("bfloat16", "cpu"):
        out = F.linear(x32, w32, b32)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)


@pytest.mark.kernel_sensitive
def test_widened_bfloat16_products_agree_with_pytorchs_own_kernel() -> None:
    """The same contract as PyTorch's bfloat16 GEMM: of the 98,304 outputs of 64 rows through a
    SmolLM2-shaped layer, at most 1 % differ (0.01 % measured on an AVX2 CPU: a summation order
    apart; a product rounded to float16, or accumulated in bfloat16, differs in most)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 576, generator=g).bfloat16()
    w = (torch.randn(1536, 576, generator=g) * 0.05).bfloat16()
    native = F.linear(x, w)
    assert native.numel() == 98_304
    widened = F.linear(x.float(), w.float()).bfloat16()
    assert (native != widened).float().mean().item() <= 1e-2


# -- attention ---------------------------------------------------------------------------------


def _qkv(length: int = 37, seed: int = 3) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 4, n, 16, generator=g).half() for n in (5, length, length))


def _flash_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float) -> torch.Tensor:  # fmt: skip
    """Independently, in float64: softmax statistics exact, only the unnormalised
    probabilities rounded to float16 (what a flash kernel rounds)."""
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p.half().double() @ v.double()) / p.sum(-1, keepdim=True)


def test_sdpa_float16_rounds_the_probabilities_as_a_flash_kernel_does() -> None:
    from precision_plugin._core.scoring.float16_cpu import sdpa_float16

    q, k, v = _qkv()
    mask = torch.ones(2, 1, 5, k.shape[2], dtype=torch.bool)
    mask[0, :, :, :3] = False  # left padding of row 0
    out = sdpa_float16(q, k, v, attn_mask=mask, scale=0.25)
    reference = _flash_reference(q, k, v, mask, 0.25)
    unrounded = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=mask, scale=0.25
    )
    assert out.dtype == torch.float16
    # Within one float16 rounding of the output (plus float32's own error) of the reference...
    ulp = torch.finfo(torch.float16).eps * reference.abs().clamp(min=2**-14)
    assert ((out.double() - reference).abs() <= ulp).all()
    # ...and the rounded probabilities are visible: 5 x 37 keys per row, 160 output values, the
    # float16 output differs from unrounded-probability attention rounded once in some of them.
    assert (out != unrounded.half()).any()


def test_sdpa_float16_matches_the_sdpa_contract_for_gqa_causal_and_empty_rows() -> None:
    from precision_plugin._core.scoring.float16_cpu import sdpa_float16

    q, k, v = _qkv(length=5)
    heads = torch.randn(2, 2, 5, 16, generator=torch.Generator().manual_seed(2)).half()
    repeated = (heads.repeat_interleave(2, 1),) * 2  # query head h reads key head h // 2
    everything = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    # A mask per query head reaches its own head inside its key head's group.
    per_head = torch.rand(2, 4, 5, 5, generator=torch.Generator().manual_seed(1)) > 0.3
    per_head[..., 0] = True
    for mask, expanded in ((None, everything), (per_head, per_head)):
        grouped = sdpa_float16(q, heads, heads, mask, enable_gqa=True)
        # The heads of a group are rows of one product: each query head against its own key
        # head, within one float16 rounding of the independent reference on repeated heads
        # (160 values; another head order is off by far more).
        reference = _flash_reference(q, *repeated, expanded, 0.25)
        ulp = torch.finfo(torch.float16).eps * reference.abs().clamp(min=2**-14)
        assert ((grouped.double() - reference).abs() <= ulp).all()
    grouped = sdpa_float16(q, heads, heads, enable_gqa=True)
    # A widened model's float32 cache already holds float16 values: used as is, same result.
    assert torch.equal(
        sdpa_float16(q, heads.float(), heads.float(), enable_gqa=True, exact_float32=True), grouped
    )
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    assert torch.equal(sdpa_float16(q, k, v, is_causal=True), sdpa_float16(q, k, v, causal))
    additive = torch.zeros(5, 5).masked_fill(~causal, float("-inf"))
    assert torch.equal(sdpa_float16(q, k, v, additive), sdpa_float16(q, k, v, causal))
    empty = torch.zeros(2, 1, 5, 5, dtype=torch.bool)
    empty[1] = True
    out = sdpa_float16(q, k, v, empty)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[1], sdpa_float16(q, k, v)[1])
    with pytest.raises(ValueError, match=r"dropout_p=0\.1"):
        sdpa_float16(q, k, v, dropout_p=0.1)


def test_sdpa_float16_in_row_blocks_is_the_same_bit_for_bit(monkeypatch) -> None:
    """A long query runs in blocks of rows (CHUNK_SCORES); each row's arithmetic is its own,
    so the blocks give the one-block result exactly, for every kind of mask (50 query rows in
    blocks of MIN_ROWS: 16, 16 and 18, a last short block joined to the one before)."""
    from precision_plugin._core.scoring import float16_cpu

    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 6, 50, 16, generator=g).half()
    k, v = (torch.randn(2, 2, 50, 16, generator=g).half() for _ in range(2))
    causal = torch.ones(50, 50, dtype=torch.bool).tril()
    per_head = torch.rand(2, 6, 50, 50, generator=g) > 0.3
    per_head[..., 0] = True
    additive = torch.randn(2, 1, 50, 50, generator=g).masked_fill(~causal, float("-inf"))
    cases = [
        {"is_causal": True},
        {"attn_mask": causal},
        {"attn_mask": causal[None, None].expand(2, 1, 50, 50)},
        {"attn_mask": per_head},
        {"attn_mask": additive},
        {"attn_mask": causal[-1:]},  # one mask row shared by every query row
    ]
    calls: list[int] = []
    attend = float16_cpu._attend

    def counted(q: torch.Tensor, *rest: object) -> torch.Tensor:
        calls.append(q.shape[-2])
        return attend(q, *rest)

    monkeypatch.setattr(float16_cpu, "_attend", counted)
    for gqa in (True, False):
        keys = (k, v) if gqa else (k.repeat_interleave(3, 1), v.repeat_interleave(3, 1))
        for dtype in (None, torch.bfloat16):
            for case in cases:
                monkeypatch.setattr(float16_cpu, "CHUNK_SCORES", 1 << 30)
                calls.clear()
                whole = float16_cpu.sdpa_float16(q, *keys, **case, enable_gqa=gqa, dtype=dtype)
                assert calls == [50]
                monkeypatch.setattr(float16_cpu, "CHUNK_SCORES", 1)
                calls.clear()
                blocks = float16_cpu.sdpa_float16(q, *keys, **case, enable_gqa=gqa, dtype=dtype)
                assert calls == [MIN_ROWS, MIN_ROWS, 50 - 2 * MIN_ROWS]
                assert torch.equal(blocks, whole), (gqa, dtype, case.keys())


def test_float16_attention_runs_sdpa_float16_inside_transformers_sdpa() -> None:
    from precision_plugin._core.scoring.float16_cpu import float16_attention, sdpa_float16

    class Attention(torch.nn.Module):
        num_key_value_groups = 1
        is_causal = False

    q, k, v = _qkv()
    mask = torch.ones(2, 1, 5, k.shape[2], dtype=torch.bool)
    mask[0, :, :, :3] = False
    out, _ = float16_attention(Attention(), q, k, v, mask, scaling=0.25)
    # transformers returns [batch, positions, heads, head_dim].
    assert torch.equal(out, sdpa_float16(q, k, v, mask, scale=0.25).transpose(1, 2))


def test_float16_autocast_computes_sdpa_as_sdpa_float16() -> None:
    from precision_plugin._core.scoring.float16_cpu import sdpa_float16

    q, k, v = (t.float() + 1e-3 for t in _qkv())
    expected = sdpa_float16(q, k, v)
    with torch.inference_mode(), trainer_precision("float16", "cpu"):
        out = F.scaled_dot_product_attention(q, k, v)
        keyword = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0)
    assert out.dtype == torch.float16
    assert torch.equal(out, expected)
    assert torch.equal(keyword, expected)


def test_bfloat16_attention_rounds_in_bfloat16_on_both_sides() -> None:
    from precision_plugin._core.scoring.float16_cpu import sdpa_float16

    q, k, v = (t.float() for t in _qkv())
    q, k, v = (t.bfloat16() for t in (q, k, v))
    mask = torch.ones(2, 1, 5, k.shape[2], dtype=torch.bool)
    mask[0, :, :, :3] = False
    out = sdpa_float16(q, k, v, mask, scale=0.25, dtype=torch.bfloat16)
    s = (q.double() @ k.double().transpose(-2, -1)) * 0.25
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    reference = (p.bfloat16().double() @ v.double()) / p.sum(-1, keepdim=True)
    assert out.dtype == torch.bfloat16
    ulp = torch.finfo(torch.bfloat16).eps * reference.abs().clamp(min=2**-126)
    assert ((out.double() - reference).abs() <= ulp).all()  # 160 values
    # The trainer's bfloat16 autocast computes the same attention.
    with torch.inference_mode(), trainer_precision("bfloat16", "cpu"):
        trained = F.scaled_dot_product_attention(q, k, v, mask, scale=0.25)
    assert torch.equal(trained, out)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        sdpa_float16(q, k, v, dtype=torch.float32)


def _tiny(dtype: torch.dtype, attention: str = "sdpa") -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         pad_token_id=0, attn_implementation=attention)  # fmt: skip
    return LlamaForCausalLM(config).eval().to(dtype)


def test_only_a_float16_or_bfloat16_sdpa_model_switches_attention() -> None:
    from precision_plugin._core.scoring.float16_cpu import (
        ATTENTION,
        widen_float16,
        widen_float16_attention,
        widened_dtypes,
    )

    assert not widen_float16_attention(_tiny(torch.float32))
    assert not widen_float16_attention(_tiny(torch.float16, "eager"))
    bfloat16 = widen_float16(_tiny(torch.bfloat16))
    assert bfloat16.config._attn_implementation == ATTENTION
    # Its products are PyTorch's bfloat16 ones where oneDNN packs bfloat16 (AVX512), widened
    # where it cannot (AVX2).
    native = packed_cpu.packs(torch.bfloat16)
    expected = torch.nn.Linear if native else Float16Linear
    assert type(bfloat16.model.layers[0].self_attn.q_proj) is expected
    assert (torch.bfloat16 in widened_dtypes()) is not native
    model = widen_float16(_tiny(torch.float16))
    assert model.config._attn_implementation == ATTENTION
    assert type(model.model.layers[0].self_attn.q_proj) is Float16Linear


def test_a_widened_models_cache_keeps_float16_values_in_float32_with_the_same_logits() -> None:
    from transformers.cache_utils import DynamicCache

    from precision_plugin._core.scoring.float16_cpu import widen_float16
    from precision_plugin._core.scoring.kvcache import preallocated_cache

    model = widen_float16(_tiny(torch.float16))
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])

    def decode(cache: object) -> list[torch.Tensor]:
        name = "cache" if "cache" in model.forward.__code__.co_varnames else "past_key_values"
        step_mask, position = mask, (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=step_mask, position_ids=position,
                    use_cache=True, **{name: cache})  # fmt: skip
        logits = [out.logits[:, -1]]
        position = position[:, -1:]
        for t in range(4):
            step_mask = torch.cat([step_mask, torch.ones_like(step_mask[:, :1])], dim=-1)
            position = position + 1
            out = model(input_ids=torch.tensor([[13 + t], [20 + t]]), attention_mask=step_mask,
                        position_ids=position, use_cache=True, **{name: cache})  # fmt: skip
            logits.append(out.logits[:, -1])
        return logits

    cache = preallocated_cache(model, 16)
    with torch.inference_mode():
        ours = decode(cache)
        plain = decode(DynamicCache(config=model.config))
    assert cache.layers[0].keys.dtype == torch.float32
    assert all(torch.equal(a, b) for a, b in zip(ours, plain, strict=True))
    assert ours[0].dtype == torch.float16


def test_key_tiles_no_row_of_a_block_sees_are_skipped_bit_for_bit(monkeypatch) -> None:
    """A causal prefill's blocks multiply and run their elementwise steps only over the tiles of
    KEY_TILE keys some row may see; a skipped tile would have added an exact 0 and every tile
    has the same shape, so the output is the same bit for bit as over every key, for every kind
    of mask (200 query rows in blocks of MIN_ROWS, float16 and bfloat16, with and without
    GQA)."""
    from precision_plugin._core.scoring import float16_cpu

    assert float16_cpu._keys_seen(None, 200) == 200
    causal = torch.ones(200, 200, dtype=torch.bool).tril()
    assert float16_cpu._keys_seen(causal[:16], 200) == 64
    assert float16_cpu._keys_seen(causal[100:116], 200) == 128
    assert float16_cpu._keys_seen(causal[180:], 200) == 200
    additive = torch.zeros(200, 200).masked_fill(~causal, float("-inf"))
    assert float16_cpu._keys_seen(additive[64:80], 200) == 128
    assert float16_cpu._keys_seen(causal[:40, :50], 50) == 50  # no fewer than one tile
    assert float16_cpu.KEY_TILE == 64

    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 6, 200, 16, generator=g).half()
    k, v = (torch.randn(2, 2, 200, 16, generator=g).half() for _ in range(2))
    padded = causal[None, None].repeat(2, 1, 1, 1)
    padded[1, ..., :30] = False  # the second row left-padded by 30 tokens
    padded[1, 0, :30, 0] = True  # its pad rows see one key, as transformers' masks do
    cases = [
        {"is_causal": True},
        {"attn_mask": causal},
        {"attn_mask": padded},
        {"attn_mask": additive[None, None]},
        {"attn_mask": torch.rand(2, 6, 200, 200, generator=g) > 0.3},  # sees every key
    ]
    seen: list[int] = []
    keys_seen = float16_cpu._keys_seen

    def recorded(mask: torch.Tensor, length: int) -> int:
        seen.append(keys_seen(mask, length))
        return seen[-1]

    monkeypatch.setattr(float16_cpu, "_keys_seen", recorded)
    monkeypatch.setattr(float16_cpu, "CHUNK_SCORES", 1)
    for gqa in (True, False):
        keys = (k, v) if gqa else (k.repeat_interleave(3, 1), v.repeat_interleave(3, 1))
        for dtype in (None, torch.bfloat16):
            for case in cases:
                monkeypatch.setattr(float16_cpu, "_keys_seen", lambda mask, length: length)
                every = float16_cpu.sdpa_float16(q, *keys, **case, enable_gqa=gqa, dtype=dtype)
                monkeypatch.setattr(float16_cpu, "_keys_seen", recorded)
                seen.clear()
                fewer = float16_cpu.sdpa_float16(q, *keys, **case, enable_gqa=gqa, dtype=dtype)
                assert torch.equal(fewer, every), (gqa, dtype, list(case))
                causal_case = (
                    "is_causal" in case or case.get("attn_mask") is not cases[-1]["attn_mask"]
                )
                assert (min(seen) == 64) == causal_case, (list(case), seen)
    # The tiles add up to the attention: within the float16 roundings of the independent
    # float64 reference (200 query rows in blocks of MIN_ROWS, 200 keys in four tiles, 9,600
    # values): one of the output, one of each probability (a value near 0 is a sum that
    # cancels, so a probability's rounding is measured against the row's mean |value|).
    keys, values = (k.repeat_interleave(3, 1).double(), v.repeat_interleave(3, 1).double())
    out = float16_cpu.sdpa_float16(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1),
                                   is_causal=True)  # fmt: skip
    reference = _flash_reference(q, keys, values, causal, 0.25)
    s = (q.double() @ keys.transpose(-2, -1) * 0.25).masked_fill(~causal, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    mean_size = (p @ values.abs()) / p.sum(-1, keepdim=True)
    bound = torch.finfo(torch.float16).eps * (reference.abs() + mean_size)
    assert ((out.double() - reference).abs() <= bound).all()
