"""enable/disable: idempotent, atomic, identity-restoring; third-party plugins; no import side effects."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import precision_plugin as pp
from precision_plugin._core import manager
from precision_plugin.hookspecs import hookimpl


class Victim:
    """A stand-in framework class that test adapters patch."""

    def run(self):
        return "original"


class GoodAdapter:
    def __init__(self):
        self.installs = 0
        self.uninstalls = 0

    @hookimpl(tryfirst=True)
    def precision_install(self, policy, patcher):
        self.installs += 1
        patcher.wrap(Victim, "run", lambda orig: lambda self: f"{policy.dtype}", reason="test")

    @hookimpl
    def precision_uninstall(self, policy):
        self.uninstalls += 1


class BrokenAdapter:
    @hookimpl(trylast=True)
    def precision_install(self, policy, patcher):
        patcher.setattr(Victim, "extra", 1, reason="test")
        raise RuntimeError("framework exploded")


@pytest.fixture
def pm():
    pm = manager.get_plugin_manager()
    registered = []

    def register(plugin, name):
        pm.register(plugin, name=name)
        registered.append(plugin)
        return plugin

    yield register
    pp.disable()
    for plugin in registered:
        pm.unregister(plugin)


def test_enable_returns_policy_and_is_idempotent(pm):
    good = pm(GoodAdapter(), "good")
    raw = Victim.__dict__["run"]
    policy = pp.enable()
    assert policy == pp.PrecisionPolicy() and pp.current_policy() is policy
    assert Victim().run() == "float16"
    assert pp.enable() == policy and good.installs == 1  # same policy: nothing reinstalled
    assert "good" in manager.active_patches()
    assert pp.disable() is True
    assert Victim.__dict__["run"] is raw and pp.current_policy() is None
    assert good.uninstalls == 1
    assert pp.disable() is False


def test_enable_with_another_policy_replaces_the_old_one(pm):
    good = pm(GoodAdapter(), "good")
    raw = Victim.__dict__["run"]
    pp.enable()
    assert pp.enable(dtype="bfloat16").dtype == "bfloat16"
    assert Victim().run() == "bfloat16" and good.installs == 2 and good.uninstalls == 1
    pp.disable()
    assert Victim.__dict__["run"] is raw


def test_enable_is_atomic_and_names_the_adapter(pm):
    pm(GoodAdapter(), "good")
    pm(BrokenAdapter(), "broken")
    raw = Victim.__dict__["run"]
    with pytest.raises(
        pp.AdapterInstallError, match=r"adapter 'broken' failed.*framework exploded"
    ) as err:
        pp.enable()
    assert err.value.adapter == "broken"
    assert Victim.__dict__["run"] is raw and not hasattr(Victim, "extra")
    assert pp.current_policy() is None


class RefusingAdapter:
    @hookimpl(trylast=True)
    def precision_install(self, policy, patcher):
        patcher.setattr(Victim, "extra", 1, reason="test")
        raise pp.PrecisionMismatchError("framework asked bf16. Fix: pass fp16")


def test_a_deliberate_refusal_is_raised_as_is_after_rollback(pm):
    pm(GoodAdapter(), "good")
    pm(RefusingAdapter(), "refusing")
    raw = Victim.__dict__["run"]
    with pytest.raises(pp.PrecisionMismatchError, match=r"framework asked bf16\. Fix: pass fp16"):
        pp.enable()
    assert Victim.__dict__["run"] is raw and not hasattr(Victim, "extra")
    assert pp.current_policy() is None


def test_skip_adapters(pm):
    pm(GoodAdapter(), "good")
    pm(BrokenAdapter(), "broken")
    pp.enable(skip_adapters=["broken"])
    assert Victim().run() == "float16"
    with pytest.raises(pp.PrecisionConfigError, match="unknown adapter"):
        pp.enable(skip_adapters=["nope"])


def test_changing_skip_adapters_reinstalls(pm):
    good = pm(GoodAdapter(), "good")
    pp.enable()
    assert "good" in manager.active_patches()
    pp.enable(skip_adapters="good")  # same policy, one adapter fewer: a plain name works too
    assert "good" not in manager.active_patches() and Victim().run() == "original"
    assert good.installs == 1


def test_failed_switch_keeps_the_previous_policy(pm):
    pm(GoodAdapter(), "good")
    pm(BrokenAdapter(), "broken")
    pp.enable(skip_adapters=["broken"])
    with pytest.raises(pp.AdapterInstallError, match="nothing changed"):
        pp.enable(dtype="bfloat16")
    assert pp.current_policy() == pp.PrecisionPolicy() and Victim().run() == "float16"
    assert not hasattr(Victim, "extra")


class SubsetAdapter:
    """Takes only some of each hook's arguments, as pluggy allows."""

    def __init__(self):
        self.seen = []

    @hookimpl
    def precision_install(self, policy):
        self.seen.append(policy.dtype)

    @hookimpl
    def precision_doctor(self):
        return []

    @hookimpl
    def precision_probe_engines(self):
        return {"subset": object}


def test_hook_implementations_may_take_a_subset_of_arguments(pm):
    from precision_plugin.doctor import adapter_findings
    from precision_plugin.probe import available_engines

    adapter = pm(SubsetAdapter(), "subset")
    pp.enable()
    assert adapter.seen == ["float16"]
    assert not [f for f in adapter_findings(pp.PrecisionPolicy()) if f.framework == "subset"]
    assert available_engines()["subset"] is object


@pytest.mark.parametrize(
    ("arg", "kwargs", "dtype"),
    [(None, {}, "float16"), ("bf16", {}, "bfloat16"), ({"dtype": "fp32"}, {}, "float32"),
     (pp.PrecisionPolicy(dtype="bfloat16"), {}, "bfloat16"), (None, {"dtype": "half"}, "float16")],
)  # fmt: skip
def test_enable_accepts_several_forms(arg, kwargs, dtype):
    assert pp.enable(arg, **kwargs).dtype == dtype


def test_enable_reads_env_when_no_policy_given(monkeypatch):
    monkeypatch.setenv("PRECISION_PLUGIN", "bf16")
    assert pp.enable().dtype == "bfloat16"


def test_enable_bad_input_is_clear():
    with pytest.raises(
        pp.PrecisionConfigError,
        match=r"argument .policy. got int 3, expected a PrecisionPolicy, a dict of its keys, a dtype name or None",
    ):
        pp.enable(3)  # type: ignore[arg-type]
    with pytest.raises(pp.PrecisionConfigError, match="dtype: 'fp8'"):
        pp.enable(dtype="fp8")
    assert pp.current_policy() is None


def test_builtin_adapters_registered_like_third_party():
    pm = manager.get_plugin_manager()
    names = {name for name, _ in pm.list_name_plugin()}
    present = {n for n, mod in manager.BUILTIN_ADAPTERS.items() if _importable(mod)}
    assert present <= names


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_entry_point_plugins_are_discovered(tmp_path):
    """A third-party distribution in the 'precision_plugin' group is loaded by the manager."""
    dist = tmp_path / "thirdparty_adapter-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: thirdparty-adapter\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text("[precision_plugin]\nthirdparty = thirdparty_adapter\n")
    (tmp_path / "thirdparty_adapter.py").write_text(
        textwrap.dedent("""
        from precision_plugin.hookspecs import hookimpl
        CALLS = []
        @hookimpl
        def precision_install(policy, patcher):
            CALLS.append(policy.dtype)
        """)
    )
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import precision_plugin as pp, thirdparty_adapter
        from precision_plugin._core.manager import adapter_names
        pp.enable(dtype="bf16")
        print("RESULT", thirdparty_adapter.CALLS, "thirdparty" in adapter_names())
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # Frameworks may print their own start-up lines; read ours.
    assert "RESULT ['bfloat16'] True" in out.stdout.splitlines()


def test_import_changes_nothing():
    """Importing the package imports no framework and changes no environment variable."""
    code = textwrap.dedent("""
        import json, os, sys
        before = dict(os.environ)
        import precision_plugin
        heavy = [m for m in ("deepspeed", "accelerate", "trl", "vllm", "transformers", "torch",
                                  "beartype", "hypothesis")
                 if m in sys.modules]
        print(json.dumps({"heavy": heavy, "env_same": dict(os.environ) == before,
                          "policy": precision_plugin.current_policy()}))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result == {"heavy": [], "env_same": True, "policy": None}
