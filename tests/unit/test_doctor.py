"""``precision-plugin doctor``: versions, accelerator, adapter findings, JSON and exit codes."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
from rich.console import Console

from precision_plugin._base.report import Finding
from precision_plugin._base.versions import AcceleratorInfo, package_info
from precision_plugin._core.manager import get_plugin_manager
from precision_plugin.cli import main
from precision_plugin.doctor import core_findings, doctor_policy, render_report, run_doctor
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy


class _Plugin:
    def __init__(self, findings: list[Finding] | None = None, crash: bool = False) -> None:
        self.findings, self.crash = findings or [], crash

    @hookimpl
    def precision_doctor(self, policy: PrecisionPolicy) -> list[Finding]:
        if self.crash:
            raise RuntimeError("boom")
        return [
            Finding(f.framework, f.status, f"{f.message} ({policy.dtype})", f.fix)
            for f in self.findings
        ]


@pytest.fixture
def register() -> Iterator:
    pm = get_plugin_manager()
    added: list[object] = []

    def add(plugin: object, name: str) -> None:
        pm.register(plugin, name=name)
        added.append(plugin)

    yield add
    for plugin in added:
        pm.unregister(plugin)


def _doctor_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    rc = main(["doctor", "--json", *args])
    return rc, json.loads(capsys.readouterr().out)


def test_json_is_valid_and_exit_code_follows_errors(capsys: pytest.CaptureFixture[str]) -> None:
    rc, data = _doctor_json(capsys)
    assert set(data) >= {"policy", "versions", "accelerator", "findings", "errors"}
    assert data["versions"]["torch"]["version"].startswith("2.")
    assert data["accelerator"]["kind"] in ("cpu", "cuda", "rocm", "xpu", "mps")
    errors = [f for f in data["findings"] if f["status"] == "error"]
    assert data["errors"] == len(errors)
    assert rc == (1 if errors else 0)


def test_not_installed_framework_is_not_used_not_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, data = _doctor_json(capsys)
    missing = [name for name, info in data["versions"].items() if info is None]
    for name in missing:
        assert package_info(name) is None
        assert not [
            f for f in data["findings"] if f["framework"] == name and f["status"] == "error"
        ]
    console = Console(file=io.StringIO(), width=120)
    render_report(run_doctor(), console)
    text = console.file.getvalue()
    if missing:
        assert "not installed (not used)" in text
    assert "findings" in text


def test_an_adapter_error_makes_doctor_exit_1(register, capsys: pytest.CaptureFixture[str]) -> None:
    register(_Plugin([Finding("fakefw", "error", "blocked", fix="do X")]), "test-error")
    rc, data = _doctor_json(capsys, "--dtype", "bf16")
    assert rc == 1
    assert data["policy"]["dtype"] == "bfloat16"
    found = [f for f in data["findings"] if f["framework"] == "fakefw"]
    assert found == [
        {
            "framework": "fakefw",
            "status": "error",
            "message": "blocked (bfloat16)",
            "fix": "do X",
            "details": {},
        }
    ]
    assert main(["doctor"]) == 1
    assert "blocking problem" in capsys.readouterr().out


def test_a_crashing_adapter_is_a_warning_and_others_still_report(
    register, capsys: pytest.CaptureFixture[str]
) -> None:
    register(_Plugin(crash=True), "test-crash")
    register(_Plugin([Finding("otherfw", "warning", "watch out")]), "test-warn")
    _, data = _doctor_json(capsys)
    by_fw = {f["framework"]: f for f in data["findings"]}
    assert by_fw["test-crash"]["status"] == "warning"
    assert "boom" in by_fw["test-crash"]["message"]
    assert by_fw["otherfw"]["message"] == "watch out (float16)"


def test_accelerator_without_the_policy_dtype_is_an_error() -> None:
    v100 = AcceleratorInfo("cuda", "Tesla V100", (7, 0), True, False)
    findings = core_findings(PrecisionPolicy(dtype="bfloat16"), v100)
    errors = [f for f in findings if f.status == "error"]
    assert len(errors) == 1
    assert "bfloat16" in errors[0].message and "7.0" in errors[0].message
    assert "float16" in errors[0].fix
    assert not [f for f in core_findings(PrecisionPolicy(), v100) if f.status == "error"]


def test_policy_comes_from_flag_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECISION_PLUGIN", "bf16")
    assert doctor_policy().dtype == "bfloat16"
    assert doctor_policy("fp32").dtype == "float32"
    monkeypatch.delenv("PRECISION_PLUGIN")
    assert doctor_policy().dtype == "float16"


def test_bad_policy_in_the_environment_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRECISION_PLUGIN", "fp8")
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("precision-plugin: error: PRECISION_PLUGIN='fp8'")
    assert len(err.splitlines()) == 1


def test_accelerator_row_says_what_it_supports(capsys: pytest.CaptureFixture[str]) -> None:
    _, data = _doctor_json(capsys)
    first = data["findings"][0]
    assert first["framework"] == "accelerator"
    assert "fp16 " in first["message"] and "bf16 " in first["message"]


def test_only_the_frameworks_a_run_uses_block(register, capsys: pytest.CaptureFixture[str]) -> None:
    register(_Plugin([Finding("fakefw", "error", "blocked", fix="do X")]), "test-error")
    rc, data = _doctor_json(capsys, "--dtype", "bf16", "--frameworks", "trl")
    assert data["frameworks"] == ["accelerate", "transformers", "trl"]  # what TRL runs on
    found = [f for f in data["findings"] if f["framework"] == "fakefw"]
    assert [(f["status"], f["message"]) for f in found] == [
        (
            "warning",
            "blocked (bfloat16) (not blocking: your run does not use fakefw, by --frameworks)",
        )
    ]
    assert rc == (1 if data["errors"] else 0)
    assert all(
        f["framework"] in data["frameworks"] + ["accelerator"]
        for f in data["findings"]
        if f["status"] == "error"
    )
    rc, data = _doctor_json(capsys, "--dtype", "bf16", "--frameworks", "TRL, fakefw")
    assert rc == 1 and "fakefw" in data["frameworks"]
    assert [f["status"] for f in data["findings"] if f["framework"] == "fakefw"] == ["error"]


def test_a_blocking_problem_of_an_unnamed_framework_suggests_frameworks(register, capsys) -> None:
    register(_Plugin([Finding("fakefw", "error", "blocked", fix="do X")]), "test-error")
    assert main(["doctor", "--dtype", "bf16"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "Not running fakefw? Say what your run uses, e.g. precision-plugin doctor --frameworks trl,vllm"
        in out
    )


@pytest.mark.parametrize("value", ["bogus", "", "trl,,nope"])
def test_unknown_frameworks_are_one_line_naming_the_known(value, capsys) -> None:
    assert main(["doctor", "--frameworks", value]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "frameworks: got" in err and "deepspeed, " in err
