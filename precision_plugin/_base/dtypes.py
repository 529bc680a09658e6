"""One vocabulary of dtype names: the canonical names, every alias, and ``torch.dtype`` objects.

Every spelling table of the package (the policy's parser, SGLang's ``--dtype`` choices, verl's
``fp16``/``16``, OpenRLHF's ``bf16``, AReaL's ``half``) is derived from this table with
:func:`spellings`, and two dtype names are compared with :func:`same_dtype`, never as strings:
``"half"`` is ``float16`` and ``"BF16"`` is ``bfloat16`` everywhere.

Layer 1: imports only :mod:`precision_plugin.errors` (and torch lazily, for ``torch_dtype``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from precision_plugin.errors import PrecisionConfigError

DTypeName = Literal["float16", "bfloat16", "float32"]
#: The three precisions the policy can ask for, in the order the docs list them.
SUPPORTED_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")

#: Every spelling of the three precisions (lower case, surrounding spaces ignored when read):
#: the canonical names, the short ones (fp16, bf16, fp32), torch's (half, float) and the
#: ``str()`` of each ``torch.dtype``.
DTYPE_ALIASES: dict[str, str] = {
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "torch.float16": "float16",
    "torch.half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "torch.bfloat16": "bfloat16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
    "torch.float32": "float32",
    "torch.float": "float32",
}

#: The short spelling of each precision (Accelerate's ``mixed_precision``, verl's and
#: OpenRLHF's ``param_dtype``, DeepSpeed's section names).
SHORT_NAMES: dict[str, str] = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}

#: Spellings some frameworks add (verl reads ``16``/``32`` as fp16/fp32); not accepted by the
#: policy itself, but read through :func:`canonical_dtype_name` like the others.
EXTRA_ALIASES: dict[str, str] = {"16": "float16", "32": "float32"}


def _key(value: Any) -> str:
    """The lookup key of ``value``: ``str()`` of it (``torch.float16`` -> ``"torch.float16"``),
    stripped and lower-cased."""
    return str(value).strip().lower() if value is not None else ""


def canonical_dtype_name(value: Any) -> str | None:
    """The canonical name (``float16``/``bfloat16``/``float32``) of any spelling of one of the
    three precisions (``"half"``, ``"BF16"``, ``torch.float16``, ``16``), else ``None``."""
    key = _key(value)
    return DTYPE_ALIASES.get(key) or EXTRA_ALIASES.get(key)


def dtype_label(value: Any) -> str:
    """:func:`canonical_dtype_name` where the value is a known precision, else the value as
    written (lower case, without ``torch.``): for messages and comparisons of other dtypes."""
    return canonical_dtype_name(value) or _key(value).removeprefix("torch.")


def same_dtype(a: Any, b: Any) -> bool:
    """Whether two spellings name the same dtype (``same_dtype("half", "float16")`` is true)."""
    return dtype_label(a) == dtype_label(b)


def normalize_dtype(value: Any, *, field_name: str = "dtype") -> str:
    """Return the canonical dtype name (``float16``/``bfloat16``/``float32``) for ``value``.

    Accepts the canonical names, the aliases fp16/half/bf16/fp32/float (any case), and
    ``torch.dtype`` objects. Anything else (fp8, int8, "auto", ...) raises
    ``PrecisionConfigError``.
    """
    canonical = DTYPE_ALIASES.get(_key(value))
    if canonical is None:
        raise PrecisionConfigError(
            f"{field_name}: {value!r} is not a supported precision. Allowed: "
            f"{', '.join(SUPPORTED_DTYPES)} (aliases fp16/half, bf16, fp32/float, or the "
            f"matching torch dtype). fp8/int8 and 'auto' are not training precisions this "
            f"plugin enforces; pick float16 (recommended for RL) or bfloat16."
        )
    return canonical


def torch_dtype(name: str) -> Any:
    """Return the ``torch.dtype`` for a canonical or aliased dtype name."""
    import torch

    return getattr(torch, normalize_dtype(name))


def spellings(
    names: Iterable[str], extra: Mapping[str, str | None] | None = None
) -> dict[str, str | None]:
    """A framework's spelling table: each of ``names`` (spellings that framework accepts) mapped
    through the vocabulary, plus ``extra`` entries the vocabulary does not hold (``auto``).

    Raises ``ValueError`` at import time for a name the vocabulary does not know, so a table
    cannot drift from it.
    """
    table: dict[str, str | None] = {}
    for name in names:
        canonical = canonical_dtype_name(name)
        if canonical is None:
            raise ValueError(f"{name!r} is not in precision_plugin._base.dtypes.DTYPE_ALIASES")
        table[name] = canonical
    table.update(extra or {})
    return table
