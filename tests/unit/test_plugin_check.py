"""A plugin with a misspelt hook (``precision_instal``) is found by pluggy's ``check_pending()``
once the plugins load: ``enable()`` raises under ``strictness="error"`` and warns otherwise,
``doctor`` reports it, and the engine entry points (here verl's, which needs no verl) only log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

import precision_plugin as pp
from precision_plugin._core.manager import get_plugin_manager
from precision_plugin._core.plugin_check import log_pending_hooks, pending_hooks
from precision_plugin.doctor import run_doctor
from precision_plugin.errors import PluginHookError
from precision_plugin.hookspecs import hookimpl

NAME = "misspelt_plugin"


class Misspelt:
    """A third-party plugin whose author typed ``precision_instal``."""

    @hookimpl
    def precision_instal(self, policy: Any, patcher: Any) -> None:  # pragma: no cover
        raise AssertionError("never called: no such hook")


@pytest.fixture
def misspelt() -> Iterator[None]:
    pm = get_plugin_manager()
    pm.register(Misspelt(), name=NAME)
    try:
        yield
    finally:
        pm.unregister(name=NAME)
        pp.disable()


EXPECTED = (
    f"plugin '{NAME}' implements 'precision_instal', which is no hook of precision_plugin "
    f"(did you mean 'precision_install'?), so it is never called"
)


def test_nothing_pending_by_default() -> None:
    assert pending_hooks(get_plugin_manager()) == []


def test_pending_hook_is_named(misspelt: None) -> None:
    assert pending_hooks(get_plugin_manager()) == [EXPECTED]


def test_enable_raises_under_strict_mode(misspelt: None) -> None:
    with pytest.raises(PluginHookError) as err:
        pp.enable(dtype="float16", strictness="error")
    assert EXPECTED in str(err.value) and "optionalhook=True" in str(err.value)
    assert pp.current_policy() is None  # nothing was installed


def test_enable_warns_otherwise(misspelt: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        policy = pp.enable(dtype="float16")
    assert pp.current_policy() == policy
    assert [r.getMessage() for r in caplog.records if EXPECTED in r.getMessage()] != []


def test_doctor_reports_it(misspelt: None) -> None:
    found = [f for f in run_doctor().findings if f.framework == "plugins"]
    assert [(f.status, f.message) for f in found] == [("warning", EXPECTED)]


def test_engine_processes_only_log(
    misspelt: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """verl's entry point under a strict policy: it logs the typo and stays active."""
    import precision_plugin.verl.plugin as plugin

    monkeypatch.setenv("PRECISION_PLUGIN", '{"dtype": "float16", "strictness": "error"}')
    try:
        with caplog.at_level(logging.WARNING, logger="precision_plugin"):
            plugin._load()
        assert len(plugin._patcher) == 1  # the config check is installed all the same
    finally:
        plugin._patcher.restore()
    assert any(
        EXPECTED in r.getMessage() and "verl process" in r.getMessage() for r in caplog.records
    )
    assert log_pending_hooks(get_plugin_manager, "vLLM process") == [EXPECTED]

    def broken() -> Any:
        raise RuntimeError("no manager")

    assert log_pending_hooks(broken, "SGLang process") == []  # never raises in an engine
