"""The probe's table reads top to bottom: a row per dtype (mismatch, then consequence), a line
per dtype with the figures at the target length, the legend behind --explain; what to do comes
last; and it renders the same from a results file."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console
from rich.text import Text

from precision_plugin._core.metrics.mismatch import compute_mismatch
from precision_plugin.probe.advice import assess, dtype_line
from precision_plugin.probe.schema import DtypeResult, ProbeConfig, ProbeResult, SelfCheck
from precision_plugin.probe.table import EXPLAIN_HINT, render_decision, render_probe_table


def _result(
    noise: dict[str, float],
    target: int = 4096,
    float16_refused: str | None = None,
    sequences: int = 8,
) -> ProbeResult:
    """Per dtype, ``sequences`` sequences of 40..320 tokens (cycling) whose rollout log-probs
    differ from the trainer's by Gaussian noise of the given size per token (seeded)."""
    g = torch.Generator().manual_seed(0)
    results = {}
    for name, eps in noise.items():
        train, roll = [], []
        for i in range(sequences):
            n = 40 * (i % 8 + 1)
            t = (-1.0 - torch.rand(n, generator=g, dtype=torch.float64)).tolist()
            d = (eps * torch.randn(n, generator=g, dtype=torch.float64)).tolist()
            train.append(t)
            roll.append([a - b for a, b in zip(t, d, strict=True)])
        metrics = compute_mismatch(
            [x + [float("nan")] * (320 - len(x)) for x in train],
            [x + [float("nan")] * (320 - len(x)) for x in roll],
        )
        results[name] = DtypeResult(name, metrics, "measured", "", train, roll, 0.1)
    k3 = results["float32"].metrics.k3_kl
    check = SelfCheck(k3 < 1e-6, k3, 1e-6, f"float32 paths agree (k3 {k3:.2e} <= 1e-06).")
    results["float32"].verdict = "ok" if check.passed else "invalid"
    results["float32"].reason = check.message
    report = assess(results, target, valid=check.passed, float16_refused=float16_refused)
    for name, r in results.items():
        if name != "float32":
            r.verdict, r.reason = report.dtypes[name].verdict, report.dtypes[name].line
    config = ProbeConfig(target_length=target, max_new_tokens=320)
    return ProbeResult("m", "hf", "cpu", config, results, check, consequence=report)


def _text(result, explain: bool = True) -> str:
    """The table as ``probe --explain`` prints it, with the decision last."""
    console = Console(width=130, record=True)
    console.print(render_probe_table(result, explain=explain))
    console.print(Text(render_decision(result)))
    return console.export_text()


def _row(text: str, name: str) -> list[str]:
    return next(ln.split() for ln in text.splitlines() if ln.strip().startswith(name + " "))


def test_the_table_reads_top_to_bottom_and_says_what_to_do():
    """16 sequences a dtype: at 8 the ESS interval that holds for heavy tails (issue 53) is too
    wide for the decision to rest on the consequence, and it falls back to the mismatch."""
    result = _result({"float32": 1e-9, "float16": 0.004, "bfloat16": 0.032}, sequences=16)
    text = _text(result)
    report = result.consequence
    order = [
        text.index("dtype"),
        *(text.index(f" {name} ") for name in ("float32", "float16", "bfloat16")),
        *(text.index(report.dtypes[name].line[:40]) for name in ("float32", "float16", "bfloat16")),
        text.index("k3 KL: mean(r − 1 − log r)"),
        text.index("do: train in float16: at 4,096 tokens, a batch of 256 keeps"),
        text.index("apply: precision_plugin.enable() · DeepSpeed"),
    ]
    assert order == sorted(order), order
    # The decision is the last thing printed (issue 54): do: and apply: on lines of their own.
    last = [ln for ln in text.splitlines() if ln.strip()]
    assert any(ln.startswith("apply:") for ln in last[-3:]), last[-3:]
    assert "do: " not in render_probe_table_text(result)
    k3 = {n: r.metrics.k3_kl for n, r in result.results.items()}
    assert _row(text, "bfloat16")[2] == f"{k3['bfloat16'] / k3['float16']:.0f}x"
    assert _row(text, "float32")[2] == "floor" and _row(text, "float16")[2] == "1.0x"
    assert _row(text, "float16")[-1] == report.dtypes["float16"].verdict
    assert _row(text, "bfloat16")[-1] == "severe"
    assert " - " not in text  # no unexplained dashes: missing figures say n/a


def render_probe_table_text(result, explain: bool = False) -> str:
    console = Console(width=130, record=True)
    console.print(render_probe_table(result, explain=explain))
    return console.export_text()


def test_the_glossary_is_behind_explain():
    result = _result({"float32": 1e-9, "float16": 0.004, "bfloat16": 0.032})
    plain = render_probe_table_text(result)
    assert "k3 KL: mean(r − 1 − log r)" not in plain and EXPLAIN_HINT in " ".join(plain.split())
    assert "k3 KL: mean(r − 1 − log r)" in render_probe_table_text(result, explain=True)
    assert render_decision(result) == result.consequence.advice.replace(
        ". apply: ", ".\napply: ", 1
    )


def test_a_results_file_renders_the_same_table():
    result = _result({"float32": 1e-9, "float16": 0.004, "bfloat16": 0.032})
    assert _text(json.loads(result.to_json())) == _text(result)


def test_fp16_worse_than_bf16_says_so():
    result = _result({"float32": 1e-9, "float16": 0.032, "bfloat16": 0.004}, sequences=16)
    text = " ".join(_text(result).split())
    assert "do: train in bfloat16: at 4,096 tokens" in text
    assert "apply: precision_plugin.enable(dtype='bfloat16')" in text
    assert _row(_text(result), "float16")[2].endswith("x")


def test_negligible_everywhere_is_not_a_call_to_switch():
    result = _result({"float32": 1e-9, "float16": 1e-5, "bfloat16": 8e-5}, target=512)
    assert {c.verdict for n, c in result.consequence.dtypes.items() if n != "float32"} == {
        "negligible"
    }
    assert "do: either dtype works: at 512 tokens" in " ".join(_text(result).split())


def test_a_failed_self_check_makes_every_verdict_invalid():
    result = _result({"float32": 0.01, "float16": 0.004, "bfloat16": 0.032})
    assert not result.valid
    text = _text(result)
    assert all(_row(text, n)[-1] == "invalid" for n in ("float32", "float16", "bfloat16"))
    assert "do: fix the set-up first" in " ".join(text.split())


def test_drift_column_shows_the_signed_drift_and_its_standard_error():
    result = _result({"float32": 1e-9, "float16": 0.004, "bfloat16": 0.032})
    text = _text(result)
    lines = text.splitlines()
    for name in ("float16", "bfloat16"):
        m = result.results[name].metrics
        row = next(i for i, ln in enumerate(lines) if ln.strip().startswith(name + " "))
        assert f"{m.drift_per_1k:+.1e}" in lines[row].split()
        assert f"±{m.drift_per_1k_se:.0e}" in lines[row + 1].split()
    assert "drift/1K: −1000·k1" in " ".join(text.split()) and "|seq|" not in text


REFUSED = "vLLM refuses float16 for model type 'gemma3_text'"


def test_a_model_vllm_refuses_in_float16_is_not_told_to_train_in_float16():
    result = _result(
        {"float32": 1e-9, "float16": 0.004, "bfloat16": 0.032}, float16_refused=REFUSED
    )
    c = result.consequence.dtypes
    assert c["float16"].kept > c["bfloat16"].kept  # float16 still keeps more
    advice = result.consequence.advice
    assert advice.startswith("do: train in bfloat16: at 4,096 tokens"), advice
    assert f"float16 is out: {REFUSED}" in advice
    assert "float16 (precision_plugin.enable()) only with a rollout engine that runs it" in advice
    assert "bfloat16 still loses more than half" in advice
    assert result.consequence.decision.decided_by == "overflow"
    assert "do: train in float16" not in " ".join(_text(result).split())


def test_a_refusal_changes_nothing_where_bfloat16_keeps_more_and_is_named_when_negligible():
    plain = _result({"float32": 1e-9, "float16": 0.032, "bfloat16": 0.004})
    refused = _result(
        {"float32": 1e-9, "float16": 0.032, "bfloat16": 0.004}, float16_refused=REFUSED
    )
    assert plain.consequence.decision.dtype == refused.consequence.decision.dtype == "bfloat16"
    small = _result({"float32": 1e-9, "float16": 1e-5, "bfloat16": 8e-5}, 512, REFUSED)
    assert small.consequence.decision.dtype == "bfloat16"
    assert f"float16 is out: {REFUSED}" in small.consequence.advice


def test_an_ess_that_rounds_to_a_bound_says_how_far_it_is_from_it():
    """bf16 at 4,096 tokens projects an ESS of about 1e-9: the line says <0.01, never 0.00
    (which reads as exactly none); a value within rounding of 1 says >0.99."""
    import dataclasses

    from precision_plugin._core.metrics.consequence import Interval
    from precision_plugin.probe.advice import dtype_line

    report = _result({"float32": 1e-9, "float16": 0.004, "bfloat16": 0.032}).consequence
    c = report.dtypes["bfloat16"]
    for ess, shown in [
        (Interval(1e-9, 1e-12, 0.004), "ESS <0.01 (<0.01–<0.01)"),
        (Interval(0.5, 0.0, 0.996), "ESS 0.50 (0.00–>0.99)"),
        (Interval(1.0, 0.995, 1.0), "ESS 1.00 (>0.99–1.00)"),
    ]:
        projection = dataclasses.replace(c.projection, ess=ess)
        line = dtype_line(dataclasses.replace(c, projection=projection))
        assert f"(infinite batch: {shown[4:]}); " in line


def _headroom(margins: dict[str, tuple[float, float]]):
    """A float16 headroom report: per module path, its margin and its input's margin (bits)."""
    from precision_plugin._core.overflow.headroom import HeadroomReport, ModuleHeadroom

    fp16 = 65504.0
    return HeadroomReport(
        [
            ModuleHeadroom(path, "Linear", fp16 / 2**out, out, out < 3.0, fp16 / 2**inp)
            for path, (out, inp) in margins.items()
        ],
        margin_bits=3.0,
        batches=1,
    )


def _assessed(result: ProbeResult, overflow, results=None):
    results = results or result.results
    return assess(results, 4096, valid=True, overflow=overflow)


def test_modules_near_float16s_maximum_make_the_advice_keep_them_in_float32():
    """SmolLM2's case: float16 keeps the most, and 22 modules come within 1.4 bits of its
    maximum; the one line says float16 with keep_fp32_modules for where it starts, in the three
    forms, not a bare "train in float16"."""
    starts = ["model.layers.3.mlp.down_proj", "model.layers.29.mlp.down_proj"]
    margins = {p: (1.4, 12.0) for p in starts}  # flagged, fed by small inputs: where it starts
    margins |= {f"model.layers.{i}": (1.4, 1.4) for i in range(4, 24)}  # carried on
    report = _headroom(margins)
    assert report.recommendation().action == "keep_fp32_modules" and len(report.flagged) == 22
    result = _result({"float32": 1e-9, "float16": 0.004, "bfloat16": 0.032})
    section = _assessed(result, report)
    d = section.decision
    assert (d.dtype, d.keep_fp32_modules) == ("float16", tuple(starts))
    line = section.advice
    assert "22 module(s) within 3 bits of float16's maximum" in line
    assert f"precision_plugin.enable(overflow={{'keep_fp32_modules': {starts!r}}})" in line
    assert '"precision_plugin": {"dtype": "float16", "overflow": {"keep_fp32_modules": [' in line
    assert 'PRECISION_PLUGIN=\'{"dtype":"float16","overflow":{"keep_fp32_modules":[' in line
    assert line.count("do: ") == 1


def test_a_float16_that_overflows_is_never_told_either_dtype_works():
    """float16 not run (an activation beyond its range) and bfloat16 negligible: the advice is
    bfloat16 because float16 cannot run, not "either dtype works"."""
    from precision_plugin.probe.scoring import measure

    result = _result({"float32": 1e-9, "float16": 1e-5, "bfloat16": 8e-5}, target=512)
    results = dict(result.results)
    reason = "not run: 'model.layers.0.mlp' reaches 7e+04 in float32, beyond float16's 65504"
    results["float16"] = DtypeResult("float16", measure([], []), "invalid", reason, [], [], 0.0)
    report = _headroom({"model.layers.0.mlp": (-0.1, 12.0)})
    section = assess(results, 512, valid=True, overflow=report)
    assert section.dtypes["bfloat16"].verdict == "negligible"
    assert section.decision.dtype == "bfloat16" and section.decision.decided_by == "overflow"
    assert "either" not in section.advice and f"float16 is out: {reason}" in section.advice


def _sequences(lengths, eps_of):
    """Trainer and rollout log-probs whose per-token difference is Gaussian of size
    ``eps_of(length)`` (seeded)."""
    g = torch.Generator().manual_seed(3)
    train, roll = [], []
    for n in lengths:
        t = (-1.0 - torch.rand(n, generator=g, dtype=torch.float64)).tolist()
        d = (eps_of(n) * torch.randn(n, generator=g, dtype=torch.float64)).tolist()
        train.append(t)
        roll.append([a - b for a, b in zip(t, d, strict=True)])
    return train, roll


def test_long_sequences_that_spread_faster_widen_the_projection_and_say_why():
    import math

    from precision_plugin.probe.advice import dtype_consequence

    lengths = [16 * (i + 1) for i in range(16)]
    train, roll = _sequences(lengths, lambda n: 0.01 if n < 192 else 0.08)
    c = dtype_consequence("bfloat16", train, roll, 4096)
    assert c.growth.status == "misfit" and c.growth.p_value < 0.05
    high = c.growth.widened_high
    assert high > c.fit.variance_robust_high  # wider than the fit's own interval
    assert c.projection.ess.low == pytest.approx(math.exp(-high * 4096), rel=1e-12)
    assert "the projection's interval is widened" in dtype_line(c)
    same = dtype_consequence("bfloat16", *_sequences([256] * 16, lambda n: 0.01), 4096)
    assert same.growth.status == "untestable"
    line = " ".join(dtype_line(same).split())
    assert "The growth check could not be made: the lengths are too uniform" in line
