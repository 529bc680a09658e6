"""Pins for lines of the sampling path a mutation pass found no test held: vLLM's sampling
settings (``precision_plugin._core.sampling``), the seeded CPU draw (``scoring.multinomial_cpu``), the
preallocated KV cache (``scoring.kvcache``) and the attribution variants
(``probe.attribution.variants``). Each expected value is worked out by hand or by torch's own
reference, never by the function under test."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from precision_plugin._core.scoring import multinomial_cpu
from precision_plugin._core.scoring.kvcache import (
    PreallocatedLayer,
    decode_buffers,
    preallocated_cache,
)
from precision_plugin._core.scoring.multinomial_cpu import Multinomial

needs_layers = pytest.mark.skipif(PreallocatedLayer is None, reason="transformers < 4.56")


# --- multinomial_cpu -------------------------------------------------------------------------


def test_a_float32_tie_of_ratios_goes_to_the_first_index(monkeypatch) -> None:
    """Catches a candidate filter ``bound > best`` for ``bound >= best * (1 - _ROOM)``: two
    uniforms 1e-9 apart give the same float32 q, so torch's float32 ratios tie and argmax takes
    index 0, whose bound is only equal to the best exact ratio, not above it."""
    base = 2.0**-27
    u = np.array([base * (1 + 1e-9), base])
    p = np.array([0.5, 0.5], dtype=np.float32)
    q = torch.tensor([-math.log1p(-x) for x in u.tolist()], dtype=torch.float64).float()
    ratios = torch.from_numpy(p) / q
    assert ratios[0] == ratios[1]  # the tie the example is built on
    expected = int(torch.argmax(ratios))  # torch: the first of equal maxima
    assert expected == 0
    monkeypatch.setattr(multinomial_cpu, "_uniforms", lambda *_: u.copy())
    assert multinomial_cpu._draw(p, None, np) == expected


def test_a_torch_fallback_row_draws_after_the_fast_rows_state() -> None:
    """Catches the fallback to torch.multinomial (a float64 row) skipping the write-back of the
    generator's fast-path state: torch would draw from a stale state."""
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(3, 200, generator=g).softmax(-1)
    ours, theirs = torch.Generator().manual_seed(21), torch.Generator().manual_seed(21)
    draws = Multinomial([ours])
    got, expected = [], []
    for i, probs in enumerate((rows[0], rows[1].double(), rows[2], rows[0].double())):
        got.append(int(draws.sample(probs[None], [0])[0]))
        expected.append(int(torch.multinomial(probs, 1, generator=theirs)))
        assert got == expected, i
    draws.close()
    assert torch.equal(ours.get_state(), theirs.get_state())


def test_a_row_with_a_negative_entry_raises_torchs_own_error() -> None:
    """Catches the distribution check dropping its ``min >= 0`` test: a row with a negative
    entry but positive mass must raise torch.multinomial's error, not be drawn from."""
    probs = torch.tensor([[0.6, -0.1, 0.5]])
    with pytest.raises(RuntimeError) as theirs:
        torch.multinomial(probs[0], 1, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError) as ours:
        Multinomial([torch.Generator().manual_seed(0)]).sample(probs, [0])
    assert str(ours.value) == str(theirs.value)


def test_the_fast_path_resumes_after_a_generator_is_handed_back(monkeypatch) -> None:
    """Catches ``_release`` leaving the generator marked loaded: every later draw would fall
    back to torch.multinomial (the same tokens, the slow loop the module exists to avoid)."""
    probs = torch.randn(2, 300, generator=torch.Generator().manual_seed(5)).softmax(-1)
    reference = torch.Generator().manual_seed(8)
    expected = [int(torch.multinomial(probs[i], 1, generator=reference)) for i in (0, 1)]
    ours = torch.Generator().manual_seed(8)
    draws = Multinomial([ours])
    assert int(draws.sample(probs[:1], [0])[0]) == expected[0]
    draws.close()

    def refuse(*_args, **_kwargs):
        raise AssertionError("torch.multinomial called: the fast path was not resumed")

    monkeypatch.setattr(torch, "multinomial", refuse)
    assert int(draws.sample(probs[1:], [0])[0]) == expected[1]
    draws.close()
    assert torch.equal(ours.get_state(), reference.get_state())


# --- kvcache ---------------------------------------------------------------------------------


def _kv(batch: int, positions: int, start: float) -> torch.Tensor:
    """``[batch, 1 head, positions, 2]`` with entry ``start + position`` (row r adds 100 r)."""
    t = torch.arange(positions, dtype=torch.float32)[None, None, :, None] + start
    rows = 100.0 * torch.arange(batch, dtype=torch.float32)[:, None, None, None]
    return (t + rows).expand(batch, 1, positions, 2).contiguous()


@needs_layers
def test_a_layer_filled_exactly_to_capacity_keeps_its_buffer() -> None:
    """Catches growth on ``end >= size`` instead of ``end > size``: filling the buffer exactly
    must not reallocate it."""
    layer = PreallocatedLayer(4)
    k, _ = layer.update(_kv(1, 3, 0.0), _kv(1, 3, 0.0))
    pointer = k.data_ptr()
    k, _ = layer.update(_kv(1, 1, 3.0), _kv(1, 1, 3.0))
    assert k.data_ptr() == pointer
    assert k[0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


@needs_layers
def test_a_layer_that_outgrows_its_buffer_doubles_it() -> None:
    """Catches the growth rule sizing the new buffer to ``end`` instead of ``2 * end``: after
    outgrowing 2 positions at the 3rd, 3 more must fit without another reallocation."""
    layer = PreallocatedLayer(2)
    layer.update(_kv(1, 2, 0.0), _kv(1, 2, 0.0))  # fills the 2 positions
    k, _ = layer.update(_kv(1, 1, 2.0), _kv(1, 1, 2.0))  # outgrows them: room for 2 * 3
    pointer = k.data_ptr()
    for step in range(3):
        k, _ = layer.update(_kv(1, 1, 3.0 + step), _kv(1, 1, 3.0 + step))
        assert k.data_ptr() == pointer, step
    assert k[0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@needs_layers
def test_selecting_rows_updates_the_layers_keys_and_values() -> None:
    """Catches ``batch_select_indices`` replacing the buffers but not the ``keys``/``values``
    views transformers reads (they kept the dropped rows)."""
    layer = PreallocatedLayer(8)
    layer.update(_kv(3, 2, 0.0), _kv(3, 2, 0.5))
    layer.batch_select_indices(torch.tensor([2, 0]))
    assert layer.keys[:, 0, :, 0].tolist() == [[200.0, 201.0], [0.0, 1.0]]
    assert layer.values[:, 0, :, 0].tolist() == [[200.5, 201.5], [0.5, 1.5]]


@needs_layers
def test_a_reset_layer_starts_again_at_position_zero() -> None:
    """Catches ``reset`` leaving the filled length: the next update appended after the
    forgotten positions."""
    layer = PreallocatedLayer(8)
    layer.update(_kv(1, 3, 0.0), _kv(1, 3, 0.0))
    layer.reset()
    k, v = layer.update(_kv(1, 2, 10.0), _kv(1, 2, 20.0))
    assert k[0, 0, :, 0].tolist() == [10.0, 11.0] and v[0, 0, :, 0].tolist() == [20.0, 21.0]
    assert layer.get_seq_length() == 2


@needs_layers
def test_a_cropped_layer_writes_its_next_position_after_the_crop() -> None:
    """Catches ``crop`` not shortening the filled length: the next update landed after the
    removed positions."""
    layer = PreallocatedLayer(8)
    layer.update(_kv(1, 5, 0.0), _kv(1, 5, 0.0))
    layer.crop(-2)
    k, _ = layer.update(_kv(1, 1, 30.0), _kv(1, 1, 30.0))
    assert k[0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, 30.0]


def _sliding_config() -> object:
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True,
                       sliding_window=4, layer_types=["sliding_attention", "full_attention"])  # fmt: skip


@needs_layers
def test_sliding_window_layers_are_left_as_the_model_made_them() -> None:
    """Catches ``isinstance(layer, DynamicLayer)`` for ``type(layer) is DynamicLayer``: the
    sliding-window layer (a DynamicLayer subclass) would be swapped for a full buffer."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    cache = preallocated_cache(SimpleNamespace(config=_sliding_config()), 10)
    assert [type(layer) for layer in cache.layers] == [DynamicSlidingWindowLayer, PreallocatedLayer]


@needs_layers
def test_decode_buffers_keep_the_prompt_mask_and_size_the_cache_for_every_step() -> None:
    """Catches the prompt's mask not copied into the grown mask (padding unmasked) and the
    cache sized for the prompt only instead of ``width + steps``."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    mask = torch.tensor([[0, 0, 1], [1, 1, 1]])
    full, cache = decode_buffers(SimpleNamespace(config=config), mask, 4)
    assert full.tolist() == [[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]]
    assert full.dtype == mask.dtype
    assert [layer.capacity for layer in cache.layers] == [3 + 4, 3 + 4]


# --- sampling --------------------------------------------------------------------------------

INF = math.inf


def _process(logits: list[float], prompt: list[int] | None = None, stop=None, **settings):
    """One row through a fresh LogitsProcessor (vocabulary = the row's length)."""
    from precision_plugin._core.sampling import LogitsProcessor, SamplingSettings

    row = torch.tensor([logits], dtype=torch.float32)
    processor = LogitsProcessor(SamplingSettings(**settings), [prompt or []], row.shape[1], "cpu")
    return processor.process(row, stop)[0].tolist()


def test_temperature_exactly_at_vllms_greedy_threshold_is_accepted() -> None:
    """Catches ``value <= floor`` for ``value < floor``: vLLM samples greedily only *below*
    1e-5 (``temperature < _SAMPLING_EPS``), so 1e-5 itself is a distribution to compare."""
    from precision_plugin._core.sampling import SamplingSettings
    from precision_plugin.errors import PrecisionConfigError

    assert SamplingSettings(temperature=1e-5).temperature == 1e-5
    with pytest.raises(PrecisionConfigError):
        SamplingSettings(temperature=0.99e-5)


def test_a_repetition_penalty_below_one_is_applied() -> None:
    """Catches ``repetition_penalty > 1.0`` for ``!= 1.0`` in ``penalties``: a penalty of 0.5
    (a reward for repeating) must still scale the prompt's tokens: a positive logit times
    1/0.5, a non-positive one times 0.5."""
    got = _process([2.0, 1.0, -1.0, 3.0], prompt=[1, 2], repetition_penalty=0.5)
    assert got == [2.0, 2.0, -0.5, 3.0]


def test_top_k_one_below_the_vocabulary_size_is_applied() -> None:
    """Catches ``top_k < vocab - 1`` for ``top_k < vocab`` (top-k on only when it keeps fewer
    than every token): top_k 3 of 4 tokens drops the smallest."""
    assert _process([0.0, 1.0, 2.0, 3.0], top_k=3) == [-INF, 1.0, 2.0, 3.0]


def test_min_p_keeps_a_probability_exactly_at_the_floor() -> None:
    """Catches ``probs <= floor`` for ``probs < floor``: vLLM drops tokens *below* min_p times
    the largest probability, so with min_p 1 the tied largest tokens stay."""
    assert _process([2.0, 2.0, 0.0], min_p=1.0) == [2.0, 2.0, -INF]


def test_top_p_drops_a_cumulative_mass_exactly_at_one_minus_p() -> None:
    """Catches ``cumulative < 1 - p`` for ``<=``: four equal logits have the exact cumulative
    masses 0.25, 0.5, 0.75, 1 from the low end; top_p 0.75 drops the token at 0.25 exactly."""
    got = _process([0.0, 0.0, 0.0, 0.0], top_p=0.75)
    assert sorted(got) == [-INF, 0.0, 0.0, 0.0]


def test_top_p_always_keeps_the_largest_token() -> None:
    """Catches the dropped ``drop[:, -1] = False``: with a tiny top_p, 1 - p rounds to 1 in
    float32 and the largest token's cumulative mass 1 would be dropped too (nothing left)."""
    assert _process([-INF, 7.0, -INF, -INF], top_p=1e-9) == [-INF, 7.0, -INF, -INF]


def test_processing_leaves_the_callers_float32_logits_unchanged() -> None:
    """Catches ``.to(torch.float32)`` without ``copy=True``: float32 logits would be changed in
    place (stop tokens, penalties), so the raw log-probs read from them after would be wrong."""
    from precision_plugin._core.sampling import LogitsProcessor, SamplingSettings

    logits = torch.tensor([[2.0, 1.0, -1.0, 3.0]])
    settings = SamplingSettings(repetition_penalty=2.0, frequency_penalty=0.5)
    processor = LogitsProcessor(settings, [[1, 2]], 4, "cpu")
    out = processor.process(logits, torch.tensor([3]))
    assert out.tolist() == [[2.0, 0.5, -2.0, -INF]]
    assert logits.tolist() == [[2.0, 1.0, -1.0, 3.0]]


# --- attribution variants --------------------------------------------------------------------


class _Rope(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.tensor([1 / 3, 1 / 7]))
        self.register_buffer("original_inv_freq", torch.tensor([1 / 3, 1 / 7]))
        self.register_buffer("position_ids", torch.arange(2))  # not floating point: left alone


class _RopeModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rope = _Rope()
        self.other = torch.nn.Module()
        self.other.register_buffer("inv_freq", None)


def test_round_rope_rounds_every_inv_freq_buffer_and_keeps_its_dtype() -> None:
    """Catches the buffer left in the rounding dtype (no ``.to(buf.dtype)``), ``name ==
    "inv_freq"`` for ``endswith`` (``original_inv_freq`` missed) and a ``None`` buffer not
    skipped. bfloat16(1/3) is 0.333984375 (7 fraction bits, rounded up)."""
    from precision_plugin.probe.attribution.variants import round_rope

    model = _RopeModel()
    assert round_rope(model, "bfloat16") == 2
    for name in ("inv_freq", "original_inv_freq"):
        buf = getattr(model.rope, name)
        assert buf.dtype == torch.float32, name
        assert buf.tolist() == torch.tensor([1 / 3, 1 / 7]).bfloat16().float().tolist(), name
        assert buf[0].item() == 0.333984375, name
    assert model.rope.position_ids.tolist() == [0, 1]


class _Headed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(3, 2, bias=True)
        with torch.no_grad():  # fixed values bfloat16 cannot hold exactly
            self.head.weight.copy_(torch.tensor([[0.1, 0.2, 0.3], [-0.7, 0.11, 0.13]]))
            self.head.bias.copy_(torch.tensor([0.01, -0.03]))

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


def test_head_in_float32_takes_the_masters_weights_and_casts_the_input() -> None:
    """Catches the float32 head weight or bias copied from the rounded bfloat16 model instead of
    the master, and the dropped input cast (a bfloat16 input to float32 weights)."""
    from precision_plugin.probe.attribution.variants import head_in

    master = _Headed()
    model = _Headed().to(torch.bfloat16)  # master's weights, rounded
    head_in(model, master, "float32")
    assert torch.equal(model.head.weight, master.head.weight)
    assert torch.equal(model.head.bias, master.head.bias)
    x = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.bfloat16)
    expected = x.float() @ master.head.weight.detach().T + master.head.bias.detach()
    out = model.head(x)
    assert out.dtype == torch.float32 and torch.equal(out, expected)


def test_fake_quantize_rounds_to_the_format_and_saturates_at_its_largest_value() -> None:
    """Catches e5m2 for e4m3 (e4m3's 3 fraction bits round 0.28 = 1.12 * 2**-2 to 1.125 * 2**-2
    = 0.28125, e5m2's 2 bits to 0.25; e4m3's largest value is 448) and the dropped clamp:
    torch's cast to e5m2 overflows 1e6 to inf, vLLM's scale-1 cache saturates at 57344
    (1.75 * 2**15)."""
    from precision_plugin.probe.attribution.variants import fake_quantize

    got = fake_quantize(torch.tensor([0.28, 1000.0, -1000.0]), "float8_e4m3fn")
    assert got.dtype == torch.float32
    assert got.tolist() == [0.28125, 448.0, -448.0]
    got = fake_quantize(torch.tensor([0.28, 1e6, -1e6]), "float8_e5m2")
    assert got.tolist() == [0.25, 57344.0, -57344.0]


def test_quantized_entries_round_the_whole_cache_when_it_is_not_the_expected_length() -> None:
    """Catches the incremental rounding reusing the last call's memory without checking that
    the cache is exactly ``new`` positions longer: two unrounded positions were written after
    a 3-position call, and a call with ``new=1`` must round both, not only the last."""
    from precision_plugin.probe.attribution.variants import quantized_entries

    module = torch.nn.Module()
    keys, values = torch.full((1, 1, 6, 2), 0.28), torch.full((1, 1, 6, 2), 0.28)
    quantized_entries(module, keys[..., :3, :], values[..., :3, :], 3, "float8_e4m3fn")
    keys[..., 3:5, :] = 0.28
    values[..., 3:5, :] = 0.28
    k, v = quantized_entries(module, keys[..., :5, :], values[..., :5, :], 1, "float8_e4m3fn")
    assert k[0, 0, :, 0].tolist() == [0.28125] * 5
    assert v[0, 0, :, 0].tolist() == [0.28125] * 5


def test_quantized_entries_round_the_new_positions_of_a_cache_that_appends_in_place() -> None:
    """Catches an off-by-one in the incremental start (``length - new + 1``): after a
    3-position call, a call one position longer on the same memory must round position 3."""
    from precision_plugin.probe.attribution.variants import quantized_entries

    module = torch.nn.Module()
    keys, values = torch.full((1, 1, 6, 2), 0.28), torch.full((1, 1, 6, 2), 0.28)
    quantized_entries(module, keys[..., :3, :], values[..., :3, :], 3, "float8_e4m3fn")
    k, v = quantized_entries(module, keys[..., :4, :], values[..., :4, :], 1, "float8_e4m3fn")
    assert k[0, 0, :, 0].tolist() == v[0, 0, :, 1].tolist() == [0.28125] * 4
    assert torch.equal(keys[..., 4:, :], torch.full((1, 1, 2, 2), 0.28))  # beyond: untouched


def test_quantized_entries_leave_tensors_that_record_gradients_alone() -> None:
    """Catches ``and`` for ``or`` in the gradient check: a key that requires grad with a value
    that does not must be rounded into new tensors, not in place."""
    from precision_plugin.probe.attribution.variants import quantized_entries

    key = torch.full((1, 1, 2, 2), 0.28, requires_grad=True)
    value = torch.full((1, 1, 2, 2), 0.28)
    k, v = quantized_entries(torch.nn.Module(), key, value, 2, "float8_e4m3fn")
    assert k.flatten().tolist() == [0.28125] * 4 and v.flatten().tolist() == [0.28125] * 4
    assert torch.equal(key.detach(), torch.full((1, 1, 2, 2), 0.28))
    assert torch.equal(value, torch.full((1, 1, 2, 2), 0.28))


class ToyTopKRouter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.weight = torch.nn.Parameter(torch.randn(4, 3, generator=g))

    def forward(self, x: torch.Tensor):
        logits = x @ self.weight.T
        scores = logits.softmax(-1)
        return logits, scores, scores.topk(2, dim=-1).indices


class _Routed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = ToyTopKRouter()


def test_router_in_takes_the_masters_weights_and_hands_on_the_compute_dtype() -> None:
    """Catches the router weight copied from the rounded model instead of the master, and the
    routing scores handed on in the router's dtype instead of the compute dtype."""
    from precision_plugin.probe.attribution.variants import router_in

    master = _Routed()
    model = _Routed().to(torch.bfloat16)
    assert router_in(model, master, "float32", "bfloat16") == 1
    assert torch.equal(model.router.weight, master.router.weight)
    x = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.bfloat16)
    logits, scores, _ = model.router(x)
    expected = x.float() @ master.router.weight.detach().T
    assert logits.dtype == scores.dtype == torch.bfloat16
    assert torch.equal(logits, expected.bfloat16())
    assert torch.equal(scores, expected.softmax(-1).bfloat16())
