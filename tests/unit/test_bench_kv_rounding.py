"""The fp8 KV rounding benchmark (``tests/benchmarks/bench_kv_rounding.py``): its three variants
run, and the two fp8 ones sample the same."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")


def test_measure_times_three_variants_and_finds_the_same_fp8_samples(tmp_path: Any) -> None:
    """The embedded model, 2 prompts x 6 tokens in bfloat16: every variant timed, and rounding
    each entry once samples what rounding the whole cache every step samples."""
    from precision_plugin.probe.tiny_model import save_default_model
    from tests.benchmarks.bench_kv_rounding import VARIANTS, measure

    path = save_default_model(tmp_path / "tiny")
    result = measure(str(path), "bfloat16", tokens=6, prompts=2)
    assert list(result["seconds"]) == list(VARIANTS)
    assert all(seconds > 0 for seconds in result["seconds"].values())
    assert result["same_samples"] is True


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--tokens", "0", "--tokens: '0' is not a positive integer; pass a number >= 1"),
        ("--dtype", "fp8", "--dtype: invalid choice: 'fp8'"),
        ("--model", "/no/such/folder", "--model: model: '/no/such/folder' does not exist"),
    ],
)
def test_bad_options_stop_with_one_line(
    option: str, value: str, message: str, monkeypatch: Any, capsys: Any
) -> None:
    from tests.benchmarks import bench_kv_rounding

    monkeypatch.setattr("sys.argv", ["bench_kv_rounding", option, value])
    with pytest.raises(SystemExit) as stop:
        bench_kv_rounding.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
