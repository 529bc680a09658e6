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
  :class:`~precision_plugin._base.constraints.Brackets` on an interval); a broken one raises
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
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import precision_plugin._base.constraints as _declared
from precision_plugin._base.boundary.relations import Relation
from precision_plugin._base.boundary.typecheck import (
    _arms,
    _describe,
    _fast,
    _kind,
    _mismatch,
    _resolve,
    _show,
    _takes_policy,
)
from precision_plugin._base.boundary.validators import Validator, policy_arg
from precision_plugin._base.constraints import Invalid
from precision_plugin.errors import PrecisionConfigError, PrecisionPluginError

F = TypeVar("F", bound=Callable[..., Any])

#: Attribute holding the :class:`Boundary` of a checked function (or of a class's ``__init__``).
SPEC_ATTR = "__precision_boundary__"
#: Not worked out yet (a result check that is ``None`` is one worked out to be nothing).
_UNSET: Any = object()


class BrokenResult(PrecisionPluginError, RuntimeError):
    """A checked function returned a value its return annotation rules out: a bug in the
    plugin (the call was accepted), not in the caller's arguments."""


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
    #: Relations the annotations declare (``Ordered``, ``AtMost``:
    #: precision_plugin._base.constraints).
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
            own = Validator(rule.allowed, rule.check, rule.bad, rule.bounds)
            self.validators[name] = _chain(own, self.validators.get(name))
        for across in _declared.relations_for(name, hint):
            self._across += (Relation(across.params, across.allowed, across.check),)

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
                            except Invalid as exc:
                                raise Invalid(
                                    f"holds {_show(item)} at [{i}], which {exc}"
                                ) from None
                if whole is not None:
                    whole(result)
            except Invalid as exc:
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
