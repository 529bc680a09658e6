"""The generic value checks ``@checked`` runs after the type check, one :class:`Validator` per
parameter: numbers in a range (:func:`in_range`, :func:`at_least`, :func:`positive`), a choice
(:func:`one_of`), a non-empty value, a policy field or dtype name read by the policy's own
parsers (:func:`policy_field`, :data:`dtype_name`, :data:`policy_arg`), a framework object by
its attributes (:func:`duck`), a version number, every item of a collection (:func:`each`), a
model, a dtype, a 1-D list of numbers.

A check raises :class:`~precision_plugin._base.constraints.Invalid` (the one class, shared with the
declared rules) saying what is allowed; the checker names the parameter and the value.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from precision_plugin._base.boundary.typecheck import _coercion, _show
from precision_plugin._base.constraints import Invalid
from precision_plugin._base.dtypes import normalize_dtype


def real_number(value: Any) -> float | None:
    """``value`` as a float when it is an ``int`` or ``float`` (not a ``bool``; an int too large
    for a float is ``inf``), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


@dataclass(frozen=True)
class Validator:
    """A value check run after the type check.

    ``check(value)`` returns the value to pass on (possibly normalised) or raises
    :class:`Invalid`/:class:`PrecisionConfigError` saying what is allowed. ``allowed`` describes
    the valid values in words; ``bad`` lists values of the right type it refuses (for tests).
    """

    allowed: str
    check: Callable[[Any], Any] = field(repr=False)
    bad: tuple[Any, ...] = ()
    #: Bounds, for numeric validators: ``(low, high, integer)``.
    bounds: tuple[float | None, float | None, bool] | None = None
    #: The fix a wrong *type* gets instead of "pass <the annotation>".
    fix: str = ""
    #: Values of another type than the annotation's that the validator takes all the same
    #: (``accepts(value)`` is True; e.g. a ``torch.dtype`` where a dtype name is annotated),
    #: and those values in words, for the error of a wrong type.
    accepts: Callable[[Any], bool] | None = field(default=None, repr=False)
    accepts_what: str = ""

    def __call__(self, value: Any) -> Any:
        return self.check(value)


def fix_hint(fix: str) -> Validator:
    """No value check: ``fix`` replaces the generic fix of a wrong type for this parameter
    (``"read a JSON file with load_config(path) first"``)."""
    return Validator("", lambda value: value, (), None, fix)


def in_range(
    low: float | None = None,
    high: float | None = None,
    *,
    integer: bool = False,
    why: str = "",
) -> Validator:
    """A finite number in ``[low, high]`` (either side open when ``None``); ``why`` is shown."""
    kind = "an integer" if integer else "a number"
    if low is not None and high is not None:
        allowed = f"{kind} in [{low:g}, {high:g}]"
    elif low is not None:
        allowed = f"{kind} >= {low:g}"
    elif high is not None:
        allowed = f"{kind} <= {high:g}"
    else:
        allowed = f"a finite {kind.split()[-1]}"
    if why:
        allowed += f" ({why})"

    def check(value: Any) -> Any:
        number = real_number(value)
        if number is None:
            raise Invalid(f"expected {allowed}")
        if integer and not isinstance(value, int):
            raise Invalid(f"expected {allowed}, not a fraction")
        if not math.isfinite(number):
            raise Invalid(f"is not a finite number; allowed: {allowed}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise Invalid(f"is out of range; allowed: {allowed}")
        return value

    bad: list[Any] = [math.nan, math.inf, -math.inf] if not integer else []
    if low is not None:
        bad.append(int(low) - 1 if integer else low - 1.0)
    if high is not None:
        bad.append(int(high) + 1 if integer else high + 1.0)
    return Validator(allowed, check, tuple(bad), (low, high, integer))


def at_least(low: float, *, integer: bool = True, why: str = "") -> Validator:
    """An integer (or, with ``integer=False``, a finite number) ``>= low``."""
    return in_range(low, None, integer=integer, why=why)


def positive(why: str = "") -> Validator:
    """A finite number ``> 0``."""
    allowed = "a finite number > 0" + (f" ({why})" if why else "")
    base = in_range(why=why)

    def check(value: Any) -> Any:
        base(value)
        if not value > 0:
            raise Invalid(f"is out of range; allowed: {allowed}")
        return value

    return Validator(allowed, check, (0, 0.0, -1.0, math.nan, math.inf))


def one_of(*choices: Any) -> Validator:
    """One of ``choices`` (compared by type and value: ``True`` is not ``1``)."""
    allowed = "one of " + ", ".join(repr(c) for c in choices)

    def check(value: Any) -> Any:
        if not any(type(value) is type(c) and value == c for c in choices):
            lowered = {str(c).lower(): c for c in choices}  # 'VERL' means 'verl'
            key = str(value).strip().lower()
            close = [key] if key in lowered else difflib.get_close_matches(key, list(lowered), n=1)
            hint = f" (did you mean {lowered[close[0]]!r}?)" if close else ""
            raise Invalid(f"is not allowed{hint}; choose {allowed}")
        return value

    bad = ("", "nosuch") if all(isinstance(c, str) for c in choices) else ()
    return Validator(allowed, check, bad)


def non_empty(what: str = "") -> Validator:
    """A non-empty (not blank) string, or a non-empty collection."""
    allowed = what or "a non-empty value"

    def check(value: Any) -> Any:
        seen = os.fspath(value) if isinstance(value, os.PathLike) else value
        empty = not seen.strip() if isinstance(seen, str) else len(seen) == 0
        if empty:
            raise Invalid(f"is empty; pass {allowed}")
        return value

    return Validator(allowed, check, ("", "  "))


def policy_field(path: str) -> Validator:
    """The value as the policy field ``path`` (``"strictness"``, ``"overflow.margin_bits"``)
    would take it: the policy's own type and range checks; returns the normalised value."""

    def check(value: Any) -> Any:
        return _coercion().field_value(path, value)

    return Validator(f"a valid policy {path}", check, _POLICY_BAD.get(path, ()))


#: Values of the right type that each policy field refuses (for tests and docs).
_POLICY_BAD: dict[str, tuple[Any, ...]] = {
    "strictness": ("strict", "", "Error"),
    "dtype": ("fp8", "auto", ""),
    "overflow.margin_bits": (-1.0, math.nan, math.inf, 17.0),
    "overflow.detect": ("on", "", "never"),
    "overflow.detect_every": (0, -1),
    "overflow.keep_fp32_modules": ("lm_head", [""], ["  "]),
}


def _dtype(value: Any) -> str:
    return normalize_dtype(value)


#: A precision name (``float16``/``bfloat16``/``float32``, aliases, or a ``torch.dtype``),
#: parsed by the policy's ``normalize_dtype``; passes the canonical name on.
dtype_name = Validator(
    "float16, bfloat16 or float32 (or an alias)",
    _dtype,
    ("fp8", "auto", ""),
    accepts=lambda value: type(value).__module__ == "torch" and type(value).__name__ == "dtype",
    accepts_what="a torch.dtype",
)


def _policy(value: Any) -> Any:
    return _coercion().build(value)


#: A ``PrecisionPolicy``, a dict of its keys or a dtype name, built into a policy. Applied to
#: every parameter whose annotation takes a ``PrecisionPolicy``.
policy_arg = Validator("a PrecisionPolicy, a dict of its keys or a dtype name", _policy, ("fp8",))


def duck(*attributes: str, what: str) -> Validator:
    """An object with every one of ``attributes`` (a framework object the plugin does not
    import to check its class); ``what`` names it for the error."""

    def check(value: Any) -> Any:
        missing = [a for a in attributes if not hasattr(value, a)]
        if missing:
            raise Invalid(f"is not {what} (it has no {', '.join(missing)}); pass {what}")
        return value

    return Validator(what, check, (None, "x", 0, object()), fix=f"pass {what}")


def version_text(what: str, example: str = "0.9.1") -> Validator:
    """A version number (``"0.9.1"``, a ``packaging`` ``Version``), or ``None``; ``example`` is
    the version the message suggests (one the adapter supports)."""

    def check(value: Any) -> Any:
        from packaging.version import InvalidVersion, Version

        if value is None or isinstance(value, Version):
            return value
        try:
            Version(str(value))
        except InvalidVersion:
            raise Invalid(
                f"is not a version number; pass {what}'s version such as '{example}', or leave "
                f"it out for the installed one"
            ) from None
        return value

    return Validator(f"a {what} version such as '{example}'", check, ("banana", "", "latest"))


def each(item: Validator) -> Validator:
    """Every item of a collection passes ``item`` (the value is passed on unchanged)."""

    def check(value: Any) -> Any:
        for i, v in enumerate(value):
            try:
                item(v)
            except Invalid as exc:
                reason = " ".join(str(exc).split()).rstrip(".")
                raise Invalid(f"has {_show(v)} at [{i}] ({reason})") from None
        return value

    return Validator(f"items each {item.allowed}", check, tuple([b] for b in item.bad))


def _torch_module(value: Any) -> Any:
    import torch

    if not isinstance(value, torch.nn.Module):
        raise Invalid("is not a torch.nn.Module; pass the model (a torch.nn.Module)")
    return value


#: A ``torch.nn.Module`` (the model), for a parameter annotated ``Any`` so that the module
#: imports torch lazily.
torch_module = Validator(
    "a torch.nn.Module", _torch_module, (None, "model", 0), fix="pass the model (a torch.nn.Module)"
)


def _dtype_like(value: Any) -> Any:
    if isinstance(value, str) or dtype_name.accepts(value):  # type: ignore[misc]
        return value
    raise Invalid("is not a dtype; pass a torch.dtype (torch.float16) or its name ('float16')")


#: Any torch dtype or dtype name (a dtype something ran in, not only the policy's three).
dtype_like = Validator("a torch.dtype or its name", _dtype_like, (3, object()))


def numbers_1d(what: str, *, low: float | None = None) -> Validator:
    """A 1-D sequence (list, tuple, tensor) of real numbers, as a float64 tensor; each item
    ``>= low`` when ``low`` is given (NaN refused then too); ``what`` names one item."""
    allowed = f"a 1-D list or tensor of numbers ({what})"

    def check(value: Any) -> Any:
        import torch

        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise Invalid(f"is not a list of numbers; pass {allowed}")
        try:
            t = torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as exc:
            first = " ".join(str(exc).split())
            raise Invalid(f"is not a list of numbers ({first}); pass {allowed}") from None
        if t.dim() != 1:
            raise Invalid(f"has shape {tuple(t.shape)}; pass {allowed}")
        if low is not None and t.numel() and not bool((t >= low).all()):
            bad = t[~(t >= low)][0].item()
            raise Invalid(f"holds {bad:g}; every item must be a number >= {low:g} ({what})")
        return t

    return Validator(allowed, check, ("x", [[1.0]], 5) + (([-1.0],) if low == 0 else ()))
