"""Faults: a framework import that raises, a third-party plugin that raises in each hook, an
interrupted ``enable()``, a framework that cannot be patched on import. Each leaves the process
as it was (no policy, no patch, the environment and import hooks unchanged), or says exactly
what it could not do."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import precision_plugin as pp
from precision_plugin._base.patching import Patcher
from precision_plugin._core.manager import active_patches, current_policy, get_plugin_manager
from precision_plugin.errors import AdapterInstallError, PrecisionMismatchError
from precision_plugin.hookspecs import hookimpl

#: An object third-party plugins patch, so a left-over patch is visible.
TARGET = types.SimpleNamespace(value="original")


def _state() -> tuple[Any, ...]:
    return (
        current_policy(),
        active_patches(),
        dict(os.environ),
        list(sys.meta_path),
        TARGET.__dict__.copy(),
    )


@pytest.fixture
def register() -> Iterator[Any]:
    pm = get_plugin_manager()
    added: list[object] = []

    def add(plugin: object, name: str) -> object:
        pm.register(plugin, name=name)
        added.append(plugin)
        return plugin

    yield add
    for plugin in added:
        pm.unregister(plugin)


@pytest.fixture
def fake_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Write importable modules ``name`` with ``source`` into a folder on ``sys.path``."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(source)
        importlib.invalidate_caches()
        written.append(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)


class _Patches:
    """A well-behaved third-party adapter: patches ``TARGET`` and waits for a module."""

    def __init__(self, module: str | None = None, attribute: str = "Thing") -> None:
        self.module, self.attribute = module, attribute

    @hookimpl
    def precision_install(self, policy: Any, patcher: Patcher) -> None:
        patcher.setattr(TARGET, "value", "patched", reason="test")
        if self.module:
            patcher.when_imported(
                self.module,
                lambda m: patcher.setattr(m, "patched", getattr(m, self.attribute), reason="test"),
                reason="test",
            )


# -- a framework import that raises ----------------------------------------------------------


def test_a_framework_import_that_raises_leaves_the_process_as_it_was(register, fake_module) -> None:
    fake_module("pp_fault_fw", "raise ImportError('pp_fault_fw needs libfoo.so')\n")
    register(_Patches("pp_fault_fw"), "fault-fw")
    baseline = _state()
    pp.enable()
    with pytest.raises(ImportError, match="libfoo"):  # the user's own error, unchanged
        importlib.import_module("pp_fault_fw")
    assert "pp_fault_fw" not in sys.modules
    assert "import hook for pp_fault_fw" in active_patches()["fault-fw"]  # still waiting
    pp.disable()
    assert _state() == baseline


def test_a_fixed_framework_is_patched_on_the_next_import(register, fake_module) -> None:
    fake_module("pp_fault_fw2", "raise ImportError('not yet')\n")
    register(_Patches("pp_fault_fw2"), "fault-fw2")
    pp.enable()
    with pytest.raises(ImportError):
        importlib.import_module("pp_fault_fw2")
    fake_module("pp_fault_fw2", "class Thing: pass\n")
    module = importlib.import_module("pp_fault_fw2")
    assert module.patched is module.Thing
    pp.disable()
    assert not hasattr(module, "patched")


# -- a framework that cannot be patched on import ---------------------------------------------


def test_a_missing_attribute_on_import_is_named_not_called_a_circular_import(
    register, fake_module, caplog: pytest.LogCaptureFixture
) -> None:
    fake_module("pp_fault_api", "class Other: pass\n")
    register(_Patches("pp_fault_api", attribute="Thing"), "fault-api")
    pp.enable()
    with caplog.at_level(logging.ERROR, logger="precision_plugin"):
        module = importlib.import_module("pp_fault_api")  # strictness="warn": the import works
    assert module.Other
    assert "has no attribute 'Thing'" in caplog.text
    assert "circular" not in caplog.text
    assert "precision_plugin[fault-api]" in caplog.text


def test_under_strictness_error_a_patch_that_fails_on_import_fails_that_import(
    register, fake_module
) -> None:
    fake_module("pp_fault_strict", "class Other: pass\n")
    register(_Patches("pp_fault_strict", attribute="Thing"), "fault-strict")
    baseline = _state()
    pp.enable(strictness="error")
    with pytest.raises(PrecisionMismatchError) as info:
        importlib.import_module("pp_fault_strict")
    message = str(info.value)
    assert "pp_fault_strict has no attribute 'Thing'" in message
    assert "strictness='error'" in message and "circular" not in message
    pp.disable()
    assert _state() == baseline


def test_under_strictness_error_an_already_imported_framework_makes_enable_raise(
    register, fake_module
) -> None:
    fake_module("pp_fault_loaded", "class Other: pass\n")
    importlib.import_module("pp_fault_loaded")
    register(_Patches("pp_fault_loaded", attribute="Thing"), "fault-loaded")
    baseline = _state()
    with pytest.raises(AdapterInstallError, match="fault-loaded"):
        pp.enable(strictness="error")
    assert _state() == baseline


# -- a third-party plugin that raises in each hook ---------------------------------------------


class _Raises:
    """Raises ``RuntimeError`` in the one hook named ``where``; records the hooks it saw."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _maybe(self, hook: str) -> None:
        if hook == self.where:
            raise RuntimeError(f"broken {hook}")

    @hookimpl
    def precision_install(self, policy: Any, patcher: Patcher) -> None:
        patcher.setattr(TARGET, "value", "patched by a broken plugin", reason="test")
        self._maybe("precision_install")

    @hookimpl
    def precision_uninstall(self, policy: Any) -> None:
        self._maybe("precision_uninstall")

    @hookimpl
    def precision_doctor(self, policy: Any) -> list[Any]:
        self._maybe("precision_doctor")
        return []

    @hookimpl
    def precision_probe_engines(self) -> dict[str, Any]:
        self._maybe("precision_probe_engines")
        return {}

    @hookimpl
    def precision_train_begin(self, policy: Any, args: Any) -> None:
        self._maybe("precision_train_begin")

    @hookimpl
    def precision_train_end(self, policy: Any) -> None:
        self._maybe("precision_train_end")

    @hookimpl
    def precision_collect_metrics(self, policy: Any) -> dict[str, float]:
        self._maybe("precision_collect_metrics")
        return {"raises_metric": 1.0}


class _Healthy:
    """Another plugin: must keep working whatever the broken one does."""

    def __init__(self) -> None:
        self.train_begin = 0
        self.train_end = 0

    @hookimpl
    def precision_train_begin(self, policy: Any) -> None:
        self.train_begin += 1

    @hookimpl
    def precision_train_end(self, policy: Any) -> None:
        self.train_end += 1

    @hookimpl
    def precision_collect_metrics(self, policy: Any) -> dict[str, float]:
        return {"healthy_metric": 2.0}


def _args() -> Any:
    return types.SimpleNamespace(fp16=True, bf16=False, use_vllm=False)


def _exercise(hook: str, healthy: _Healthy, caplog: pytest.LogCaptureFixture) -> None:
    """Drive the code path that calls ``hook`` and check its outcome."""
    if hook == "precision_install":
        with pytest.raises(AdapterInstallError, match=r"'raises'.*broken precision_install"):
            pp.enable()
        return
    pp.enable()
    try:
        if hook == "precision_doctor":
            from precision_plugin.doctor import run_doctor

            found = [f for f in run_doctor().findings if f.framework == "raises"]
            assert [f.status for f in found] == ["warning"]
            assert "broken precision_doctor" in found[0].message
        elif hook == "precision_probe_engines":
            from precision_plugin.probe import available_engines

            assert "hf" in available_engines()
            assert "broken precision_probe_engines" in caplog.text
        elif hook in ("precision_train_begin", "precision_collect_metrics"):
            callback = pp.PrecisionCallback()
            callback.on_train_begin(_args(), types.SimpleNamespace(), None)
            assert healthy.train_begin == 1
            metrics = callback.collect()
            assert metrics["precision/healthy_metric"] == 2.0
            assert ("precision/raises_metric" in metrics) == (hook != "precision_collect_metrics")
            assert f"broken {hook}" in caplog.text and "'raises'" in caplog.text
        elif hook == "precision_train_end":
            callback = pp.PrecisionCallback()
            callback.on_train_begin(_args(), types.SimpleNamespace(), None)
            callback.on_train_end(_args(), types.SimpleNamespace(), None)
            assert healthy.train_end == 1
            assert "broken precision_train_end" in caplog.text and "'raises'" in caplog.text
    finally:
        assert pp.disable() is True  # never raises, even when an uninstall hook does
    if hook == "precision_uninstall":
        assert "broken precision_uninstall" in caplog.text


HOOKS = [
    "precision_install",
    "precision_uninstall",
    "precision_doctor",
    "precision_probe_engines",
    "precision_train_begin",
    "precision_train_end",
    "precision_collect_metrics",
]


@pytest.mark.parametrize("hook", HOOKS)
def test_a_plugin_that_raises_in_a_hook_leaves_the_process_as_it_was(
    hook: str, register, caplog: pytest.LogCaptureFixture
) -> None:
    import precision_plugin.callback  # noqa: F401 - its imports set TORCHINDUCTOR_CACHE_DIR
    from precision_plugin import hookspecs

    assert set(HOOKS) == {n for n in vars(hookspecs) if n.startswith("precision_")}
    healthy = register(_Healthy(), "healthy")
    register(_Raises(hook), "raises")
    baseline = _state()
    caplog.set_level(logging.WARNING, logger="precision_plugin")
    _exercise(hook, healthy, caplog)
    assert _state() == baseline
    assert TARGET.value == "original"


def test_a_deliberate_refusal_in_train_begin_still_stops_the_run(register) -> None:
    class Refuses:
        @hookimpl
        def precision_train_begin(self, policy: Any) -> None:
            raise PrecisionMismatchError("precision_plugin: refused on purpose")

    register(Refuses(), "refuses")
    with pytest.raises(PrecisionMismatchError, match="on purpose"):
        pp.PrecisionCallback().on_train_begin(_args(), types.SimpleNamespace(), None)


# -- an interrupted enable() -------------------------------------------------------------------


class _Interrupted:
    """Interrupted (Ctrl-C) in the middle of its install, the first time only."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def precision_install(self, policy: Any, patcher: Patcher) -> None:
        self.calls += 1
        patcher.setattr(TARGET, "value", "half-installed", reason="test")
        if self.calls == 1:
            raise KeyboardInterrupt


def test_an_interrupted_enable_leaves_the_process_as_it_was(register) -> None:
    register(_Interrupted(), "interrupted")
    baseline = _state()
    with pytest.raises(KeyboardInterrupt):
        pp.enable()
    assert _state() == baseline


def test_an_interrupted_enable_keeps_the_policy_that_was_active(register) -> None:
    baseline = _state()
    pp.enable(dtype="bfloat16")
    active = _state()
    register(_Interrupted(), "interrupted")
    with pytest.raises(KeyboardInterrupt):
        pp.enable(dtype="float16")
    assert current_policy() == active[0]  # the bf16 policy is back, installed again
    assert os.environ.get("PRECISION_PLUGIN") == active[2].get("PRECISION_PLUGIN")
    pp.disable()
    assert _state() == baseline
