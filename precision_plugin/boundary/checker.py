"""The one boundary check: every public function and class checks its arguments where the
user's call enters the plugin (type and value), and the error names the parameter.

```python
@checked(every=at_least(1), strictness=policy_field("strictness"))
def detect(model: torch.nn.Module, *, every: int = 10, strictness: str = "warn") -> ...: ...
```

- **Types** come from the annotations. Each leaf value is checked with beartype's
  ``is_bearable``; unions, literals and containers are walked here so that every item is
  checked (beartype samples one), a lone string never passes for a list of strings (it would
  be read one character at a time) and a ``bool`` never passes for a number.
- **Values** are checked by the validators named per parameter (below), after the type. The
  policy's own validators are reused: :func:`policy_field` checks a value as the policy field
  it stands for, :func:`dtype_name` is the policy's dtype parser, and a parameter typed to take
  a ``PrecisionPolicy`` (a dict, a dtype name) is built into one by the policy itself.
- A validator may take values of another type than the annotation says (``accepts``): the
  parameters validated by :data:`dtype_name` take a ``torch.dtype`` as the policy does.
- **Relations** between parameters (:func:`same_length`, :func:`same_rows`, :func:`same_shape`)
  are checked once each parameter passed its own check: ``lengths`` and ``sums`` of different
  lengths are one error naming both, not an ``IndexError`` (or a ``zip()`` error) deep inside.
- Only arguments the caller passed are checked; a value that *is* the parameter's default (a
  sentinel) passes unchecked, and ``None``, where the annotation allows it, skips the validator.

A wrong argument raises [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError]
before the function body runs, in one line: ``name(): argument 'p' got ..., expected ...``.
- **Results** are checked on the way out against what the return annotation declares
  (``Annotated`` rules only: ``-> Annotated[float, Ge(0), Le(1)]``, a tuple of such items,
  :class:`~precision_plugin.constraints.Brackets` on an interval); a broken one raises
  :class:`BrokenResult`, a bug in the plugin, not in the call. Nothing is checked where the
  return annotation declares no rule.
On a class, ``@checked`` wraps ``__init__`` and every public method defined in the class body
(not a method that overrides a framework's, such as a ``TrainerCallback`` event: the framework
calls those). beartype is imported on the first check, so importing the plugin stays light.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import precision_plugin.constraints as _declared
from precision_plugin.boundary.typecheck import (  # noqa: F401 (the checker's public names)
    _SHOWN,
    COERCIONS,
    Coercion,
    _arms,
    _coercion,
    _describe,
    _fast,
    _kind,
    _mismatch,
    _resolve,
    _show,
    _takes_policy,
    register_coercion,
)
from precision_plugin.dtypes import normalize_dtype
from precision_plugin.errors import PrecisionConfigError, PrecisionPluginError

#: The checker is the package's own machinery, not public API (docs/api.md does not document
#: it): adapters import its names explicitly.
__all__: list[str] = []

F = TypeVar("F", bound=Callable[..., Any])

#: Attribute holding the :class:`Boundary` of a checked function (or of a class's ``__init__``).
SPEC_ATTR = "__precision_boundary__"
#: Not worked out yet (a result check that is ``None`` is one worked out to be nothing).
_UNSET: Any = object()


def real_number(value: Any) -> float | None:
    """``value`` as a float when it is an ``int`` or ``float`` (not a ``bool``; an int too large
    for a float is ``inf``), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


class Invalid(ValueError):
    """Raised by a validator: the message says what was found wrong and what is allowed."""


class BrokenResult(PrecisionPluginError, RuntimeError):
    """A checked function returned a value its return annotation rules out: a bug in the
    plugin (the call was accepted), not in the caller's arguments."""


# -- validators ------------------------------------------------------------------------------


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


def _as_invalid(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check`` with a broken declared rule raised as :class:`Invalid`."""

    def run(value: Any) -> Any:
        try:
            return check(value)
        except _declared.Invalid as exc:
            raise Invalid(str(exc)) from None

    return run


def _chain(first: Validator, then: Validator | None) -> Validator:
    """``first``'s check, then ``then``'s on what it returned (one validator, both rules)."""
    if then is None:
        return first
    import dataclasses

    return dataclasses.replace(
        then,
        allowed=f"{first.allowed}; {then.allowed}" if then.allowed else first.allowed,
        check=lambda value: then.check(first.check(value)),
        bad=first.bad + then.bad,
        bounds=first.bounds or then.bounds,
    )


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


def _capability(value: Any) -> Any:
    ok = (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 for v in value)
    )
    if value is not None and not ok:
        raise Invalid(
            "is not a GPU compute capability; pass a (major, minor) tuple of integers such as "
            "(8, 0) for an A100 or (9, 0) for an H100, or None for no GPU"
        )
    return value


#: A CUDA compute capability ``(major, minor)``, or ``None`` (no GPU).
gpu_capability = Validator(
    "a (major, minor) tuple such as (8, 0), or None", _capability, ("9.0", (9,), (9, 0, 1), 9.0)
)


def _torch_device(value: Any) -> Any:
    import torch

    try:
        torch.device(value)
    except (RuntimeError, TypeError, ValueError, OverflowError) as exc:  # 2**70: ValueError
        raise Invalid(
            f"is not a torch device ({' '.join(str(exc).split())}); pass 'cuda', 'cpu', "
            f"'cuda:1' or a torch.device"
        ) from None
    return value


#: A device name torch parses (``"cpu"``, ``"cuda:1"``) or a ``torch.device``.
torch_device = Validator("a torch device such as 'cpu' or 'cuda:1'", _torch_device, ("gpu0", ""))


def device_problem(device: Any) -> str | None:
    """Why torch cannot run on ``device`` on this machine ("it is not a torch device (...)",
    "torch sees no CUDA GPU (torch 2.x)", ...); ``None`` where it can. Device types other than
    cpu, cuda, mps and xpu are refused: nothing here runs on them."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError, OverflowError) as exc:
        return f"it is not a torch device ({' '.join(str(exc).split())})"
    xpu = getattr(torch, "xpu", None)
    counts = {
        "cpu": 1,
        "cuda": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "mps": 1 if torch.backends.mps.is_available() else 0,
        "xpu": xpu.device_count() if xpu is not None and xpu.is_available() else 0,
    }
    if parsed.type not in counts:
        return "it is not a device the plugin runs on (cpu, cuda, mps or xpu)"
    found = counts[parsed.type]
    if found == 0:
        label = "CUDA GPU" if parsed.type == "cuda" else f"{parsed.type} device"
        return f"torch sees no {label} (torch {torch.__version__})"
    if parsed.index is not None and parsed.index >= found:
        return f"torch sees {found} {parsed.type} device(s) (indices 0..{found - 1})"
    return None


def _usable_device(value: Any) -> Any:
    problem = device_problem(value)
    if problem is not None:
        raise Invalid(
            f"cannot be used on this machine: {problem}; pass 'cpu' or a device torch sees here"
        )
    return value


#: A device torch parses and has on this machine (``"cuda"`` without a CUDA GPU is refused
#: here, not by torch's assertion at the first ``.to()``).
usable_device = Validator(
    "a torch device this machine has, such as 'cpu' or 'cuda:0'", _usable_device, ("gpu0", "")
)


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


def existing_path(kind: str) -> Validator:
    """A path (``str`` or ``os.PathLike``) to an existing ``kind`` (``"file"`` or ``"folder"``)."""

    def check(value: Any) -> Any:
        path = os.path.expanduser(os.fspath(value))
        if not str(path).strip():
            raise Invalid(f"is empty; pass the path of a {kind}")
        exists = os.path.isfile(path) if kind == "file" else os.path.isdir(path)
        if not exists:
            found = "does not exist" if not os.path.exists(path) else f"is not a {kind}"
            raise Invalid(f"{found}; pass the path of an existing {kind}")
        return value

    return Validator(f"the path of an existing {kind}", check, ("", "no/such/path"))


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


# -- relations between parameters -----------------------------------------------------------


@dataclass(frozen=True)
class Relation:
    """A check across parameters, run once each of them passed its own check (on the values
    the validators return): ``check(values)`` gets ``{name: value}`` of those passed and not
    ``None`` (two at least) and raises :class:`Invalid` saying how they disagree."""

    params: tuple[str, ...]
    allowed: str
    check: Callable[[dict[str, Any]], None] = field(repr=False)


def _sizes(values: dict[str, Any], size: Callable[[Any], Any]) -> str | None:
    found = {name: size(value) for name, value in values.items()}
    if len(set(found.values())) < 2:
        return None
    return ", ".join(f"{name}: {value}" for name, value in found.items())


def same_length(*params: str, fix: str) -> Relation:
    """``params`` hold as many items each (one per sequence, per field...); ``fix`` is shown."""

    def check(values: dict[str, Any]) -> None:
        differ = _sizes(values, len)
        if differ is not None:
            raise Invalid(f"differ in length ({differ}); {fix}")

    return Relation(params, f"{' and '.join(params)} of the same length", check)


def _row_lengths(value: Any) -> list[int]:
    """The length of each row of a ``(B, T)`` tensor or array, or of nested sequences."""
    if hasattr(value, "ndim") and hasattr(value, "shape"):
        if value.ndim != 2:
            return [int(n) for n in value.shape]
        rows, width = (int(n) for n in value.shape)
        return [width] * rows
    rows = value.tolist() if hasattr(value, "tolist") else value
    return [len(row) if hasattr(row, "__len__") else -1 for row in rows]


def _rows_shown(value: Any, lengths: list[int]) -> str:
    if hasattr(value, "ndim") and hasattr(value, "shape"):
        return f"shape {tuple(int(n) for n in value.shape)}"
    more = ", ..." if len(lengths) > 4 else ""
    return f"{len(lengths)} rows of {', '.join(map(str, lengths[:4]))}{more} tokens"


def same_rows(*params: str, fix: str) -> Relation:
    """``params`` (``(B, T)`` tables, or one sequence of values per row) hold as many rows each,
    each row as long as the others' (the same tokens on every side); ``fix`` is shown."""

    def check(values: dict[str, Any]) -> None:
        lengths = {name: _row_lengths(value) for name, value in values.items()}
        if len({tuple(v) for v in lengths.values()}) > 1:
            differ = "; ".join(
                f"{name}: {_rows_shown(values[name], v)}" for name, v in lengths.items()
            )
            raise Invalid(f"differ in shape ({differ}); {fix}")

    return Relation(params, f"{', '.join(params)} of one shape", check)


def same_shape(*params: str, fix: str) -> Relation:
    """``params`` (tensors, after their validators) have one shape; ``fix`` is shown."""

    def check(values: dict[str, Any]) -> None:
        differ = _sizes(values, lambda value: tuple(value.shape))
        if differ is not None:
            raise Invalid(f"differ in shape ({differ}); {fix}")

    return Relation(params, f"{' and '.join(params)} of one shape", check)


# -- the decorator ---------------------------------------------------------------------------


def checked(*target: Any, **validators: Validator) -> Any:
    """Check the arguments of a function, or of a class's ``__init__`` and public methods, at
    the boundary (see the module docstring); ``validators`` maps parameter names to
    :class:`Validator` value checks, and positional :class:`Relation` s (``same_length``,
    ``same_shape``) check parameters against each other:
    ``@checked(same_length("lengths", "sums", fix=...), lengths=..., sums=...)``."""
    relations = tuple(t for t in target if isinstance(t, Relation))
    objects = [t for t in target if not isinstance(t, Relation)]
    if len(objects) > 1 or (objects and (relations or validators)):
        raise TypeError("@checked takes the function, or relations and validators, not both")

    def decorate(obj: Any) -> Any:
        if isinstance(obj, type):
            return _check_class(obj, validators, relations=relations)
        return _wrap(obj, validators, relations=relations)

    return decorate(objects[0]) if objects else decorate


def self_checked(cls: type) -> type:
    """``@checked`` for a config class whose ``__post_init__`` validates every field itself,
    types and values (the policy's sections, ``ProbeConfig``): the boundary binds the call (an
    unknown argument gets a "did you mean") and checks the public methods; the fields are left
    to the class, which accepts more than their annotations say (``dtype="fp16"``, a section as
    a dict)."""
    _check_class(cls, {}, typed=False)
    return cls


def boundary_of(obj: Any) -> Boundary | None:
    """The :class:`Boundary` of a checked function, method or class (``None`` when unchecked)."""
    if isinstance(obj, type):
        obj = vars(obj).get("__init__")
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    return getattr(obj, SPEC_ATTR, None)


@dataclass
class Boundary:
    """What ``@checked`` checks for one function: its name in errors, its parameters' types
    and validators."""

    name: str
    func: Callable[..., Any]
    validators: dict[str, Validator]
    owner: type | None = None
    skip_first: bool = False
    #: False when the function checks its own arguments' types (``self_checked``).
    typed: bool = True
    #: Checks across parameters (``same_length``, ``same_shape``), after each one's own.
    relations: tuple[Relation, ...] = ()
    _signature: inspect.Signature | None = field(default=None, repr=False)
    _hints: dict[str, Any] | None = field(default=None, repr=False)
    _plans: dict[str, Any] = field(default_factory=dict, repr=False)
    #: Relations the annotations declare (``Ordered``, ``AtMost``: precision_plugin.constraints).
    _across: tuple[Relation, ...] = field(default=(), repr=False)
    #: The result's check (``None``: the return annotation declares no rule), worked out once.
    _result: Any = field(default=_UNSET, repr=False)

    @property
    def signature(self) -> inspect.Signature:
        """The function's own signature."""
        if self._signature is None:
            self._signature = inspect.signature(self.func)
        return self._signature

    @property
    def parameters(self) -> list[inspect.Parameter]:
        """The parameters a caller passes (``self``/``cls`` left out)."""
        params = list(self.signature.parameters.values())
        return params[1:] if self.skip_first else params

    def _namespace(self) -> dict[str, Any]:
        module = inspect.getmodule(self.owner or self.func)
        namespace = dict(vars(module)) if module is not None else {}
        namespace.update(getattr(self.func, "__globals__", {}))
        if self.owner is not None:
            namespace.setdefault(self.owner.__name__, self.owner)
        return namespace

    def hints(self) -> dict[str, Any]:
        """Each parameter's resolved annotation (``Any`` where there is none); raises
        ``NameError`` for one that cannot be resolved (the test of the public API asserts
        there is none)."""
        if self._hints is None:
            namespace = self._namespace()
            hints: dict[str, Any] = {}
            for param in self.parameters:
                resolved = _resolve(param.annotation, namespace)
                self._declare(param.name, resolved)
                hints[param.name] = _declared.plain(resolved)
            self._hints = hints
        return self._hints

    def _declare(self, name: str, hint: Any) -> None:
        """Add what ``hint`` declares (``Annotated[float, Finite(), Gt(0)]``) to the parameter's
        validator (the declared rules first, on the value as passed) and to the relations."""
        rule = _declared.validator_for(hint)
        if rule is not None:
            own = Validator(rule.allowed, _as_invalid(rule.check), rule.bad, rule.bounds)
            self.validators[name] = _chain(own, self.validators.get(name))
        for across in _declared.relations_for(name, hint):
            self._across += (Relation(across.params, across.allowed, _as_invalid(across.check)),)

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        """Bind and check a call's arguments; return them with validators' conversions."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise PrecisionConfigError(self._call_error(exc, kwargs)) from None
        try:
            hints = self.hints() if self.typed else {}
        except NameError:  # an unresolvable annotation: check the values only
            hints = {}
        changed = False
        params = self.signature.parameters
        first = next(iter(params), None) if self.skip_first else None
        for name, value in bound.arguments.items():
            if name == first:
                continue
            param = params[name]
            hint = hints.get(name, Any)
            if param.kind is param.VAR_POSITIONAL:
                new = tuple(self._one(f"{name}[{i}]", v, hint, param) for i, v in enumerate(value))
            elif param.kind is param.VAR_KEYWORD:
                new = {k: self._one(k, v, hint, param) for k, v in value.items()}
            else:
                new = self._one(name, value, hint, param)
            if new is not value:
                bound.arguments[name] = new
                changed = True
        for relation in (*self.relations, *self._across):
            self._relate(relation, bound.arguments)
        return (bound.args, bound.kwargs) if changed else (args, kwargs)

    def result_check(self) -> Callable[[Any], None] | None:
        """The check of the result against the return annotation's declared rules (on the
        whole value, and on each item of a fixed-length ``tuple[...]``); ``None`` where it
        declares none (or cannot be resolved), so an undeclared result costs nothing."""
        if self._result is _UNSET:
            self._result = self._result_rules()
        return self._result

    def _result_rules(self) -> Callable[[Any], None] | None:
        annotation = self.signature.return_annotation
        if annotation is inspect.Signature.empty or annotation in (None, "None"):
            return None
        try:
            hint = _resolve(annotation, self._namespace())
        except Exception:  # an annotation only a type checker resolves
            return None
        whole = _declared.validator_for(hint)
        inner = _declared.plain(hint)
        args = typing.get_args(inner) if typing.get_origin(inner) is tuple else ()
        items = [_declared.validator_for(a) for a in args if a is not Ellipsis]
        if Ellipsis in args or not any(items):
            items = []
        if whole is None and not items:
            return None

        def check(result: Any) -> None:
            try:
                if items and isinstance(result, tuple) and len(result) == len(items):
                    for i, (rule, item) in enumerate(zip(items, result, strict=True)):
                        if rule is not None:
                            try:
                                rule(item)
                            except _declared.Invalid as exc:
                                raise _declared.Invalid(
                                    f"holds {_show(item)} at [{i}], which {exc}"
                                ) from None
                if whole is not None:
                    whole(result)
            except _declared.Invalid as exc:
                reason = " ".join(str(exc).split()).rstrip(".")
                raise BrokenResult(
                    f"{self.name} returned {_show(result)}, which {reason}: a bug in "
                    f"precision_plugin (its result breaks the rule its return annotation "
                    f"declares), not in the call; please report it with this line."
                ) from None

        return check

    def _relate(self, relation: Relation, arguments: dict[str, Any]) -> None:
        values = {
            name: arguments[name]
            for name in relation.params
            if name in arguments and arguments[name] is not None
        }
        if len(values) < 2:
            return
        try:
            relation.check(values)
        except Invalid as exc:
            names = [repr(name) for name in values]
            listed = ", ".join(names[:-1]) + " and " + names[-1]
            reason = " ".join(str(exc).split()).rstrip(".")
            raise PrecisionConfigError(f"{self.name}: arguments {listed} {reason}.") from None

    def _plan(self, param: str, hint: Any) -> tuple[Callable[[Any], bool], bool, Any]:
        """(a fast conformance test, whether None passes as "not given", the validator) of one
        parameter, worked out once."""
        plan = self._plans.get(param)
        if plan is None:
            validator = self.validators.get(param)
            if validator is None and _takes_policy(hint):
                validator = policy_arg
            none_ok = any(a is None or a is type(None) for a in _arms(hint))
            plan = self._plans[param] = (_fast(hint), none_ok, validator)
        return plan

    def _one(self, name: str, value: Any, hint: Any, param: inspect.Parameter) -> Any:
        if value is param.default:
            return value  # the function's own default (a sentinel, None) passed on explicitly
        fast, none_ok, validator = self._plan(param.name, hint)
        problem = None if fast(value) else _mismatch(value, hint)
        accepts = validator.accepts if validator is not None else None
        if problem is not None and accepts is not None and accepts(value):
            problem = None  # another type the validator takes (a torch.dtype for a name)
        if problem is not None:
            where, item, expected = problem
            found = f"item {where} is {_kind(item)}" if where else f"got {_kind(item)}"
            wanted = _describe(hint)
            if not where and validator is not None and validator.accepts_what:
                expected = wanted = _also(wanted, validator.accepts_what)
            if not where and _takes_policy(hint) and str in _arms(hint):
                tail = ", a dtype name or None" if "None" in wanted else " or a dtype name"
                expected = wanted = "a PrecisionPolicy, a dict of its keys" + tail
            fix = f"pass {wanted} as {name}"
            custom = self.validators.get(param.name)
            if custom is not None and custom.fix:
                fix = custom.fix
            elif isinstance(item, str) and expected.startswith(("a list", "a tuple", "a set")):
                fix = f"a lone string would be read one character at a time; pass [{item!r}]"
            raise PrecisionConfigError(
                f"{self.name}: argument {name!r} {found}, expected {expected} (fix: {fix})."
            )
        if value is None and none_ok:
            return value  # the annotation names None: "not given", for the function to resolve
        if validator is None:
            return value
        try:
            return validator(value)
        except (Invalid, PrecisionConfigError) as exc:
            reason = " ".join(str(exc).split()).rstrip(".")
            raise PrecisionConfigError(
                f"{self.name}: argument {name!r} got {_show(value)}, which {reason}."
                if isinstance(exc, Invalid)
                else f"{self.name}: argument {name!r} got {_show(value)}: {reason}."
            ) from None

    def _call_error(self, exc: TypeError, kwargs: dict[str, Any]) -> str:
        known = [p.name for p in self.parameters]
        unknown = [k for k in kwargs if k not in self.signature.parameters]
        hint = ""
        if unknown:
            close = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
        return (
            f"{self.name}: {exc}.{hint} Call it as "
            f"{self.name.removesuffix('()')}{_signature_text(self)}."
        )


def _also(wanted: str, other: str) -> str:
    """``"a str or None"`` and ``"a torch.dtype"`` -> ``"a str, a torch.dtype or None"``."""
    if wanted.endswith(" or None"):
        return f"{wanted.removesuffix(' or None')}, {other} or None"
    return f"{wanted} or {other}"


def _signature_text(spec: Boundary) -> str:
    params = [p.replace(annotation=inspect.Parameter.empty) for p in spec.parameters]
    return str(spec.signature.replace(parameters=params, return_annotation=inspect.Signature.empty))


def _wrap(
    func: F,
    validators: dict[str, Validator],
    owner: type | None = None,
    typed: bool = True,
    *,
    relations: tuple[Relation, ...] = (),
) -> F:
    if isinstance(func, (classmethod, staticmethod)):
        return type(func)(_wrap(func.__func__, validators, owner))  # type: ignore[return-value]
    params = list(inspect.signature(func).parameters)
    unknown = (set(validators) | {n for r in relations for n in r.params}) - set(params)
    if unknown:
        raise TypeError(f"@checked: {func.__qualname__} has no parameter {sorted(unknown)}")
    qualname = func.__qualname__.rsplit("<locals>.", 1)[-1]
    is_method = owner is not None or "." in qualname
    skip_first = is_method and bool(params) and params[0] in ("self", "cls")
    name = qualname.removesuffix(".__init__") + "()"
    spec = Boundary(name, func, dict(validators), owner, skip_first, typed, relations)

    @functools.wraps(func)
    def checked_call(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = spec.check(args, kwargs)
        result = func(*args, **kwargs)
        check = spec.result_check()
        if check is not None:
            check(result)
        return result

    setattr(checked_call, SPEC_ATTR, spec)
    return checked_call  # type: ignore[return-value]


def _check_class(
    cls: type,
    validators: dict[str, Validator],
    typed: bool = True,
    *,
    relations: tuple[Relation, ...] = (),
) -> type:
    init = vars(cls).get("__init__")
    if init is not None and boundary_of(init) is None:
        cls.__init__ = _wrap(init, validators, cls, typed, relations=relations)  # type: ignore[misc]
    elif validators or relations:
        raise TypeError(f"@checked: {cls.__qualname__} defines no __init__ of its own")
    for name, member in list(vars(cls).items()):
        if (name.startswith("_") and name != "__call__") or _overrides_framework(cls, name):
            continue
        func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if isinstance(func, types.FunctionType) and boundary_of(func) is None:
            setattr(cls, name, _wrap(member, {}, cls))
    return cls


def _overrides_framework(cls: type, name: str) -> bool:
    """True when ``name`` overrides a method of a base class outside this package."""
    return any(
        name in vars(base) and not base.__module__.startswith("precision_plugin")
        for base in cls.__mro__[1:]
        if base is not object
    )
