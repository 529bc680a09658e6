"""The sanity results: per-run summaries, the aggregate over seeds, the pre-registered verdict,
the timing, the JSON form, the table and the plot's series."""

from __future__ import annotations

import json
import math

import pytest

from precision_plugin.sanity import DtypeRun, SanityResult, SeedRun, StepRecord, preset_config
from precision_plugin.sanity.aggregate import MARGIN, degraded, spread
from precision_plugin.sanity.plot import series
from precision_plugin.sanity.schema import (
    CONSEQUENCE_FIELDS,
    STEP_FIELDS,
    SUMMARY_FIELDS,
    consequence_summary,
    missing_fields,
)
from precision_plugin.sanity.table import (
    accuracy_rows,
    consequence_markdown,
    consequence_rows,
    markdown_table,
    mismatch_rows,
    size_needed,
    size_needed_text,
    with_consequence,
)


def _run(dtype, accuracy, k3=1e-6, cos=None, cpu=6.0, nan_at=None):
    steps = [
        StepRecord(
            step=i + 1,
            reward=a,
            accuracy=a,
            k3_kl=float("nan") if nan_at == i + 1 else k3 * (i + 1),
            prob_diff_max=0.01 * (i + 1),
            loss_scale=65536.0 if dtype == "float16" else None,
            skipped_steps=0.0 if dtype == "float16" else None,
            grad_cosine=cos,
            seq_log_ratio_abs=0.05 if cos is not None else None,
            telemetry={"k1_kl": 1e-7, "ess": 0.9},
        )
        for i, a in enumerate(accuracy)
    ]
    return DtypeRun(dtype=dtype, steps=steps, seconds=2 * cpu, cpu_seconds=cpu)


def test_summary_windows_collapse_and_nan_count():
    run = _run("bfloat16", [0.25, 0.5, 0.75, 1.0, 0.5, 0.25], nan_at=2)
    s = run.summarize(window=2)
    # windows of 2: .375 .625 .875 .75 .375
    assert (s["first_accuracy"], s["peak_accuracy"], s["final_accuracy"]) == (0.375, 0.875, 0.375)
    assert s["collapsed"] is True and s["window"] == 2
    assert s["mean_k3_kl"] == pytest.approx(1e-6 * (1 + 3 + 4 + 5 + 6) / 5)  # NaN left out
    assert s["nan_values"] == 1 and s["max_prob_diff_max"] == pytest.approx(0.06)
    assert s["mean_grad_cosine"] is None and s["cpu_seconds"] == 6.0
    flat = _run("float32", [0.5, 0.5, 0.25, 0.5]).summarize(window=2)
    assert flat["collapsed"] is False  # final .375 vs best .5: a drop of .125 < .2


def _seed(seed, finals, collapse=()):
    """A seed whose dtypes end at ``finals`` (a flat run, or one that collapses from 1.0)."""
    runs = {}
    for dtype, final in finals.items():
        accuracy = [1.0, 1.0, final, final] if dtype in collapse else [final] * 4
        runs[dtype] = _run(dtype, accuracy, k3={"float16": 1e-6, "bfloat16": 5e-5}.get(dtype, 1e-13),
                           cos={"bfloat16": 0.99, "float16": 0.9999}.get(dtype, 1.0))  # fmt: skip
        runs[dtype].summarize(window=2)
    return SeedRun(seed=seed, pretrain={"sampled_accuracy": 0.4, "cpu_seconds": 10.0,
                                        "seconds": 20.0}, runs=runs)  # fmt: skip


def _result(seeds, steps=4, preset="long"):
    config = preset_config(
        preset, steps=steps, seeds=tuple(s.seed for s in seeds), dtypes=tuple(seeds[0].runs)
    )
    return SanityResult(config=config, model={"parameters": 1}, seeds=seeds)


def test_degraded_margin_and_collapse_rule():
    # 0.75 - 0.625 = 0.125 >= MARGIN; 0.75 - 0.6875 = 0.0625 < MARGIN
    seed = _seed(0, {"float32": 0.75, "float16": 0.6875, "bfloat16": 0.625})
    assert MARGIN == 0.10
    assert degraded(seed, "bfloat16") and not degraded(seed, "float16")
    # a collapse counts only when float32 does not collapse too
    both = _seed(1, {"float32": 0.5, "float16": 0.5, "bfloat16": 0.5}, collapse=("bfloat16",))
    assert both.runs["bfloat16"].summary["collapsed"] and degraded(both, "bfloat16")
    ctrl = _seed(2, {"float32": 0.5, "bfloat16": 0.5}, collapse=("bfloat16", "float32"))
    assert not degraded(ctrl, "bfloat16")


def test_verdict_needs_a_majority_of_seeds():
    seeds = [
        _seed(0, {"float32": 0.75, "float16": 0.75, "bfloat16": 0.5}),
        _seed(1, {"float32": 0.75, "float16": 0.625, "bfloat16": 0.5}),
        _seed(2, {"float32": 0.75, "float16": 0.75, "bfloat16": 0.75}),
    ]
    data = _result(seeds).to_dict()
    verdict = data["verdict"]
    assert verdict["dtypes"]["bfloat16"] == {"degraded_seeds": [0, 1], "degrades": True}
    assert verdict["dtypes"]["float16"] == {"degraded_seeds": [1], "degrades": False}
    assert verdict["paper_consequence_reproduced"] is True
    assert verdict["protocol_complete"] is False  # 4 steps, not 300
    seeds[1] = _seed(1, {"float32": 0.75, "float16": 0.625, "bfloat16": 0.75})
    assert _result(seeds).to_dict()["verdict"]["paper_consequence_reproduced"] is False


def test_aggregate_spreads_paired_differences_ratio_and_timing():
    seeds = [
        _seed(0, {"float32": 0.75, "float16": 0.75, "bfloat16": 0.5}),
        _seed(1, {"float32": 0.5, "float16": 0.75, "bfloat16": 0.5}),
    ]
    data = _result(seeds).to_dict()
    final = data["aggregate"]["bfloat16"]["final_accuracy"]
    assert final == {"mean": 0.5, "sd": 0.0, "min": 0.5, "max": 0.5, "n": 2}
    diff = data["paired"]["float16"]["final_accuracy_minus_float32"]
    assert diff["mean"] == 0.125 and diff["sd"] == pytest.approx(math.sqrt(2 * 0.125**2))
    assert data["k3_ratio_bf16_over_fp16"]["mean"] == pytest.approx(50.0)
    timing = data["timing"]
    assert timing["grpo_cpu_seconds_per_step"]["float32"]["mean"] == 1.5  # 6 s / 4 steps
    assert timing["cpu_seconds"] == 2 * (10 + 3 * 6)
    assert timing["preset_protocol"] == {"steps": 300, "seeds": 3}
    assert timing["preset_protocol_cpu_seconds"] == pytest.approx(3 * (10 + 300 * 3 * 1.5))


def test_spread_is_the_sample_sd_of_finite_values():
    assert spread([1.0, 2.0, 3.0, None, float("nan")]) == {
        "mean": 2.0, "sd": 1.0, "min": 1.0, "max": 3.0, "n": 3,
    }  # fmt: skip
    assert spread([None]) is None and spread([4.0])["sd"] == 0.0


def test_json_has_every_field_and_no_nan():
    seeds = [_seed(0, {"float32": 0.75, "float16": 0.75, "bfloat16": 0.5})]
    seeds[0].runs["bfloat16"].steps[1].k3_kl = float("nan")
    data = json.loads(_result(seeds).to_json())  # strict JSON: NaN became null
    assert missing_fields(data) == []
    run = data["seeds"][0]["runs"]["bfloat16"]
    assert run["steps"][1]["k3_kl"] is None and run["steps"][0]["telemetry"]["ess"] == 0.9
    assert set(run["summary"]) == set(SUMMARY_FIELDS) and set(run["steps"][0]) == set(STEP_FIELDS)
    assert data["config"]["seeds"] == [0] and data["task"]["name"] == "ShiftTask"
    del data["seeds"][0]["runs"]["float16"]["steps"][0]["k3_kl"]
    assert missing_fields(data) == ["seeds[0].runs.float16.steps[0].k3_kl"]


def test_table_rows_show_mean_and_spread_over_seeds():
    seeds = [
        _seed(0, {"float32": 0.75, "float16": 0.75, "bfloat16": 0.5}),
        _seed(1, {"float32": 0.5, "float16": 0.75, "bfloat16": 0.5}),
    ]
    data = _result(seeds).to_dict()
    accuracy = {r[0]: r for r in accuracy_rows(data)}
    assert accuracy["float32"][3] == "0.62 ± 0.18" and accuracy["float32"][4] == "-"
    assert accuracy["float16"][4] == "+0.12 ± 0.18" and accuracy["float16"][5] == "none"
    assert accuracy["bfloat16"][6] == "1.50 ± 0.00"
    mismatch = {r[0]: r for r in mismatch_rows(data)}
    # k3: mean over steps of 5e-5 * step (steps 1-4) = 1.25e-4, the same in both seeds
    assert mismatch["bfloat16"][1] == "1.3e-04 ±0%" and mismatch["bfloat16"][3] == "1.0e-02 ±0%"
    assert mismatch["float16"][5] == "0.0" and mismatch["float32"][5] == "-"
    text = markdown_table(data)
    assert text.splitlines()[0].startswith("| dtype | acc start")
    assert "\\|seq log-ratio\\|" in text and len(text.splitlines()) == 11


def test_the_consequence_metrics_are_summarized_per_run_and_over_seeds():
    run = _run("bfloat16", [0.5] * 4)
    logged = [(0.9, 0.0), (0.5, 0.25), (None, None), (1.0, 0.0)]
    for step, (ess, verl) in zip(run.steps, logged, strict=True):
        step.telemetry = {"ess": ess, "seq_mask_fraction_verl": verl, "seq_mask_fraction_trl": 0.0}
    run.steps[3].telemetry["ess"] = float("nan")  # left out, as in every other mean
    s = run.summarize(window=2)
    assert s["mean_ess"] == pytest.approx(0.7) and s["min_ess"] == 0.5
    assert s["mean_seq_mask_fraction_verl"] == pytest.approx(0.25 / 3)
    assert s["mean_seq_mask_fraction_trl"] == 0.0 and s["mean_tis_clip_fraction"] is None
    assert consequence_summary([None, {}]) == dict.fromkeys(CONSEQUENCE_FIELDS)
    from precision_plugin._core.metrics.consequence import CONSEQUENCE_METRICS

    means = {f.removeprefix("mean_") for f in CONSEQUENCE_FIELDS if f.startswith("mean_")}
    assert means == set(CONSEQUENCE_METRICS)
    seeds = [_seed(0, {"float32": 0.75, "bfloat16": 0.5}), _seed(1, {"float32": 0.5})]
    seeds[1].runs["bfloat16"] = _run("bfloat16", [0.5] * 4)
    for step in seeds[1].runs["bfloat16"].steps:
        step.telemetry = {"ess": 0.7}
    seeds[1].runs["bfloat16"].summarize(window=2)
    data = _result(seeds).to_dict()
    assert data["aggregate"]["bfloat16"]["mean_ess"] == spread([0.9, 0.7])
    rows = {r[0]: r for r in consequence_rows(data)}
    assert rows["bfloat16"][:3] == ["bfloat16", "0.8000 ± 0.1414", "0.700"]
    assert rows["bfloat16"][3] == "-" and rows["float32"][1] == "0.9000 ± 0.0000"
    assert consequence_markdown(data).splitlines()[0].startswith("| dtype | ESS | ESS worst")


def test_a_document_older_than_the_consequence_summaries_gets_them_from_its_steps():
    seeds = [
        _seed(0, {"float32": 0.75, "bfloat16": 0.5}),
        _seed(1, {"float32": 0.5, "bfloat16": 0.5}),
    ]
    data = _result(seeds).to_dict()
    old = json.loads(json.dumps(data))
    for seed in old["seeds"]:
        for run in seed["runs"].values():
            for f in CONSEQUENCE_FIELDS:
                del run["summary"][f]
    for agg in old["aggregate"].values():
        for f in CONSEQUENCE_FIELDS:
            del agg[f]
    upgraded = with_consequence(old)
    assert upgraded["aggregate"] == data["aggregate"] and upgraded["seeds"] == data["seeds"]
    assert "mean_ess" not in old["aggregate"]["bfloat16"]  # a copy: the input is left as is
    assert consequence_rows(old) == consequence_rows(data)


def test_plot_series_is_the_mean_and_range_over_seeds():
    seeds = [
        _seed(0, {"float32": 0.25}),
        _seed(1, {"float32": 0.75}),
    ]
    seeds[1].runs["float32"].steps[2].accuracy = None  # a step one seed did not log
    data = _result(seeds).to_dict()
    assert series(data, "float32", "accuracy") == [
        (1, 0.5, 0.25, 0.75), (2, 0.5, 0.25, 0.75), (4, 0.5, 0.25, 0.75),
    ]  # fmt: skip
    smoothed = series(data, "float32", "accuracy", smooth=2)
    assert [p[0] for p in smoothed] == [1, 2]  # steps 3 and 4 need the missing step


def test_run_pairs_the_dtypes_of_a_seed_and_pretrains_each_seed_once(monkeypatch):
    """Every dtype of a seed starts from that seed's pretrained weights, with that seed."""
    import hashlib

    import precision_plugin.sanity.run as run_module

    seen = []

    def fake_run_dtype(config, seed, dtype, pretrained, tokenizer, problems, progress):
        digest = hashlib.sha256()
        for tensor in pretrained.state_dict().values():
            digest.update(tensor.numpy().tobytes())
        seen.append((seed, dtype, digest.hexdigest(), tuple(p.prompt for p in problems)))
        return _run(dtype, [0.5, 0.5])

    pretrained = []
    real_pretrained = run_module._pretrained

    def counting_pretrained(config, seed, progress):
        pretrained.append(seed)
        return real_pretrained(config, seed, progress)

    monkeypatch.setattr(run_module, "_run_dtype", fake_run_dtype)
    monkeypatch.setattr(run_module, "_pretrained", counting_pretrained)
    config = preset_config(
        "default", smoke=True, seeds=(3, 4), pretrain_target=0.01, pretrain_max_steps=25
    )
    result = run_module.run_sanity(config)
    assert pretrained == [3, 4]
    assert [(s, d) for s, d, *_ in seen] == [(s, d) for s in (3, 4) for d in config.dtypes]
    for seed in (3, 4):
        rows = [r for r in seen if r[0] == seed]
        assert len({r[2] for r in rows}) == 1 and len({r[3] for r in rows}) == 1
    assert seen[0][2] != seen[3][2] and seen[0][3] != seen[3][3]  # seeds differ
    assert [s.seed for s in result.seeds] == [3, 4]
    assert result.seeds[0].runs["float32"].summary["window"] == 1


def test_caption_marks_a_shorter_run_indicative():
    from precision_plugin.sanity.table import caption

    seeds = [_seed(0, {"float32": 0.75, "float16": 0.75, "bfloat16": 0.5})]
    data = _result(seeds).to_dict()
    assert caption(data) == (
        "mean k3 bf16/fp16: 50x; criterion vs float32, indicative (not the full protocol): "
        "float16 holds, bfloat16 degrades"
    )
    data["verdict"]["protocol_complete"] = True
    assert caption(data).endswith(
        "pre-registered verdict vs float32: float16 holds, bfloat16 degrades "
        "(paper's consequence reproduced: True)"
    )


def test_the_size_needed_follows_from_the_runs_own_k3_and_cpu_time():
    seeds = [
        _seed(0, {"float32": 0.75, "float16": 0.75, "bfloat16": 0.5}),
        _seed(1, {"float32": 0.5, "float16": 0.75, "bfloat16": 0.5}),
    ]
    data = _result(seeds).to_dict()
    # bfloat16's k3 is 5e-5 * step over steps 1-4 in both seeds: mean 1.25e-4
    n = size_needed(data)
    tokens = math.pi / (4 * 1.25e-4)
    assert n["tokens"] == pytest.approx(tokens) == pytest.approx(6283.19, abs=0.01)
    assert n["tokens_low"] == n["tokens_high"] == pytest.approx(tokens)
    assert n["answer_tokens"] == 96 and n["times_the_answers"] == pytest.approx(tokens / 96)
    # 1.5 CPU s per step and dtype, 3 dtypes, 4 steps, 2 seeds, scaled by tokens / 96
    assert n["protocol_cpu_hours"] == pytest.approx(4 * 2 * 4.5 * tokens / 96 / 3600)
    assert size_needed_text(data).startswith(
        "With the k3 bfloat16 had here (1.3e-04), |Σ(log π − log μ)| reaches 1 on average after "
        "π/(4·k3) ≈ 6,300 tokens (6,300–6,300 over the seeds), 65x these 96-token answers;"
    )
    del data["aggregate"]["bfloat16"]
    assert size_needed(data) is None


def test_the_figure_has_an_ess_panel_from_the_steps_telemetry(tmp_path):
    """The published sanity results log each step's ESS (telemetry): the figure draws 1 − ESS,
    the mean over seeds of exactly those numbers; a document without ESS keeps three panels."""
    from pathlib import Path

    from precision_plugin.sanity.plot import panels, plot_sanity

    data = json.loads(
        (Path(__file__).resolve().parents[2] / "docs" / "results" / "sanity.json").read_text()
    )
    assert [p[0] for p in panels(data)][-1] == "one_minus_ess"
    points = series(data, "bfloat16", "one_minus_ess")
    assert len(points) == data["config"]["steps"]
    step, mean, low, high = points[10]
    expected = [
        1.0
        - next(s for s in seed["runs"]["bfloat16"]["steps"] if s["step"] == step)["telemetry"][
            "ess"
        ]
        for seed in data["seeds"]
    ]
    assert mean == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    assert (low, high) == (min(expected), max(expected))
    assert plot_sanity(data, tmp_path / "fig.png").stat().st_size > 10_000
    for seed in data["seeds"]:
        for run in seed["runs"].values():
            for s in run["steps"]:
                s.pop("telemetry", None)
    assert "one_minus_ess" not in [p[0] for p in panels(data)]
