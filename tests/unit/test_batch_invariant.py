"""The policy's batch_invariant setting: what each installed engine version allows, and the one
environment variable ``on`` sets (and ``Patcher.restore`` takes back)."""

from __future__ import annotations

import os

import pytest

from precision_plugin._base.patching import Patcher
from precision_plugin._core.batch_invariance import (
    ENV,
    apply_batch_invariant,
    batch_invariant_env,
    batch_invariant_findings,
)
from precision_plugin.policy import PrecisionPolicy


def _policy(mode: str) -> PrecisionPolicy:
    return PrecisionPolicy.from_dict({"batch_invariant": mode})


def test_off_reports_nothing() -> None:
    assert batch_invariant_findings(_policy("off"), "0.12.0", "0.5.12") == []


@pytest.mark.parametrize(
    ("mode", "vllm", "status", "words"),
    [
        ("auto", "0.12.0", "info", "would set VLLM_BATCH_INVARIANT=1"),
        ("on", "0.11.1", "change", "enable() sets VLLM_BATCH_INVARIANT=1"),
        ("auto", "0.11.0", "info", "has no batch-invariant mode"),
        ("on", "0.10.2", "warning", "has no batch-invariant mode"),
    ],
)
def test_vllm_by_version(mode: str, vllm: str, status: str, words: str) -> None:
    (finding,) = batch_invariant_findings(_policy(mode), vllm, None)
    assert (finding.framework, finding.status) == ("vllm", status)
    assert words in finding.message
    if status != "warning" and "no batch" not in words:
        assert "1.3-2.4x" in finding.message and "compute capability" in finding.message


def test_sglang_is_a_server_flag_the_plugin_names() -> None:
    (finding,) = batch_invariant_findings(_policy("on"), None, "0.5.12")
    assert finding.status == "warning" and "--enable-deterministic-inference" in finding.fix


def test_on_without_an_engine_points_to_the_hf_engine_at_batch_one() -> None:
    (finding,) = batch_invariant_findings(_policy("on"), None, None)
    assert "HFRollout(max_batch=1)" in finding.message


def test_on_sets_the_variable_and_restore_takes_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    patcher = Patcher("test")
    assert not apply_batch_invariant(_policy("auto"), patcher, "0.12.0")
    assert not apply_batch_invariant(_policy("on"), patcher, "0.11.0")
    assert ENV not in os.environ
    assert apply_batch_invariant(_policy("on"), patcher, "0.11.1")
    assert os.environ[ENV] == "1"
    patcher.restore()
    assert ENV not in os.environ


@pytest.mark.parametrize(
    ("mode", "vllm", "env"),
    [
        ("on", "0.11.1", {ENV: "1"}),
        ("on", None, {ENV: "1"}),  # no vLLM on this driver: the workers may have one
        ("on", "0.10.1", {}),  # no such mode: nothing it would ignore
        ("auto", "0.33.0", {}),
        ("off", "0.33.0", {}),
    ],
)
def test_the_variable_for_engine_processes_started_elsewhere(
    mode: str, vllm: str | None, env: dict[str, str]
) -> None:
    assert batch_invariant_env(_policy(mode), vllm) == env


def test_verl_and_openrlhf_carry_it_into_rays_runtime_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from precision_plugin import openrlhf
    from precision_plugin.verl.overrides import overrides, ray_invariance_overrides

    on = _policy("on")
    key = "++ray_kwargs.ray_init.runtime_env.env_vars.VLLM_BATCH_INVARIANT='1'"
    assert ray_invariance_overrides(on, vllm_version="0.33.0") == [key]
    assert ray_invariance_overrides(on, vllm_version="0.10.1") == []
    assert ray_invariance_overrides(_policy("auto"), vllm_version="0.33.0") == []
    assert key in overrides(on, vllm_version="0.33.0", gpu_capability=None)
    assert not any(ENV in o for o in overrides(on, vllm_version="0.33.0", rollout="sglang"))
    monkeypatch.setattr("precision_plugin._base.versions.installed_version", lambda name: None)
    assert openrlhf.runtime_env(on)["env_vars"][ENV] == "1"
    assert ENV not in openrlhf.runtime_env(_policy("off"))["env_vars"]


def test_batch_invariant_env_refuses_what_is_no_version() -> None:
    from precision_plugin.errors import PrecisionConfigError

    with pytest.raises(PrecisionConfigError, match=r"argument 'vllm' got 'latest'.*0\.11\.1"):
        batch_invariant_env(_policy("on"), "latest")
