"""Whether DeepSpeed's accelerator runs the policy dtype: doctor's answer and the refusal in
``deepspeed.initialize``, checked WITHOUT the integration tests' CPU-fp16 seam.

The answer must be DeepSpeed's own: the prediction made without importing DeepSpeed is
compared with what a fresh process that imports DeepSpeed says.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed")

import torch

from precision_plugin.deepspeed import device
from precision_plugin.deepspeed.adapter import precision_doctor
from precision_plugin.errors import PrecisionMismatchError
from precision_plugin.policy import PrecisionPolicy

_ASK_DEEPSPEED = (
    "import json; from deepspeed.accelerator import get_accelerator; a = get_accelerator(); "
    "print(json.dumps([a.device_name(), bool(a.is_fp16_supported()), "
    "bool(a.is_bf16_supported())]))"
)


@pytest.fixture(scope="module")
def deepspeeds_answer() -> tuple[str, bool, bool]:
    """What DeepSpeed itself says in a fresh process (no seam, no plugin)."""
    out = subprocess.run(
        [sys.executable, "-c", _ASK_DEEPSPEED],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    name, fp16, bf16 = json.loads(out.strip().splitlines()[-1])
    return str(name).split(":")[0], fp16, bf16


def _without_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the module look not imported, so the prediction path answers."""
    for name in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")]:
        monkeypatch.delitem(sys.modules, name)


def test_the_prediction_is_deepspeeds_own_answer(deepspeeds_answer, monkeypatch) -> None:
    _without_deepspeed(monkeypatch)
    support = device.deepspeed_support()
    assert support.source == "predicted"
    assert (support.accelerator, support.fp16, support.bf16) == deepspeeds_answer


def test_asking_the_imported_deepspeed_gives_the_same_answer(deepspeeds_answer) -> None:
    import deepspeed  # noqa: F401

    from tests.integration.ds_cpu import allow_fp16_on_cpu

    support = device.deepspeed_support()
    assert support.source == "deepspeed"
    assert (support.accelerator, support.fp16, support.bf16) == deepspeeds_answer
    restore = allow_fp16_on_cpu()  # the integration tests' seam lifts this check too
    try:
        assert device.deepspeed_support().fp16 is True
        assert device.check_engine_dtype(PrecisionPolicy(strictness="error")) == "float16"
    finally:
        restore()


def _doctor_device_finding(policy: PrecisionPolicy):
    found = [
        f
        for f in precision_doctor(policy=policy)
        if f.framework == "deepspeed" and "accelerator" in f.details
    ]
    assert len(found) == 1
    return found[0]


def test_doctor_answers_what_deepspeed_answers(deepspeeds_answer, monkeypatch) -> None:
    _without_deepspeed(monkeypatch)
    name, fp16, _ = deepspeeds_answer
    finding = _doctor_device_finding(PrecisionPolicy())
    assert finding.status == ("ok" if fp16 else "error")
    assert name in finding.message


@pytest.mark.parametrize("supported", [False, True])
def test_doctor_blocks_fp16_on_a_cpu_without_fp16_kernels(supported, monkeypatch) -> None:
    _without_deepspeed(monkeypatch)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: supported)
    finding = _doctor_device_finding(PrecisionPolicy())
    if supported:
        assert finding.status == "ok"
        return
    assert finding.status == "error"
    assert "cpu accelerator does not support fp16" in finding.message
    assert "Type fp16 is not supported on your device" in finding.message
    assert "bfloat16" in finding.fix and "float32" in finding.fix and "device" in finding.fix
    # bf16 and fp32 are the ways out: neither is blocked
    for dtype in ("bfloat16", "float32"):
        statuses = [f.status for f in precision_doctor(policy=PrecisionPolicy(dtype=dtype))]
        assert "error" not in statuses


def test_a_cuda_gpu_below_volta_refuses_fp16_as_deepspeed_does(monkeypatch) -> None:
    _without_deepspeed(monkeypatch)
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (6, 1))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.delenv("DS_ALLOW_DEPRECATED_FP16", raising=False)
    support = device.deepspeed_support()
    assert (support.accelerator, support.fp16, support.bf16) == ("cuda", False, False)
    assert "bfloat16 on both sides" not in device.ways_out(PrecisionPolicy(), support)
    monkeypatch.setenv("DS_ALLOW_DEPRECATED_FP16", "1")
    assert device.deepspeed_support().fp16 is True


def test_the_engine_check_refuses_or_says_what_runs(monkeypatch, caplog) -> None:
    _without_deepspeed(monkeypatch)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: False)
    with pytest.raises(PrecisionMismatchError) as info:
        device.check_engine_dtype(PrecisionPolicy(strictness="error"))
    assert "DeepSpeed's cpu accelerator does not support fp16" in str(info.value)
    assert "consistent bfloat16 on both sides" in str(info.value)
    with caplog.at_level("WARNING", logger="precision_plugin"):
        assert device.check_engine_dtype(PrecisionPolicy()) == "float32"
    assert "runs float32 instead" in caplog.text
    assert device.check_engine_dtype(PrecisionPolicy(dtype="bfloat16")) == "bfloat16"


# -- the first run's build of DeepSpeed's CPU communication op -----------------------------------
def _cpu_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        device, "deepspeed_support", lambda: device.DeviceSupport("cpu", False, True, "predicted")
    )


def test_a_pending_cpu_build_is_announced_with_its_cache_folder(monkeypatch, tmp_path) -> None:
    from torch.utils.cpp_extension import _get_build_directory

    _cpu_support(monkeypatch)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = _get_build_directory("deepspeed_shm_comm", verbose=False)
    assert folder.startswith(str(tmp_path))
    assert device.pending_cpu_build() == folder
    finding = next(f for f in precision_doctor(PrecisionPolicy()) if "compiles" in f.message)
    assert (
        finding.status == "info" and folder in finding.message and "2-5 minutes" in finding.message
    )
    (tmp_path / folder / "deepspeed_shm_comm.so").write_bytes(b"")  # built once: no more notice
    assert device.pending_cpu_build() is None
    assert not any("compiles" in f.message for f in precision_doctor(PrecisionPolicy()))


def test_no_cpu_build_on_another_accelerator(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(
        device, "deepspeed_support", lambda: device.DeviceSupport("cuda", True, True, "predicted")
    )
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert device.pending_cpu_build() is None


def test_each_environment_gets_its_own_build_cache() -> None:
    """Issue 54: every DeepSpeed run rebuilt deepspeed_shm_comm (5-11 silent minutes) because
    torch's default cache, under the user's home, is shared by every environment."""
    assert device.environment_extensions_dir({}, "/envs/a") == "/envs/a/torch_extensions"
    assert device.environment_extensions_dir({"PATH": "/bin"}, "/envs/b") == (
        "/envs/b/torch_extensions"
    )
    assert device.environment_extensions_dir({"TORCH_EXTENSIONS_DIR": "/mine"}, "/envs/a") is None
    assert device.environment_extensions_dir({"TORCH_EXTENSIONS_DIR": ""}, "/envs/a") == (
        "/envs/a/torch_extensions"
    )


def test_an_op_built_from_another_environment_is_a_build_due(tmp_path) -> None:
    """A library built from another environment's DeepSpeed is rebuilt by torch: the notice
    fires for it too, not only for a missing library."""
    assert device.build_due(str(tmp_path), "/envs/a/site-packages/deepspeed")  # nothing built
    (tmp_path / "deepspeed_shm_comm.so").write_bytes(b"")
    assert not device.build_due(str(tmp_path), "/envs/a/site-packages/deepspeed")  # no recipe
    ninja = tmp_path / "build.ninja"
    ninja.write_text("build shm.o: compile /envs/a/site-packages/deepspeed/ops/csrc/shm.cpp\n")
    assert not device.build_due(str(tmp_path), "/envs/a/site-packages/deepspeed")
    assert device.build_due(str(tmp_path), "/envs/b/site-packages/deepspeed")
    assert not device.build_due(str(tmp_path), None)  # this environment's DeepSpeed not found


def test_enable_points_torch_extensions_at_the_environment_and_disable_restores(
    monkeypatch,
) -> None:
    import os

    import precision_plugin

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    precision_plugin.enable()
    try:
        assert os.environ["TORCH_EXTENSIONS_DIR"] == os.path.join(sys.prefix, "torch_extensions")
    finally:
        precision_plugin.disable()
    assert "TORCH_EXTENSIONS_DIR" not in os.environ
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/the/users/choice")
    precision_plugin.enable()
    try:
        assert os.environ["TORCH_EXTENSIONS_DIR"] == "/the/users/choice"
    finally:
        precision_plugin.disable()
