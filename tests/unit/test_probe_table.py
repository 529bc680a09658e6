"""The probe's table: the bf16/fp16 ratio row, verdicts relative to the other dtypes, a legend."""

from __future__ import annotations

import math

import pytest
from rich.console import Console

from precision_plugin.mismatch import compute_mismatch
from precision_plugin.probe.schema import DtypeResult, ProbeConfig, ProbeResult, SelfCheck
from precision_plugin.probe.table import relative_verdicts, render_probe_table


def _result(noise: dict[str, float], tokens: dict[str, int] | None = None) -> ProbeResult:
    """A result whose dtypes differ from the trainer by a fixed log-prob offset pattern."""
    tokens = tokens or {}
    results = {}
    for name, eps in noise.items():
        n = tokens.get(name, 40)
        train = [[-1.0 - 0.01 * t for t in range(n)]]
        roll = [[v + eps * (1 if t % 2 else -1) for t, v in enumerate(train[0])]]
        results[name] = DtypeResult(name, compute_mismatch(train, roll), "ok", "", train, roll, 0.1)
    k3 = results["float32"].metrics.k3_kl
    check = SelfCheck(k3 < 1e-6, k3, 1e-6, "float32 paths agree")
    return ProbeResult("m", "hf", "cpu", ProbeConfig(), results, check)


def _text(result: ProbeResult) -> str:
    console = Console(width=100, record=True)
    console.print(render_probe_table(result))
    return console.export_text()


def test_ratio_row_and_relative_verdicts():
    result = _result({"float32": 1e-7, "float16": 1e-3, "bfloat16": 8e-3})
    k3 = {n: r.metrics.k3_kl for n, r in result.results.items()}
    ratio = k3["bfloat16"] / k3["float16"]
    assert ratio == pytest.approx(64, rel=0.05)  # k3 grows with the square of the offset
    text = _text(result)
    row = next(ln.strip() for ln in text.splitlines() if ln.strip().startswith("bf16 ÷ fp16"))
    assert row.split()[3] == f"{ratio:.0f}x"  # the k3 column
    verdicts = relative_verdicts(result)
    assert "floor" in verdicts["float32"] and "lowest" in verdicts["float16"]
    assert f"{ratio:.0f}x fp16" in verdicts["bfloat16"]
    assert "k1 KL = mean(log μ − log π) is signed" in text
    assert "tokens differ" not in text


def test_fp16_worse_than_bf16_is_named_and_token_counts_are_explained():
    result = _result({"float32": 1e-7, "float16": 8e-3, "bfloat16": 1e-3}, tokens={"bfloat16": 30})
    verdicts = relative_verdicts(result)
    assert "lowest" in verdicts["bfloat16"] and "x bf16" in verdicts["float16"]
    assert "tokens differ per dtype" in _text(result)


def test_a_failed_self_check_makes_every_verdict_invalid():
    result = _result({"float32": 1e-2, "float16": 1e-3, "bfloat16": 8e-3})
    assert not result.valid
    assert all("invalid" in v for v in relative_verdicts(result).values())
    assert math.isfinite(result.k3_ratio("bfloat16"))
