"""The reversible patcher restores the identical original objects."""

from __future__ import annotations

import os

from precision_plugin.patching import Patcher, is_patched


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
