"""``probe --layerwise`` names a planted source of divergence at the right place.

Each case plants one known source on the rollout side only (the engine the probe samples with
and replays), on the embedded model: a decoder layer run in bfloat16 inside a float16 rollout,
or the RoPE inverse frequencies rounded to bfloat16. The control keeps the frequencies in
float32 as vLLM does and plants nothing: no stage stands out.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from rich.console import Console

from precision_plugin._core.hf_engine import HFRolloutEngine
from precision_plugin.probe import ProbeConfig, run_probe
from precision_plugin.probe.table import render_layerwise_table

pytestmark = pytest.mark.slow

PLANTED_LAYER = 2
#: Two layers planted at once: the sides part at the first in forward order.
TWO_PLANTED = (1, 3)


def _exact_rope(model: Any) -> Any:
    """The rotary embedding with float32 inverse frequencies (as vLLM keeps them)."""
    rotary = model.model.rotary_emb
    rotary.inv_freq = type(rotary)(rotary.config).inv_freq.to(rotary.inv_freq.device)
    return rotary


def _run_in(module: Any, dtype: torch.dtype, back: torch.dtype) -> None:
    """Run ``module`` in ``dtype``: its weights, its floating inputs, and its output cast back."""

    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(dtype)
        if isinstance(x, tuple):
            return tuple(cast(v) for v in x)
        return x

    module.to(dtype)
    module.register_forward_pre_hook(
        lambda m, args, kwargs: (cast(args), {k: cast(v) for k, v in kwargs.items()}),
        with_kwargs=True,
    )
    module.register_forward_hook(lambda m, args, out: out.to(back))


def _factory(plant: str | None):
    def factory(model_path: str, dtype: str, device: str, seed: int) -> HFRolloutEngine:
        engine = HFRolloutEngine.from_pretrained(model_path, dtype, device)
        rotary = _exact_rope(engine.model)
        if dtype == "float16" and plant == "layer":
            _run_in(engine.model.model.layers[PLANTED_LAYER], torch.bfloat16, torch.float16)
        if dtype == "float16" and plant == "two layers":
            for index in TWO_PLANTED:
                _run_in(engine.model.model.layers[index], torch.bfloat16, torch.float16)
        if dtype == "float16" and plant == "rope":
            rotary.inv_freq = rotary.inv_freq.to(torch.bfloat16).float()
        return engine

    return factory


def _probe(plant: str | None):
    config = ProbeConfig(
        dtypes=("float16",), num_prompts=2, max_new_tokens=96, min_new_tokens=96, layerwise=True
    )
    return run_probe(config, engines={"hf": _factory(plant)})


def test_a_layer_run_in_bfloat16_is_where_the_sides_part():
    result = _probe("layer")
    assert result.valid  # the float32 run is untouched
    replay = result.layerwise.dtypes["float16"]
    assert replay.parted_at == f"model.layers.{PLANTED_LAYER}"
    assert replay.breakdown_layer == f"model.layers.{PLANTED_LAYER}"
    stage = {s.name: s for s in replay.stages}[replay.parted_at]
    # bfloat16 rounds 8x more coarsely than float16: that layer adds several float16 units
    assert stage.local_units > 4 * replay.median_local_units
    assert {m.name.rsplit(".", 1)[-1] for m in replay.modules} >= {"self_attn", "mlp"}
    assert all(s.saturated == 0 for s in replay.stages)  # the tiny model is far from 65504
    assert f"part at model.layers.{PLANTED_LAYER}" in replay.line


def test_two_planted_layers_part_at_the_first_in_forward_order():
    replay = _probe("two layers").layerwise.dtypes["float16"]
    assert replay.parted_at == "model.layers.1" and replay.breakdown_layer == "model.layers.1"
    standing_out = [s.name for s in replay.stages if s.local_units > 4 * replay.median_local_units]
    assert standing_out == ["model.layers.1", "model.layers.3"]


def test_rounded_rope_frequencies_are_where_the_sides_part():
    result = _probe("rope")
    replay = result.layerwise.dtypes["float16"]
    assert replay.parted_at == "model.rotary_emb"
    data = json.loads(result.to_json())["layerwise"]
    assert data["dtypes"]["float16"]["parted_at"] == "model.rotary_emb"
    assert data["dtypes"]["float16"]["seconds"] > 0
    console = Console(width=120, record=True)
    console.print(render_layerwise_table(result))
    text = console.export_text()
    assert "model.rotary_emb" in text and "◀" in text


def test_nothing_planted_nothing_stands_out():
    result = _probe(None)
    replay = result.layerwise.dtypes["float16"]
    assert replay.parted_at is None, [(s.name, s.local_units) for s in replay.stages]
    names = [s.name for s in replay.stages]
    assert names[:2] == ["model.embed_tokens", "model.rotary_emb"]
    assert names[2:] == [f"model.layers.{i}" for i in range(4)] + ["model.norm"]
    # Every stage differs by rounding only: a few float16 units at most.
    assert all(0 < s.units < 20 for s in replay.stages)


def test_an_engine_that_cannot_be_hooked_is_stood_in_for_by_the_hf_engine():
    from precision_plugin._core.hf_engine import hf_engine_factory

    config = ProbeConfig(
        engine="elsewhere", dtypes=("bfloat16",), num_prompts=2, max_new_tokens=24, layerwise=True
    )
    result = run_probe(config, engines={"elsewhere": hf_engine_factory})
    assert list(result.layerwise.dtypes) == ["bfloat16"]
    assert any("the HF engine's bfloat16 copy" in note for note in result.notes)
