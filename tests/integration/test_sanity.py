"""``precision-plugin sanity --smoke`` end to end, both presets: real TRL GRPO, HFRollout and the
plugin on CPU.

One CLI run per preset (tiny model, a few GRPO steps per dtype) is shared by the tests; nothing
is mocked.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import time

import pytest

pytest.importorskip("trl")

from precision_plugin.cli import main
from precision_plugin.sanity.schema import SMOKE, missing_fields

pytestmark = [pytest.mark.slow]


def _smoke(out, *extra: str) -> dict:
    """Run ``precision-plugin sanity --smoke EXTRA`` with stdout/stderr captured (not a terminal,
    so progress comes as plain lines)."""
    from accelerate.state import AcceleratorState

    stdout, stderr = io.StringIO(), io.StringIO()
    AcceleratorState._reset_state(True)
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(
                ["sanity", "--smoke", *extra, "--json", str(out / "r.json"), "--plot",
                 str(out / "r.png")]
            )  # fmt: skip
    finally:
        AcceleratorState._reset_state(True)
    assert code == 0, stderr.getvalue()[-2000:]
    return {
        "data": json.loads((out / "r.json").read_text()),
        "plot": out / "r.png",
        "stdout": stdout.getvalue(),
        "stderr": stderr.getvalue(),
        "seconds": time.perf_counter() - started,
    }


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:
    """The default preset's smoke run over two seeds."""
    return _smoke(tmp_path_factory.mktemp("sanity"), "--seeds", "0,1")


@pytest.fixture(scope="module")
def long_smoke(tmp_path_factory) -> dict:
    """The long preset's smoke run (the CI-sized variant of the pre-registered protocol)."""
    return _smoke(tmp_path_factory.mktemp("sanity-long"), "--preset", "long")


@pytest.fixture(params=["default", "long"])
def run(request, smoke, long_smoke) -> dict:
    return smoke if request.param == "default" else long_smoke


def test_every_seed_and_dtype_completes_every_step(run):
    data = run["data"]
    steps = data["config"]["steps"]
    assert len(data["seeds"]) == len(data["config"]["seeds"])
    for seed in data["seeds"]:
        assert list(seed["runs"]) == ["float32", "float16", "bfloat16"]
        assert (
            0.0 < seed["pretrain"]["sampled_accuracy"] < 1.0 and seed["pretrain"]["reached_target"]
        )
        for r in seed["runs"].values():
            assert [s["step"] for s in r["steps"]] == list(range(1, steps + 1))
            assert all(s["k3_kl"] is not None and s["accuracy"] is not None for s in r["steps"])


def test_each_side_ran_the_dtype_asked(run):
    for seed in run["data"]["seeds"]:
        for dtype, r in seed["runs"].items():
            ran = r["ran"]
            assert ran["consistent"], ran
            assert ran["rollout_dtype"] == dtype and ran["rollout_engine"] == "HFRollout"
            # float32 runs without autocast: the learner's forward is its fp32 weights
            assert ran["learner_forward_dtype"] == dtype, ran


def test_json_has_every_field_and_no_nan(run):
    data = run["data"]
    assert missing_fields(data) == [] and data["schema_version"] == 2
    assert data["provenance"]["command"].startswith("precision-plugin sanity --smoke")
    for seed in data["seeds"]:
        for r in seed["runs"].values():
            assert r["summary"]["nan_values"] == 0
            for step in r["steps"]:
                values = [v for k, v in step.items() if k != "telemetry"]
                assert all(v is None or math.isfinite(v) for v in values)


def test_float16_mismatch_is_at_least_10x_below_bfloat16(run):
    for seed in run["data"]["seeds"]:
        summary = {d: r["summary"] for d, r in seed["runs"].items()}
        fp16, bf16 = summary["float16"]["mean_k3_kl"], summary["bfloat16"]["mean_k3_kl"]
        assert fp16 > 0 and bf16 >= 10 * fp16, (fp16, bf16)
        assert seed["k3_ratio_bf16_over_fp16"] == pytest.approx(bf16 / fp16)
        # float32 on both sides: only reduction-order noise
        assert summary["float32"]["mean_k3_kl"] < fp16
    ratios = [s["k3_ratio_bf16_over_fp16"] for s in run["data"]["seeds"]]
    assert run["data"]["k3_ratio_bf16_over_fp16"]["mean"] == pytest.approx(
        sum(ratios) / len(ratios)
    )


def test_loss_scaler_only_in_float16(run):
    for seed in run["data"]["seeds"]:
        fp16 = seed["runs"]["float16"]
        assert all(s["loss_scale"] > 0 and s["skipped_steps"] == 0 for s in fp16["steps"])
        assert all(s["loss_scale"] is None for s in seed["runs"]["bfloat16"]["steps"])


def test_plot_is_a_png_and_progress_is_plain_lines(run):
    assert run["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # not a terminal: one line per phase, with the seed
    lines = run["stderr"].splitlines()
    for seed in run["data"]["config"]["seeds"]:
        assert any(f"pretraining seed {seed} (float32)" in line for line in lines)
        for dtype in ("float32", "float16", "bfloat16"):
            assert any(f"GRPO {dtype} seed {seed}" in line for line in lines), lines
    assert "acc end" in run["stdout"] and "k3 bf16/fp16" in run["stdout"]


def test_default_preset_pairs_two_seeds_and_leaves_the_readout_off(smoke):
    data = smoke["data"]
    assert data["config"]["seeds"] == [0, 1] and data["config"]["grad_cosine"] is False
    assert data["seeds"][0]["pretrain"] != data["seeds"][1]["pretrain"]
    for seed in data["seeds"]:
        assert all(s["grad_cosine"] is None for r in seed["runs"].values() for s in r["steps"])
    assert data["aggregate"]["float32"]["final_accuracy"]["n"] == 2


def test_long_smoke_records_the_gradient_cosine_per_dtype(long_smoke):
    data = long_smoke["data"]
    assert data["config"]["preset"] == "long" and data["task"]["max_completion_tokens"] == 96
    assert data["config"]["seeds"] == list(SMOKE["long"]["seeds"])
    runs = data["seeds"][0]["runs"]
    for r in runs.values():
        assert all(s["grad_cosine"] is not None for s in r["steps"])
        assert all(s["seq_log_ratio_abs"] is not None for s in r["steps"])
    cos = {d: r["summary"]["mean_grad_cosine"] for d, r in runs.items()}
    # float32 on both sides: weights pi/mu are 1 to rounding, the two gradients agree
    assert 1 - cos["float32"] < 1e-6
    assert cos["bfloat16"] < cos["float16"] < 1.0
    ratio = {d: r["summary"]["mean_seq_log_ratio_abs"] for d, r in runs.items()}
    assert ratio["float32"] < ratio["float16"] < ratio["bfloat16"]
    # The consequence metrics of each step's telemetry, summarized per run and printed.
    ess = {d: r["summary"]["mean_ess"] for d, r in runs.items()}
    assert 1 - ess["float32"] < 1e-9 and ess["bfloat16"] < ess["float16"] < 1.0
    assert all(r["summary"]["min_ess"] <= ess[d] for d, r in runs.items())
    assert "what an importance-sampling correction would do" in long_smoke["stdout"]
    verdict = data["verdict"]
    assert verdict["protocol_complete"] is False and set(verdict["dtypes"]) == {
        "float16", "bfloat16",
    }  # fmt: skip


def test_vllm_engine_without_vllm_is_one_line_exit_2(capsys):
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vLLM and CUDA are present")
    assert main(["sanity", "--engine", "vllm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--engine vllm" in err[0] and "--engine hf" in err[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "0,0"], "--seeds"),
        (["--seeds", "0", "--seed", "1"], "not allowed with"),
        (["--preset", "huge"], "--preset"),
        (["--learning-rate", "-1"], "--learning-rate"),
    ],
)
def test_bad_options_are_one_line_exit_2(capsys, argv, message):
    assert main(["sanity", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
