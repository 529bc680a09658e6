"""How each kind of program turns a written value into a boolean, a number or a choice (pure).

A config value is read by the rules of the program that will read it, never by Python's
truthiness: the string ``"false"`` is true to ``if value:``, and ``"0"`` is a non-empty string.
Four families of readers cover the programs the plugin checks:

- ``argparse`` (OpenRLHF, SGLang, slime, Megatron): a value is text passed to the argument's
  ``type`` (``int("2")``; ``int("2.5")`` and ``int("True")`` are refused); a ``store_true``
  switch takes no value at all; ``choices`` are compared after the ``type``.
- ``omegaconf`` (verl's YAML and Hydra overrides): YAML gives the type (a quoted ``"false"`` is a
  string; Hydra's override grammar types ``false`` as a boolean, ``'false'`` as a string), and
  verl tests its switches with ``if``, so a string where a switch belongs is refused.
- ``structured`` (AReaL's dataclasses merged by OmegaConf): the field's type converts as
  OmegaConf's nodes do (``omegaconf/nodes.py`` 2.3 ``BooleanNode``: ``yes/y/on/true`` and
  ``no/n/off/false`` in any case and integer text; ``IntegerNode``: ``int`` or integer text,
  never a ``bool``; ``FloatNode``: ``float``, ``int`` or number text, never a ``bool``).
- ``python`` (TRL's keyword arguments): the Python value is taken as is, so a switch must be a
  ``bool`` and a count an ``int`` (not a ``bool``); ``HfArgumentParser`` reads a ``dict`` field
  given as text as JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: The families of readers (see the module docstring).
STYLES = ("argparse", "omegaconf", "structured", "python")

#: OmegaConf's ``BooleanNode`` spellings (``omegaconf/nodes.py`` 2.3, lower-cased).
_OMEGA_TRUE = ("y", "yes", "on", "true")
_OMEGA_FALSE = ("n", "no", "off", "false")


class Refused(ValueError):
    """The program would refuse the value; the message says why, in the program's terms."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_switch(value: Any, style: str) -> bool:
    """A switch (``store_true`` flag, boolean field) as the program reads ``value``."""
    if isinstance(value, bool):
        return value
    if style == "structured":
        if isinstance(value, int):
            return value != 0
        if isinstance(value, str):
            text = value.strip().lower()
            try:
                return int(text) != 0
            except ValueError:
                pass
            if text in _OMEGA_TRUE:
                return True
            if text in _OMEGA_FALSE:
                return False
        raise Refused(
            f"is {_shown(value)}, which OmegaConf refuses for a boolean field (it takes true or "
            f"false, yes/no, on/off or an integer)"
        )
    if style == "argparse":
        raise Refused(
            f"is {_shown(value)}, but it is a switch (store_true): on the command line it takes "
            f"no value, so the parsed arguments hold True or False; pass True or False"
        )
    if style == "omegaconf" and isinstance(value, str):
        raise Refused(
            f"is the string {_shown(value)} (quoted in the YAML or the override), which OmegaConf "
            f"keeps as a string and the program's `if` takes as true whatever it says; write true "
            f"or false without quotes"
        )
    raise Refused(
        f"is {_shown(value)} ({type(value).__name__}), where a boolean belongs; pass True or False "
        f"(a non-empty string is true to Python, whatever it says)"
    )


def as_int(value: Any, style: str) -> int:
    """An integer as the program reads ``value`` (``bool`` refused: ``int(True)`` is a bug)."""
    if isinstance(value, bool):
        raise Refused(f"is {value!r}, a boolean, where an integer belongs; pass a number such as 1")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and style in ("argparse", "structured"):
        try:
            return int(value.strip() if style == "structured" else value)
        except ValueError:
            raise Refused(
                f"is {_shown(value)}, which the program's parser refuses: int() cannot read it "
                f"(an integer such as 2 is expected)"
            ) from None
    if isinstance(value, float) and style == "structured" and value.is_integer():
        raise Refused(
            f"is {value!r}, a float, which OmegaConf refuses for an integer field; "
            f"write {int(value)}"
        )
    if isinstance(value, str):
        raise Refused(
            f"is the string {_shown(value)}, where an integer belongs (this program does no "
            f"conversion: arithmetic with it fails later); write the number without quotes"
        )
    raise Refused(f"is {_shown(value)} ({type(value).__name__}), where an integer belongs")


def as_float(value: Any, style: str) -> float:
    """A real number as the program reads ``value`` (``bool`` refused)."""
    if isinstance(value, bool):
        raise Refused(f"is {value!r}, a boolean, where a number belongs")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and style in ("argparse", "structured"):
        try:
            return float(value)
        except ValueError:
            raise Refused(
                f"is {_shown(value)}, which float() cannot read (a number is expected)"
            ) from None
    raise Refused(f"is {_shown(value)} ({type(value).__name__}), where a number belongs")


def as_text(value: Any, style: str) -> str:
    """A text value (a path, a name); ``structured`` converts numbers as OmegaConf does."""
    if isinstance(value, str):
        return value
    if style == "structured" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise Refused(f"is {_shown(value)} ({type(value).__name__}), where a text value belongs")


def as_mapping(value: Any, style: str) -> dict[str, Any]:
    """A ``dict`` setting; a string is parsed as JSON as ``HfArgumentParser`` does (``python``)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and style in ("python", "argparse"):
        try:
            parsed = json.loads(value, parse_constant=_no_constant)
        except RecursionError:
            raise Refused("is JSON nested too deeply to read; write a flat JSON object") from None
        except json.JSONDecodeError as exc:
            raise Refused(
                f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); write a "
                f"JSON object such as '{{\"max_tokens\": 256}}'"
            ) from None
        except ValueError as exc:
            raise Refused(str(exc)) from None
        if not isinstance(parsed, dict):
            raise Refused(f'is JSON {type(parsed).__name__}, not an object; write {{"key": value}}')
        return parsed
    raise Refused(f"is {_shown(value)} ({type(value).__name__}), where a mapping belongs")


def _no_constant(name: str) -> Any:
    raise ValueError(f"holds {name}, which is not JSON (NaN/Infinity are Python's extension)")


def finite(value: float) -> bool:
    """True for a finite number."""
    return math.isfinite(value)
