"""The reversible patcher restores the identical original objects."""

from __future__ import annotations

import os

import pytest

from precision_plugin._base.patching import Patcher, is_patched


class Base:
    def inherited(self):
        return "base"


class Target(Base):
    value = 1

    def method(self, x):
        return x + 1

    @staticmethod
    def static(x):
        return x * 2

    @classmethod
    def klass(cls):
        return cls.__name__


def test_setattr_and_restore_identity():
    raw = Target.__dict__["method"]
    p = Patcher()
    p.setattr(Target, "method", lambda self, x: 0, reason="test")
    p.setattr(Target, "value", 2, reason="test")
    assert Target().method(1) == 0 and Target.value == 2
    p.restore()
    assert Target.__dict__["method"] is raw and Target.value == 1
    assert len(p) == 0
    p.restore()  # twice is harmless


def test_wrap_keeps_descriptors():
    raw_static, raw_class = Target.__dict__["static"], Target.__dict__["klass"]
    p = Patcher()
    p.wrap(Target, "static", lambda orig: lambda x: orig(x) + 1, reason="t")
    p.wrap(Target, "klass", lambda orig: lambda cls: "wrapped-" + orig(cls), reason="t")
    p.wrap(Target, "method", lambda orig: lambda self, x: orig(self, x) * 10, reason="t")
    assert Target.static(3) == 7 and Target().static(3) == 7
    assert Target.klass() == "wrapped-Target"
    assert Target().method(1) == 20
    assert is_patched(Target.__dict__["static"]) and is_patched(Target.method)
    assert Target.method.__name__ == "method"
    assert p.patched == ["Target.static", "Target.klass", "Target.method"]
    p.restore()
    assert Target.__dict__["static"] is raw_static and Target.__dict__["klass"] is raw_class
    assert not is_patched(Target.method)


def test_wrap_inherited_classmethod_and_staticmethod():
    class Parent:
        @classmethod
        def make(cls):
            return cls.__name__

        @staticmethod
        def twice(x):
            return 2 * x

    class Child(Parent):
        pass

    class GrandChild(Child):
        pass

    p = Patcher()
    p.wrap(Child, "make", lambda orig: lambda *a: orig(*a) + "!", reason="test")
    p.wrap(Child, "twice", lambda orig: lambda *a: orig(*a) + 1, reason="test")
    assert GrandChild.make() == "GrandChild!" and Child().make() == "Child!"
    assert Child().twice(3) == 7 and Child.twice(3) == 7
    p.restore()
    assert "make" not in vars(Child) and "twice" not in vars(Child)
    assert GrandChild.make() == "GrandChild" and Child().twice(3) == 6


def test_inherited_attribute_is_deleted_not_shadowed():
    p = Patcher()
    p.setattr(Target, "inherited", lambda self: "patched", reason="t")
    assert Target().inherited() == "patched"
    p.restore()
    assert "inherited" not in Target.__dict__ and Target().inherited() == "base"


def test_module_attribute_and_new_attribute():
    import json

    raw = json.dumps
    p = Patcher()
    p.wrap(json, "dumps", lambda orig: lambda *a, **k: "x", reason="t")
    p.setattr(json, "brand_new", 1, reason="t")
    assert json.dumps({}) == "x" and json.brand_new == 1
    p.restore()
    assert json.dumps is raw and not hasattr(json, "brand_new")


def test_env(monkeypatch):
    monkeypatch.setenv("PP_TEST_SET", "old")
    monkeypatch.delenv("PP_TEST_NEW", raising=False)
    p = Patcher()
    p.setenv("PP_TEST_SET", "new", reason="t")
    p.setenv("PP_TEST_NEW", "1", reason="t")
    assert os.environ["PP_TEST_SET"] == "new" and os.environ["PP_TEST_NEW"] == "1"
    assert p.patched == ["$PP_TEST_SET", "$PP_TEST_NEW"]
    p.restore()
    assert os.environ["PP_TEST_SET"] == "old" and "PP_TEST_NEW" not in os.environ


def test_same_attribute_twice_restores_the_first_original():
    raw = Target.__dict__["method"]
    p = Patcher()
    p.wrap(Target, "method", lambda orig: lambda self, x: -1, reason="t")
    p.wrap(Target, "method", lambda orig: lambda self, x: -2, reason="t")
    p.restore()
    assert Target.__dict__["method"] is raw


def _write_module(tmp_path, name, body="VALUE = 1\n\ndef f():\n    return 'original'\n"):
    (tmp_path / f"{name}.py").write_text(body)


def test_when_imported_patches_on_first_import(tmp_path, monkeypatch):
    import importlib
    import sys

    _write_module(tmp_path, "pp_lazy_target")
    monkeypatch.syspath_prepend(str(tmp_path))
    p = Patcher()
    seen = []

    def on_import(module):
        seen.append(module.__name__)
        p.wrap(module, "f", lambda orig: lambda: "patched", reason="t")

    p.when_imported("pp_lazy_target", on_import, reason="t")
    assert seen == [] and "pp_lazy_target" not in sys.modules
    assert p.patched == ["import hook for pp_lazy_target"]
    mod = importlib.import_module("pp_lazy_target")
    assert seen == ["pp_lazy_target"] and mod.f() == "patched"
    assert p.patched == ["pp_lazy_target.f"]
    raw = mod.__dict__["f"].__precision_plugin_original__
    p.restore()
    assert mod.f is raw and mod.f() == "original"
    assert not any(type(h).__name__ == "_PostImportHook" for h in sys.meta_path)
    sys.modules.pop("pp_lazy_target", None)


def test_when_imported_runs_now_when_already_imported():
    import json

    p = Patcher()
    seen = []
    p.when_imported("json", lambda m: seen.append(m), reason="t")
    assert seen == [json] and len(p) == 0


def test_restore_before_import_removes_the_hook(tmp_path, monkeypatch):
    import importlib
    import sys

    _write_module(tmp_path, "pp_never_patched")
    monkeypatch.syspath_prepend(str(tmp_path))
    p = Patcher()
    seen = []
    p.when_imported("pp_never_patched", seen.append, reason="t")
    p.restore()
    importlib.import_module("pp_never_patched")
    assert seen == []
    sys.modules.pop("pp_never_patched", None)


def test_callback_error_never_breaks_the_import(tmp_path, monkeypatch, caplog):
    import importlib
    import sys

    _write_module(tmp_path, "pp_boom")
    monkeypatch.syspath_prepend(str(tmp_path))
    p = Patcher()

    def boom(module):
        raise RuntimeError("nope")

    p.when_imported("pp_boom", boom, reason="t")
    mod = importlib.import_module("pp_boom")
    assert mod.VALUE == 1
    assert "could not patch pp_boom when it was imported: RuntimeError: nope" in caplog.text
    p.restore()
    sys.modules.pop("pp_boom", None)


def test_patching_an_instance_whose_repr_raises():
    """DeepSpeed's scalers cannot repr themselves; the patcher names instances by class."""

    class NoRepr:
        flag = True

        def __repr__(self):
            raise TypeError("not serializable")

    obj = NoRepr()
    p = Patcher()
    p.setattr(obj, "flag", False, reason="t")
    assert obj.flag is False and p.patched == ["<NoRepr instance>.flag"]
    p.restore()
    assert obj.flag is True and "flag" not in vars(obj)


# -- around / wrap_on_import: the one advice idiom every adapter uses ---------------------------


def test_around_passes_the_original_and_the_call_and_restores_identity():
    raw = Target.__dict__["method"]
    calls = []

    def advice(original, self, x):
        calls.append((type(self).__name__, x))
        return original(self, x) * 10

    p = Patcher()
    wrapper = p.around(Target, "method", advice, reason="t")
    assert Target().method(1) == 20 and calls == [("Target", 1)]
    assert Target.__dict__["method"] is wrapper and wrapper.__name__ == "method"
    assert is_patched(Target.method)
    p.restore()
    assert Target.__dict__["method"] is raw and Target().method(1) == 2


def test_around_keeps_classmethod_and_staticmethod_for_subclasses():
    class Parent:
        @classmethod
        def name(cls, suffix=""):
            return cls.__name__ + suffix

        @staticmethod
        def twice(x):
            return 2 * x

    class Child(Parent):
        pass

    raw_name, raw_twice = vars(Parent)["name"], vars(Parent)["twice"]
    p = Patcher()
    p.around(
        Parent, "name", lambda original, cls, suffix="": original(cls, suffix + "!"), reason="t"
    )
    p.around(Parent, "twice", lambda original, x: original(x) + 1, reason="t")
    assert isinstance(vars(Parent)["name"], classmethod)
    assert isinstance(vars(Parent)["twice"], staticmethod)
    assert Child.name() == "Child!" and Parent().name("?") == "Parent?!"
    assert Child.twice(3) == 7 and Child().twice(3) == 7
    p.restore()
    assert vars(Parent)["name"] is raw_name and vars(Parent)["twice"] is raw_twice
    assert Child.name() == "Child" and Child.twice(3) == 6


def test_around_may_skip_the_original():
    p = Patcher()
    p.around(Target, "static", lambda original, x: "short-circuit", reason="t")
    assert Target.static(3) == "short-circuit"
    p.restore()
    assert Target.static(3) == 6


def test_wrap_on_import_patches_a_class_method_at_first_import(tmp_path, monkeypatch):
    import importlib
    import sys

    body = "class Engine:\n    def step(self, n):\n        return n\n"
    _write_module(tmp_path, "pp_lazy_engine", body)
    monkeypatch.syspath_prepend(str(tmp_path))
    p = Patcher()
    p.wrap_on_import(
        "pp_lazy_engine",
        "Engine.step",
        lambda original, self, n: original(self, n) + 100,
        reason="t",
    )
    assert "pp_lazy_engine" not in sys.modules
    assert p.patched == ["import hook for pp_lazy_engine"]
    mod = importlib.import_module("pp_lazy_engine")
    raw = mod.Engine.__dict__["step"].__precision_plugin_original__
    assert mod.Engine().step(1) == 101 and p.patched == ["Engine.step"]
    p.restore()
    assert mod.Engine.__dict__["step"] is raw and mod.Engine().step(1) == 1
    sys.modules.pop("pp_lazy_engine", None)


def test_wrap_on_import_patches_now_when_loaded_and_restores():
    import json

    raw = json.dumps
    p = Patcher()
    p.wrap_on_import("json", "dumps", lambda original, obj: "<" + original(obj) + ">", reason="t")
    assert json.dumps(1) == "<1>" and p.patched == ["json.dumps"]
    p.restore()
    assert json.dumps is raw


def test_wrap_on_import_missing_attribute(caplog):
    import json

    p = Patcher()
    with caplog.at_level("INFO", logger="precision_plugin"):
        p.wrap_on_import("json", "Nope.f", lambda o: o, reason="t", missing="left alone")
    assert len(p) == 0 and "json has no Nope.f; left alone" in caplog.text
    with pytest.raises(AttributeError, match="'nope'"):
        p.wrap_on_import("json", "nope", lambda o: o, reason="t")
    assert not hasattr(json, "nope") and len(p) == 0
