"""The checker's type engine: whether a value fits an annotation, the message when it does not,
and how a registered configuration type (the policy) builds itself from a user's value.

Imports nothing of the package but errors (through the package) and the dtype vocabulary.
"""

from __future__ import annotations

import collections.abc as cabc
import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_SHOWN = 60  # characters of a value quoted in an error


@dataclass(frozen=True)
class Coercion:
    """How a configuration type registered with the checker turns a user's value into itself.

    ``build`` takes an instance, a dict of its keys or a dtype name and returns an instance;
    ``field_value`` takes a dotted field path and a value and returns the value as that field
    would hold it (raising ``PrecisionConfigError``). The policy registers itself
    (``precision_plugin.policy``), as PEFT registers its methods: the checker imports nothing
    above errors and the dtype vocabulary.
    """

    cls: type
    build: Callable[[Any], Any]
    field_value: Callable[[str, Any], Any]


#: The registered coercions by role; ``"policy"`` is ``PrecisionPolicy``'s.
COERCIONS: dict[str, Coercion] = {}


def register_coercion(role: str, coercion: Coercion) -> None:
    """Register how parameters of ``coercion.cls`` are built (``role="policy"`` drives
    :data:`policy_arg` and :func:`policy_field`)."""
    COERCIONS[role] = coercion


def _coercion(role: str = "policy") -> Coercion:
    found = COERCIONS.get(role)
    if found is None:  # precision_plugin/__init__.py imports the policy, so this means a bug
        raise RuntimeError(
            f"precision_plugin._base.boundary: no {role!r} coercion registered; import "
            f"precision_plugin (which imports precision_plugin.policy) first."
        )
    return found


# -- types -----------------------------------------------------------------------------------


def _resolve(annotation: Any, namespace: dict[str, Any]) -> Any:
    if annotation is inspect.Parameter.empty:
        return Any
    if isinstance(annotation, str):
        return eval(annotation, namespace)
    return annotation


def _takes_policy(hint: Any) -> bool:
    policy = COERCIONS.get("policy")
    return policy is not None and any(arm is policy.cls for arm in _arms(hint))


def _arms(hint: Any) -> list[Any]:
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _arms(typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(hint) for a in _arms(arg)]
    return [hint]


_SEQUENCES = {
    list,
    tuple,
    set,
    frozenset,
    cabc.Sequence,
    cabc.MutableSequence,
    cabc.Iterable,
    cabc.Collection,
    cabc.Set,
    cabc.MutableSet,
}
_MAPPINGS = {dict, cabc.Mapping, cabc.MutableMapping}


def _fast(hint: Any) -> Callable[[Any], bool]:
    """A quick test that ``value`` conforms to ``hint`` (True), compiled once per parameter;
    False sends the value to :func:`_mismatch`, which finds what does not conform and says it."""
    if hint is Any or hint is object:
        return lambda value: True
    arms = _arms(hint)
    if len(arms) > 1:
        tests = [_fast(arm) for arm in arms]
        return lambda value: any(test(value) for test in tests)
    hint = arms[0]
    origin = typing.get_origin(hint) or hint
    args = typing.get_args(hint)
    if hint is None or hint is type(None):
        return lambda value: value is None
    if origin is typing.Literal:
        return lambda value: any(type(value) is type(a) and value == a for a in args)
    if hint is int:
        return lambda value: isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in _SEQUENCES and args and not (origin is tuple and args[-1] is not Ellipsis):
        item = _fast(args[0])
        kinds = (list, tuple) if origin is tuple else origin
        return lambda value: (
            isinstance(value, kinds)
            and not isinstance(value, (str, bytes))
            and isinstance(value, cabc.Collection)
            and all(item(v) for v in value)
        )
    if origin in _MAPPINGS and len(args) == 2:
        key, item = _fast(args[0]), _fast(args[1])
        return lambda value: (
            isinstance(value, cabc.Mapping) and all(key(k) and item(v) for k, v in value.items())
        )
    if isinstance(hint, type) and not args and not getattr(hint, "_is_protocol", False):
        return lambda value: isinstance(value, hint)
    return lambda value: False  # the general case: _mismatch (beartype) decides


def _mismatch(value: Any, hint: Any, where: str = "") -> tuple[str, Any, str] | None:
    """``None`` when ``value`` conforms to ``hint``, else ``(where, item, expected)``: the path
    of the first item that does not (``""`` for the value itself), that item, and what was
    expected there in words."""
    if hint is Any or hint is object:
        return None
    arms = _arms(hint)
    if len(arms) > 1:
        results = [_mismatch(value, arm, where) for arm in arms]
        if any(r is None for r in results):
            return None
        deepest = max(results, key=lambda r: len(r[0]))  # type: ignore[arg-type,return-value]
        if deepest[0] != where:  # the container fits an arm; one of its items does not
            return deepest
        return where, value, _describe(hint)
    hint = arms[0]
    origin = typing.get_origin(hint) or hint
    args = typing.get_args(hint)
    if origin is typing.Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return None
        return where, value, _describe(hint)
    if hint is None or hint is type(None):
        return None if value is None else (where, value, "None")
    if isinstance(value, bool) and hint in (int, float, complex):
        return where, value, _describe(hint)
    if origin in _SEQUENCES:
        variadic = origin is tuple and len(args) == 2 and args[1] is Ellipsis
        if variadic and isinstance(value, list):
            origin = list  # a list where a tuple of any length is declared: what users pass
        if isinstance(value, (str, bytes)) or not _bearable(value, origin):
            return where, value, _describe(hint)
        if origin is tuple and args and not variadic:
            if len(value) != len(args):
                return where, value, _describe(hint)
            items = list(zip(value, args, strict=True))
        elif args and isinstance(value, cabc.Collection):
            items = [(v, args[0]) for v in value]
        else:
            return None  # an iterator: its items cannot be checked without consuming it
        for i, (item, item_hint) in enumerate(items):
            found = _mismatch(item, item_hint, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    if origin in _MAPPINGS:
        if not _bearable(value, origin):
            return where, value, _describe(hint)
        if len(args) == 2:
            for key, item in value.items():
                found = _mismatch(key, args[0], f"{where} key {key!r}")
                if found is None:
                    found = _mismatch(item, args[1], f"{where}[{key!r}]")
                if found is not None:
                    return found
        return None
    return None if _bearable(value, hint) else (where, value, _describe(hint))


def _bearable(value: Any, hint: Any) -> bool:
    if isinstance(hint, type) and hint not in (float, complex) and typing.get_args(hint) == ():
        try:
            return isinstance(value, hint)
        except TypeError:  # pragma: no cover - a class with a broken __instancecheck__
            pass
    from beartype import BeartypeConf
    from beartype.door import is_bearable

    return is_bearable(value, hint, conf=_conf(BeartypeConf))


@functools.lru_cache(maxsize=1)
def _conf(conf_class: Any) -> Any:
    return conf_class(is_pep484_tower=True)  # an int is a valid float


#: Public names for classes whose ``__module__`` is a private module.
_PUBLIC_NAMES = {
    "torch.nn.modules.module.Module": "torch.nn.Module",
    "torch.Tensor": "torch.Tensor",
    "os.PathLike": "a path",
    "packaging.version.Version": "packaging Version",
}


def _describe(hint: Any) -> str:
    """``hint`` in words: ``a torch.nn.Module``, ``a list of str``, ``one of 'a', 'b'``."""
    if hint is Any or hint is object:
        return "anything"
    arms = _arms(hint)
    if len(arms) > 1:
        words = [_describe(a) for a in arms if a is not type(None)]
        text = ", ".join(words[:-1]) + (" or " if len(words) > 1 else "") + words[-1]
        return text + (" or None" if type(None) in arms or None in arms else "")
    hint = arms[0]
    origin = typing.get_origin(hint) or hint
    args = typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if hint is None or hint is type(None):
        return "None"
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        return f"a tuple of {len(args)} ({', '.join(_describe(a) for a in args)})"
    if origin in _SEQUENCES:
        kind = {tuple: "a tuple", set: "a set", frozenset: "a set"}.get(origin, "a list")
        return f"{kind} of {_plural(args[0])}" if args else kind
    if origin in _MAPPINGS:
        if not args or args[1] is Any:
            return "a dict"
        return f"a dict of {_plural(args[0])} to {_plural(args[1])}"
    if origin is cabc.Callable:
        return "a callable"
    if isinstance(origin, type):
        full = f"{origin.__module__}.{origin.__qualname__}"
        top = f"{origin.__module__.split('.')[0]}.{origin.__qualname__}"
        name = _PUBLIC_NAMES.get(full) or _PUBLIC_NAMES.get(top)
        if name is None:
            builtin = origin.__module__ == "builtins"
            name = origin.__qualname__ if builtin or "precision_plugin" in full else full
        return name if name.startswith("a ") else f"{_article(name)} {name}"
    return str(hint).replace("typing.", "")


def _plural(hint: Any) -> str:
    text = _describe(hint)
    for article in ("a ", "an "):
        if text.startswith(article):
            return text[len(article) :]
    return text


def _article(name: str) -> str:
    return "an" if name[:1].lower() in "aeiou" else "a"


def _kind(value: Any) -> str:
    """``value``'s type and a short form of it: ``NoneType None``, ``str 'lm_head'``."""
    return f"{type(value).__name__} {_show(value)}"


def _show(value: Any) -> str:
    """A one-line, short form of ``value`` for an error message."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"<{type(value).__name__} of shape {tuple(shape)}, {value.dtype}>"
    try:
        text = repr(value)
    except Exception:  # a framework object whose repr fails
        text = ""
    if not text or "\n" in text or (len(text) > _SHOWN and text.startswith("<")):
        return f"<{type(value).__qualname__} object>"
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."
