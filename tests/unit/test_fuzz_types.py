"""Every public entry point fuzzed from its parameters' types (``tests/unit/fuzz_types.py``): a
call returns or raises the plugin's own error in one line naming the parameter; never another
exception, a hang or a crash. A public function whose parameters give the fuzzer nothing to
send fails the meta-test, so a new one is fuzzed by being public.

``PRECISION_PLUGIN_FUZZ=full`` also fuzzes every parameter against its siblings' lengths and
prints every finding (a benchmark-sized run); the default is the CI run.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from pathlib import Path
from typing import Any

import pytest

from precision_plugin._base.boundary.typecheck import _arms
from tests.unit import fuzz_types as fz
from tests.unit.fuzz_known import KNOWN
from tests.unit.test_public_api import ENTRIES, Entry, baseline, keyword_params

FUZZED = [e for e in ENTRIES if e.spec is not None]
#: Entry points with no parameter the fuzzer derives values for, each with why that is right
#: (a new one fails test_every_public_function_can_be_fuzzed until it is listed or typed).
NOTHING_TO_FUZZ: dict[str, str] = {
    "precision_plugin.openrlhf.Layout": "a packaging Version, which packaging parses (and "
    "refuses) before it gets here",
    "precision_plugin.vllm.engine_arg_fields": "a class (or None); a wrong one is the type "
    "test's (test_public_api.py)",
    "precision_plugin._core.frameworks.TrainerFlags": "two bools; a wrong type is the type test's",
}


def _values(entry: Entry, tmp: Path) -> list[tuple[str, str, dict[str, Any], Any]]:
    """``(param, label, kwargs, value)``: the valid arguments with one parameter replaced by
    each adversarial value of its annotation (and, for a sequence, a length that differs from
    a sibling sequence parameter's); the first row is the valid call itself."""
    spec = entry.spec
    assert spec is not None
    try:
        good = baseline(entry, tmp)
    except pytest.fail.Exception:
        return []
    hints = spec.hints()
    params = keyword_params(spec)
    rows: list[tuple[str, str, dict[str, Any], Any]] = [("", "the valid call", good, None)]
    siblings = [p.name for p in params if fz._is_sequence_value(good.get(p.name))]
    for param in params:
        hint = hints.get(param.name, Any)
        values = fz.adversarial(param.name, hint, tmp / "paths")
        if any(fz._is_sequence(a) for a in _arms(hint)):
            for sibling in siblings:
                if sibling != param.name:
                    n = len(good[sibling]) + 1
                    values.append((f"len {n} beside {sibling}", [good[sibling][0]] * n))
        rows += [(param.name, label, {**good, param.name: v}, v) for label, v in values]
        if not values and dataclasses.is_dataclass(good.get(param.name)):
            rows += _field_rows(param.name, good, tmp)
    return rows


class Built:
    """A value built in the child: a dataclass argument with one field replaced (its
    constructor checks the field there, as it would for a user)."""

    def __init__(self, instance: Any, field: str, value: Any) -> None:
        self.instance, self.field, self.value = instance, field, value

    def build(self) -> Any:
        return dataclasses.replace(copy.deepcopy(self.instance), **{self.field: self.value})


def _field_rows(
    param: str, good: dict[str, Any], tmp: Path
) -> list[tuple[str, str, dict[str, Any], Any]]:
    """A parameter typed only as a dataclass: its valid value with each field in turn replaced
    by the values of that field's annotation (``param.field``)."""
    instance = good[param]
    hints = typing.get_type_hints(type(instance))
    rows = []
    for field in dataclasses.fields(instance):
        if not field.init or field.name.startswith("_"):  # a user sets no private field
            continue
        for label, v in fz.adversarial(field.name, hints.get(field.name, Any), tmp / "paths"):
            rows.append((f"{param}.{field.name}", label, {**good}, Built(instance, field.name, v)))
    return [(p, label, {**kw, p.split(".")[0]: value}, value) for p, label, kw, value in rows]


def _plan(entry: Entry, tmp: Path, check_only: bool = False) -> list[tuple[str, str, Any]]:
    """``(param, label, call)`` for :func:`_values`; public methods (called without an
    instance) and :data:`fz.BOUNDARY_ONLY` entries, or ``check_only``, up to the boundary."""
    spec = entry.spec
    assert spec is not None
    check_only = check_only or entry.method is not None or entry.name in fz.BOUNDARY_ONLY
    plan = []
    for param, label, kwargs, _ in _values(entry, tmp):
        target = functools.partial(spec.check, ()) if check_only else entry.call
        plan.append((param, label, functools.partial(_fresh, target, kwargs, param)))
    return plan


def _fresh(target: Any, kwargs: dict[str, Any], param: str) -> Any:
    """``target(kwargs)`` on a copy of the valid arguments (the calls share one child, and a
    call that mutates an argument, such as a monitor's state, must not change the next one);
    the fuzzed value ``param`` as it is."""
    copied = {}
    for name, value in kwargs.items():
        try:
            copied[name] = value if name == param else copy.deepcopy(value)
        except Exception:
            copied[name] = value
        if isinstance(value, Built):  # a dataclass field's value: built here, in the child
            copied[name] = value.build()
    return target(copied)


def fuzz(entry: Entry, tmp: Path) -> tuple[int, list[fz.Finding]]:
    """The number of calls made and the findings of fuzzing ``entry``: the valid call first;
    where even it cannot run here (its example arguments stand in for a real model or engine,
    so the body fails on them), the entry is fuzzed up to its boundary check."""
    plan = _plan(entry, tmp)
    if not plan:
        return 0, []
    (_, _, valid), *rest = plan
    first = next(fz.run_isolated([("", "the valid call", valid)], budget=60.0))[2]
    refused = first[2] if first[0] == "raised" and first[4] else None
    if first[0] != "returned" and refused is None:  # the body cannot run on the examples
        rest = _plan(entry, tmp, check_only=True)[1:]
    findings = []
    made = 1
    values = {(p, label): value for p, label, _, value in _values(entry, tmp)}
    for param, label, outcome in fz.run_each_isolated(rest, budget=60.0):
        made += 1
        value = values.get((param, label))
        if isinstance(value, Built):  # a field of a dataclass argument: named as the field
            param_named, value = value.field, value.value
        else:
            param_named = param
        verdict = fz.judge(param_named, value, outcome)
        if verdict is not None and not (verdict[0] == "misleading" and outcome[2] == refused):
            findings.append(fz.Finding(entry.name, param, label, *verdict))
    return made, findings


@pytest.mark.parametrize("entry", FUZZED, ids=[e.name for e in FUZZED])
def test_a_public_entry_point_survives_values_derived_from_its_types(entry: Entry, tmp_path):
    """No finding beyond those still listed in ``fuzz_known.KNOWN``, and none listed there
    that no longer happens (a fixed one is taken off the list)."""
    _, findings = fuzz(entry, tmp_path)
    new = [f.line() for f in findings if f.key() not in KNOWN]
    fixed = sorted(
        k for k in KNOWN if k.startswith(f"{entry.name}(") and k not in {f.key() for f in findings}
    )
    assert not new, "\n".join(new)
    assert not fixed, f"fixed: take these off tests/unit/fuzz_known.py: {fixed}"


def _constructed(hint: Any) -> bool:
    """Whether ``hint`` is a class whose constructor is itself a fuzzed entry point (a value of
    it is checked where it is built, and those values are fuzzed there), or a dataclass (whose
    fields are fuzzed through the parameter, :func:`_field_rows`)."""
    return any(
        isinstance(a, type) and (a in CONSTRUCTORS or dataclasses.is_dataclass(a))
        for a in _arms(hint)
    )


CONSTRUCTORS = {e.obj for e in FUZZED if isinstance(e.obj, type) and e.method is None}


def test_every_public_function_can_be_fuzzed():
    """The meta-test: an entry point whose parameters give the fuzzer no value to send (and
    none of which is a class fuzzed at its own constructor) is not fuzzed at all; it fails here
    until its annotations say what it takes, or it is listed in ``NOTHING_TO_FUZZ`` with why."""
    empty = []
    for entry in FUZZED:
        hints = entry.spec.hints()
        params = keyword_params(entry.spec)
        covered = [
            p for p in params if fz.fuzzable(hints.get(p.name, Any)) or _constructed(hints[p.name])
        ]
        if params and not covered and entry.name not in NOTHING_TO_FUZZ:
            empty.append(entry.name)
    assert not empty, f"public entry points the fuzzer cannot send anything: {empty}"
    stale = [name for name in NOTHING_TO_FUZZ if name not in {e.name for e in FUZZED}]
    assert not stale, f"NOTHING_TO_FUZZ names entry points that are not public: {stale}"
