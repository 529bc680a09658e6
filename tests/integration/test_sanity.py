"""``precision-plugin sanity --smoke`` end to end: real TRL GRPO, HFRollout and the plugin on CPU.

One CLI run (tiny model, a few GRPO steps per dtype) is shared by the tests; nothing is mocked.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("trl")

from precision_plugin.cli import main
from precision_plugin.sanity.schema import missing_fields

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:
    """The smoke run's JSON (and the paths it wrote)."""
    from accelerate.state import AcceleratorState

    out = tmp_path_factory.mktemp("sanity")
    AcceleratorState._reset_state(True)
    try:
        code = main(
            ["sanity", "--smoke", "--json", str(out / "r.json"), "--plot", str(out / "r.png")]
        )
    finally:
        AcceleratorState._reset_state(True)
    assert code == 0
    return {"data": json.loads((out / "r.json").read_text()), "plot": out / "r.png"}


def test_every_dtype_completes_every_step(smoke):
    data = smoke["data"]
    assert list(data["runs"]) == ["float32", "float16", "bfloat16"]
    steps = data["config"]["steps"]
    for run in data["runs"].values():
        assert [s["step"] for s in run["steps"]] == list(range(1, steps + 1))
        assert all(s["k3_kl"] is not None and s["accuracy"] is not None for s in run["steps"])


def test_each_side_ran_the_dtype_asked(smoke):
    for dtype, run in smoke["data"]["runs"].items():
        ran = run["ran"]
        assert ran["consistent"], ran
        assert ran["rollout_dtype"] == dtype and ran["rollout_engine"] == "HFRollout"
        # float32 runs without autocast: the learner's forward is its fp32 weights
        assert ran["learner_forward_dtype"] == dtype, ran


def test_json_has_every_field_and_no_nan(smoke):
    data = smoke["data"]
    assert missing_fields(data) == []
    for run in data["runs"].values():
        assert run["summary"]["nan_values"] == 0
        for step in run["steps"]:
            assert all(v is None or math.isfinite(v) for v in step.values())


def test_float16_mismatch_is_at_least_10x_below_bfloat16(smoke):
    runs = smoke["data"]["runs"]
    fp16 = runs["float16"]["summary"]["mean_k3_kl"]
    bf16 = runs["bfloat16"]["summary"]["mean_k3_kl"]
    assert fp16 > 0 and bf16 >= 10 * fp16, (fp16, bf16)
    assert smoke["data"]["k3_ratio_bf16_over_fp16"] == pytest.approx(bf16 / fp16)
    # float32 on both sides: only reduction-order noise
    assert runs["float32"]["summary"]["mean_k3_kl"] < fp16


def test_loss_scaler_only_in_float16_and_started_in_band(smoke):
    data = smoke["data"]
    fp16 = data["runs"]["float16"]
    assert all(s["loss_scale"] > 0 and s["skipped_steps"] == 0 for s in fp16["steps"])
    assert all(s["loss_scale"] is None for s in data["runs"]["bfloat16"]["steps"])
    assert 0.0 < data["pretrain"]["sampled_accuracy"] < 1.0


def test_plot_is_a_png(smoke):
    assert smoke["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_vllm_engine_without_vllm_is_one_line_exit_2(capsys):
    pytest.importorskip("torch")
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vLLM and CUDA are present")
    assert main(["sanity", "--engine", "vllm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--engine vllm" in err[0] and "--engine hf" in err[0]
