"""What a number means, declared once with its type: ``Annotated[float, Finite(), Gt(0)]``.

A public parameter (or a field of a dataclass users build) says what its value must mean next
to its type, with [annotated-types](https://github.com/annotated-types/annotated-types)
(``Gt``, ``Ge``, ``Lt``, ``Le``, ``Interval``, ``MinLen``, ``MaxLen``) and the markers below;
the one boundary check (``precision_plugin._base.boundary.checked``) reads the declaration and
enforces it, naming the parameter, the value and the rule, and the property tests draw their
bad values from the same declaration (this module imports nothing of the package: the checker
builds on it):

- :class:`Finite`: not infinite, and not NaN unless ``nan_ok`` (NaN then means "not
  measured", as a fit over no sequence reports it);
- :class:`Whole`: an integer (a ``bool`` is not one: ``True`` is no token count);
- :class:`Each`: the rules hold for every item of a sequence or a 1-D tensor;
- :class:`Ordered`: ordered against another parameter (``low <= high``);
- :class:`AtMost`: a count no larger than its total (another parameter, or a measure of it,
  such as the sum of the lengths);
- :class:`Brackets`: a tuple holding an interval, ``(low, high)`` or ``(value, low, high)``,
  whose ends bracket it: ``low <= value <= high`` (a result's declaration, usually).

A function's *return* annotation declares its result the same way, and the boundary checks
the result on the way out (a broken one is a bug in the plugin, reported as such).

A NaN passes the comparison rules (it is "not measured", not a value out of range) unless the
parameter is :class:`Finite` without ``nan_ok``.
"""

from __future__ import annotations

import itertools
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import annotated_types as at


class Invalid(ValueError):
    """A value that breaks its rule: raised by a declared rule and by the boundary's validators
    (``precision_plugin._base.boundary`` imports this one class); the message says what was found
    wrong and what is allowed, and the boundary reports it naming the parameter."""


__all__ = [
    "Across",
    "AtMost",
    "Brackets",
    "Count",
    "Declared",
    "Each",
    "Finite",
    "FiniteFloat",
    "Invalid",
    "Measured",
    "NonNegative",
    "Ordered",
    "Positive",
    "Probability",
    "Whole",
    "constraints_of",
    "plain",
    "relations_for",
    "validator_for",
]


@dataclass(frozen=True)
class Finite(at.BaseMetadata):
    """Not infinite; not NaN unless ``nan_ok`` (NaN: "not measured")."""

    nan_ok: bool = False

    def __str__(self) -> str:
        return "finite (NaN for not measured)" if self.nan_ok else "finite"


@dataclass(frozen=True)
class Whole(at.BaseMetadata):
    """A whole number: an ``int`` or an integral float (never a ``bool``: ``True`` is no count);
    a tensor of an integer dtype, or a float one whose values are integral (not ``torch.bool``)."""

    def __str__(self) -> str:
        return "a whole number"


@dataclass(frozen=True)
class Each(at.BaseMetadata):
    """``rules`` hold for every item of a sequence (or every element of a tensor)."""

    rules: tuple[Any, ...] = ()

    def __init__(self, *rules: Any) -> None:
        object.__setattr__(self, "rules", rules)

    def __str__(self) -> str:
        return "each item " + ", ".join(_rule(r) for r in self.rules)


@dataclass(frozen=True)
class Ordered(at.BaseMetadata):
    """This parameter ``op`` the parameter ``other`` (``op`` one of <, <=, >, >=)."""

    other: str
    op: str = ">="

    def __str__(self) -> str:
        return f"{self.op} {self.other}"


@dataclass(frozen=True)
class AtMost(at.BaseMetadata):
    """A count no larger than ``measure(other)`` (``other`` itself when no measure)."""

    other: str
    measure: Callable[[Any], float] | None = field(default=None, compare=False)
    what: str = ""

    def __str__(self) -> str:
        return f"<= {self.what or self.other}"


@dataclass(frozen=True)
class Brackets(at.BaseMetadata):
    """A tuple whose items ``low`` and ``high`` (indices) bracket the item ``value`` (an index,
    or ``None`` for a bare ``(low, high)``): ``low <= value <= high``; a NaN end is "not
    measured" and brackets nothing."""

    low: int = 0
    high: int = 1
    value: int | None = None

    def __str__(self) -> str:
        return "low <= high" if self.value is None else "low <= value <= high"


#: Reusable declarations.
FiniteFloat = Annotated[float, Finite()]
Measured = Annotated[float, Finite(nan_ok=True)]
NonNegative = Annotated[float, Finite(), at.Ge(0)]
Positive = Annotated[float, Finite(), at.Gt(0)]
Probability = Annotated[float, Finite(nan_ok=True), at.Ge(0), at.Le(1)]
Count = Annotated[int, Whole(), at.Ge(0)]

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def constraints_of(hint: Any) -> list[Any]:
    """The annotated-types metadata of ``hint`` (``Annotated[...]``, also inside ``X | None``)."""
    found: list[Any] = []
    if typing.get_origin(hint) is Annotated:
        found.extend(
            m for m in hint.__metadata__ if isinstance(m, (at.BaseMetadata, at.GroupedMetadata))
        )
        hint = typing.get_args(hint)[0]
    for arm in (
        typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) else ()
    ):
        found.extend(constraints_of(arm))
    return found


_UnionType = type(int | None)


def _bound(rule: Any) -> Any:
    """The bound of ``Gt``/``Ge``/``Lt``/``Le`` (its one field, named like the class)."""
    return getattr(rule, type(rule).__name__.lower())


def plain(hint: Any) -> Any:
    """``hint`` without its ``Annotated`` metadata (inside ``X | None`` too): the type alone,
    for the type check."""
    if typing.get_origin(hint) is Annotated:
        return plain(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (typing.Union, _UnionType):
        arms = tuple(plain(a) for a in typing.get_args(hint))
        if arms != typing.get_args(hint):
            return typing.Union[arms]  # noqa: UP007 - built from a tuple
    return hint


def _rule(rule: Any) -> str:
    names = {at.Gt: ">", at.Ge: ">=", at.Lt: "<", at.Le: "<="}
    for kind, op in names.items():
        if isinstance(rule, kind):
            bound = _bound(rule)
            return f"{op} {bound:g}" if isinstance(bound, (int, float)) else f"{op} {bound}"
    if isinstance(rule, at.MinLen):
        return f"at least {rule.min_length} item(s)"
    if isinstance(rule, at.MaxLen):
        return f"at most {rule.max_length} item(s)"
    return str(rule)


def _flat(rules: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for rule in rules:
        if isinstance(rule, at.Interval):  # Interval(gt=, ge=, lt=, le=): its parts
            out.extend(rule)
        else:
            out.append(rule)
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond float: compared as an int below
        return math.copysign(math.inf, value)


def _check_one(value: Any, rules: Sequence[Any], where: str = "") -> None:
    """Raise :class:`Invalid` naming the first rule ``value`` breaks (``where``: an item; the
    boundary's message already shows a whole value, so only an item's is repeated)."""
    lead = f"holds {value!r} (item {where}), which" if where else ""

    def broken(what: str) -> Invalid:
        return Invalid(f"{lead} {what}".strip())

    finite = next((r for r in rules if isinstance(r, Finite)), None)
    if any(isinstance(r, Whole) for r in rules):
        if isinstance(value, bool):
            raise broken("is a bool, where a whole number belongs (rule: whole number)")
        if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
            raise broken("is not a whole number (rule: whole number)")
    number = _number(value)
    if number is None:
        return  # the type check names a value of the wrong kind
    if math.isnan(number):
        if finite is not None and not finite.nan_ok:
            raise broken("is NaN, not a number (rule: finite)")
        return  # not measured: no comparison applies
    if math.isinf(number) and finite is not None:
        raise broken("is not a finite number (rule: finite)")
    for rule in rules:
        for kind, op in ((at.Gt, ">"), (at.Ge, ">="), (at.Lt, "<"), (at.Le, "<=")):
            if isinstance(rule, kind):
                bound = _bound(rule)
                if not _OPS[op](value, bound):
                    raise broken(f"breaks the rule {op} {bound:g}")


def _check(value: Any, rules: Sequence[Any]) -> Any:
    own = [r for r in rules if not isinstance(r, (Each, Ordered, AtMost))]
    for rule in own:
        if isinstance(rule, (at.MinLen, at.MaxLen)) and hasattr(value, "__len__"):
            n = len(value)
            if isinstance(rule, at.MinLen) and n < rule.min_length:
                raise Invalid(f"has {n} item(s), fewer than the rule allows: {_rule(rule)}")
            if isinstance(rule, at.MaxLen) and n > rule.max_length:
                raise Invalid(f"has {n} item(s), more than the rule allows: {_rule(rule)}")
    _check_one(value, own)
    for rule in rules:
        if isinstance(rule, Each):
            _check_items(value, _flat(rule.rules))
        elif isinstance(rule, Brackets):
            _check_brackets(value, rule)
    return value


def _check_brackets(value: Any, rule: Brackets) -> None:
    """Raise :class:`Invalid` where ``value``'s ends do not bracket it (NaN ends skipped)."""
    try:
        items = list(value)
        named = {"low": items[rule.low], "high": items[rule.high]}
        if rule.value is not None:
            named["value"] = items[rule.value]
    except (TypeError, IndexError):
        raise Invalid(f"is not a tuple of the interval its rule names ({rule})") from None
    numbers = {k: _number(v) for k, v in named.items()}
    order = [k for k in ("low", "value", "high") if k in numbers]
    known = [k for k in order if numbers[k] is not None and not math.isnan(numbers[k])]
    for a, b in itertools.pairwise(known):
        if not numbers[a] <= numbers[b]:
            raise Invalid(f"has {a} {named[a]!r} above {b} {named[b]!r} (rule: {rule})")


def _check_items(value: Any, rules: Sequence[Any]) -> None:
    if value is None or isinstance(value, (str, bytes)):
        return
    if type(value).__module__ == "torch":  # a tensor: elementwise, without a loop
        _check_tensor(value, rules)
        return
    if not hasattr(value, "__iter__"):
        return
    for i, item in enumerate(value):
        if isinstance(item, (list, tuple)):
            for j, inner in enumerate(item):
                _check_one(inner, rules, f"[{i}][{j}]")
        else:
            _check_one(item, rules, str(i))


def _check_tensor(value: Any, rules: Sequence[Any]) -> None:
    import torch

    whole = any(isinstance(r, Whole) for r in rules)
    if whole and (value.dtype == torch.bool or value.is_complex()):
        raise Invalid(f"is a {value.dtype} tensor, where whole numbers belong (rule: whole number)")
    if value.dtype == torch.bool or not value.numel():
        return
    t = value.detach().to(torch.float64)
    if whole and value.is_floating_point():
        fraction = torch.isfinite(t) & (t != torch.round(t))
        if bool(fraction.any()):
            index = int(fraction.reshape(-1).nonzero()[0])
            raise Invalid(
                f"holds item {index} = {t.reshape(-1)[index].item()!r}, not a whole number "
                f"(rule: whole number)"
            )
    finite = next((r for r in rules if isinstance(r, Finite)), None)
    if finite is not None:
        bad = torch.isinf(t) if finite.nan_ok else ~torch.isfinite(t)
        if bool(bad.any()):
            index = int(bad.reshape(-1).nonzero()[0])
            raise Invalid(
                f"holds item {index} = {t.reshape(-1)[index].item()!r}, not finite (rule: finite)"
            )
    for rule in rules:
        for kind, op in ((at.Gt, ">"), (at.Ge, ">="), (at.Lt, "<"), (at.Le, "<=")):
            if isinstance(rule, kind):
                bound = _bound(rule)
                broken = ~_OPS[op](t, bound) & ~torch.isnan(t)  # type: ignore[operator]
                if bool(broken.any()):
                    index = int(broken.reshape(-1).nonzero()[0])
                    raise Invalid(
                        f"holds item {index} = {t.reshape(-1)[index].item():g}, which breaks "
                        f"the rule {op} {bound:g}"
                    )


def _bounds(rules: Sequence[Any], hint: Any) -> tuple[float | None, float | None, bool] | None:
    low = high = None
    for rule in rules:
        if isinstance(rule, (at.Gt, at.Ge)):
            low = float(_bound(rule))
        if isinstance(rule, (at.Lt, at.Le)):
            high = float(_bound(rule))
    if low is None and high is None:
        return None
    base = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
    return (low, high, base is int or any(isinstance(r, Whole) for r in rules))


def _bad(rules: Sequence[Any]) -> tuple[Any, ...]:
    """Values of the right type that ``rules`` refuse (for the property tests)."""
    out: list[Any] = []
    finite = next((r for r in rules if isinstance(r, Finite)), None)
    whole = any(isinstance(r, Whole) for r in rules)
    if finite is not None and not whole:
        out += [math.inf, -math.inf] + ([] if finite.nan_ok else [math.nan])
    for rule in rules:
        bound = _bound(rule) if isinstance(rule, (at.Gt, at.Ge, at.Lt, at.Le)) else None
        if bound is None:
            continue
        step = 1 if whole else 1.0
        if isinstance(rule, at.Gt):
            out.append(bound if not whole else int(bound))
        elif isinstance(rule, at.Ge):
            out.append(bound - step)
        elif isinstance(rule, at.Lt):
            out.append(bound if not whole else int(bound))
        elif isinstance(rule, at.Le):
            out.append(bound + step)
    for rule in rules:
        if isinstance(rule, Each):
            out += [[bad] for bad in _bad(_flat(rule.rules))]
    return tuple(out)


@dataclass(frozen=True)
class Declared:
    """What a parameter's declaration says, for the boundary: the rules in words (``allowed``),
    ``check(value)`` (raises :class:`Invalid`), values of the right type it refuses (``bad``)
    and numeric ``bounds`` ``(low, high, integer)`` for the property tests."""

    allowed: str
    check: Callable[[Any], Any] = field(repr=False)
    bad: tuple[Any, ...] = ()
    bounds: tuple[float | None, float | None, bool] | None = None

    def __call__(self, value: Any) -> Any:
        """``check(value)``: the value, or :class:`Invalid` naming the broken rule."""
        return self.check(value)


@dataclass(frozen=True)
class Across:
    """A rule between parameters (``Ordered``, ``AtMost``): ``check({name: value})`` raises
    :class:`Invalid` saying how they disagree."""

    params: tuple[str, ...]
    allowed: str
    check: Callable[[dict[str, Any]], None] = field(repr=False)


def validator_for(hint: Any) -> Declared | None:
    """The check of ``hint``'s declared rules on one value (``None`` when it declares none)."""
    rules = _flat(constraints_of(hint))
    own = [r for r in rules if not isinstance(r, (Ordered, AtMost))]
    if not own:
        return None
    allowed = ", ".join(_rule(r) for r in own)
    return Declared(allowed, lambda value: _check(value, own), _bad(own), _bounds(own, hint))


def relations_for(name: str, hint: Any) -> list[Across]:
    """The rules ``hint`` declares for parameter ``name`` against others."""
    out: list[Across] = []
    for rule in constraints_of(hint):
        if isinstance(rule, Ordered):
            out.append(_ordered(name, rule))
        elif isinstance(rule, AtMost):
            out.append(_at_most(name, rule))
    return out


def _ordered(name: str, rule: Ordered) -> Across:
    def check(values: dict[str, Any]) -> None:
        mine, other = _number(values[name]), _number(values[rule.other])
        if mine is None or other is None or math.isnan(mine) or math.isnan(other):
            return
        if not _OPS[rule.op](mine, other):
            raise Invalid(
                f"are out of order ({name}={values[name]!r}, {rule.other}={values[rule.other]!r}); "
                f"the rule: {name} {rule.op} {rule.other}"
            )

    return Across((rule.other, name), f"{name} {rule.op} {rule.other}", check)


def _at_most(name: str, rule: AtMost) -> Across:
    def check(values: dict[str, Any]) -> None:
        total = values[rule.other]
        limit = rule.measure(total) if rule.measure is not None else total
        mine = _number(values[name])
        if mine is not None and _number(limit) is not None and mine > limit:
            raise Invalid(
                f"do not fit: {name}={values[name]!r} is more than {rule.what or rule.other} "
                f"({limit:g}); the rule: {name} <= {rule.what or rule.other}"
            )

    return Across((name, rule.other), f"{name} <= {rule.what or rule.other}", check)
