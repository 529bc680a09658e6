"""The decode-step benchmark's byte count (``tests/benchmarks/bench_decode_step.py``): what its
published weight rate divides by."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("dtype", "width"), [("float32", 4), ("float16", 4), ("bfloat16", 2)])
def test_weight_bytes_counts_every_linear_weight_at_the_width_its_product_reads(
    dtype: str, width: int
) -> None:
    from precision_plugin._core.hf_engine import HFRolloutEngine
    from precision_plugin.probe.tiny_model import DEFAULT_CONFIG, build_default_model
    from tests.benchmarks.bench_decode_step import weight_bytes

    model, tokenizer = build_default_model()
    engine = HFRolloutEngine(model, dtype, "cpu")
    hidden = DEFAULT_CONFIG["hidden_size"]
    inner = DEFAULT_CONFIG["intermediate_size"]
    heads = DEFAULT_CONFIG["num_attention_heads"]
    kv_heads = DEFAULT_CONFIG.get("num_key_value_heads", heads)
    head_dim = hidden // heads
    per_layer = (
        hidden * heads * head_dim  # q
        + 2 * hidden * kv_heads * head_dim  # k, v
        + heads * head_dim * hidden  # o
        + 3 * hidden * inner  # gate, up, down
    )
    parameters = DEFAULT_CONFIG["num_hidden_layers"] * per_layer + len(tokenizer) * hidden
    # float16 products multiply the widened float32 weight (float16_cpu): four bytes each.
    assert weight_bytes(engine.model) == parameters * width


def test_measure_finds_the_products_in_the_profile(tmp_path: object) -> None:
    """A short run on the embedded model: the profiler's product operators are found (a step
    with no product time would publish an infinite rate), and the step splits into them and
    the rest. The products are compared with the profiled run's own step: the unprofiled
    median is other runs, and a loaded machine made it shorter than the profiled products."""
    from precision_plugin.probe.tiny_model import save_default_model
    from tests.benchmarks.bench_decode_step import measure

    path = save_default_model(tmp_path / "tiny")  # type: ignore[operator]
    result = measure(str(path), "bfloat16", [1, 2], steps=4)
    assert set(result["rows"]) == {"1", "2"}
    for cell in result["rows"].values():
        assert 0 < cell["products_ms"] < cell["profiled_step_ms"]
        assert cell["other_ms"] == pytest.approx(cell["step_ms"] - cell["products_ms"])
        assert cell["operators_per_step"] > 0


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--steps", "0", "--steps: '0' is not a positive integer; pass a number >= 1"),
        ("--threads", "two", "--threads: 'two' is not a positive integer; pass a number >= 1"),
        ("--rows", "1,x", "--rows: expected a comma list of whole numbers of at least 1"),
        ("--rows", "8,0", "--rows: expected a comma list of whole numbers of at least 1"),
        ("--model", "/no/such/folder", "--model: model: '/no/such/folder' does not exist"),
    ],
)
def test_bad_options_stop_with_one_line_naming_the_option(
    option: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: object
) -> None:
    from tests.benchmarks import bench_decode_step

    monkeypatch.setattr("sys.argv", ["bench_decode_step", option, value])
    with pytest.raises(SystemExit) as stop:
        bench_decode_step.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert message in err
    assert "Traceback" not in err
