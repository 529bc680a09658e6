"""Hook points for workers that hold log-probs as padded tensors (verl, OpenRLHF).

verl and OpenRLHF keep both sides' per-token log-probs of a batch as ``(B, T)`` tensors with a
response mask: verl's ``DataProto`` batch keys ``old_log_probs`` (the actor's
``compute_log_prob``), ``rollout_log_probs`` (the rollout engine's, with
``rollout.calculate_log_probs=True``) and ``response_mask``; OpenRLHF's ``Experience`` fields
``action_log_probs``, ``rollout_log_probs`` and ``action_mask``. These functions read them:

- [`batch_metrics`][precision_plugin._core.canary.workers.batch_metrics]: the per-batch
  ``bitwise_equal_frac`` and ``k3_kl`` of the masked tokens (log as ``precision/*``);
- [`check_canary`][precision_plugin._core.canary.workers.check_canary]: one canary check of a
  [`CanaryMonitor`][precision_plugin._core.canary.CanaryMonitor] from tensors (the actor's
  ``compute_log_prob`` of the canary) or from a [`Scorer`][precision_plugin._core.scoring.Scorer]'s
  lists (the rollout engine's scoring path), with the batch's k3 for the ``policy_moving`` note.

Duck-typed (anything with ``tolist()``, or nested lists): nothing here imports torch or a
framework.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from precision_plugin._base.boundary import Invalid, Validator, checked, same_rows
from precision_plugin._core.canary.band import token_k3
from precision_plugin._core.canary.monitor import CanaryCheck, CanaryMonitor
from precision_plugin._core.scoring.bitwise import bitwise_equal
from precision_plugin.errors import PrecisionConfigError


def _table(value: Any) -> Any:
    if value is None:
        return value
    if hasattr(value, "ndim") and hasattr(value, "tolist"):  # a tensor or an array
        if value.ndim != 2:
            raise Invalid(
                "is not per-token log-probs per sequence; pass a (B, T) tensor or one list of "
                "floats per sequence"
            )
        return value
    rows = value.tolist() if hasattr(value, "tolist") else value
    if (
        isinstance(rows, (str, bytes))
        or not isinstance(rows, Sequence)
        or not all(isinstance(r, Sequence) and not isinstance(r, (str, bytes)) for r in rows)
        or any(isinstance(x, (Sequence, str, bytes)) for r in rows for x in r)
    ):
        raise Invalid(
            "is not per-token log-probs per sequence; pass a (B, T) tensor or one list of "
            "floats per sequence"
        )
    return value


#: Per-token values per sequence: a ``(B, T)`` tensor (anything with ``tolist()``) or lists.
TABLE = Validator("a (B, T) tensor or one list per sequence", _table, ("x", [1.0, 2.0], 3))
#: The same, or ``None``.
OPTIONAL_TABLE = Validator("a (B, T) tensor, one list per sequence, or None", _table, ("x", 3))


def _mask(value: Any) -> Any:
    _table(value)
    if value is None or str(getattr(value, "dtype", "")) in ("torch.bool", "bool"):
        return value
    if hasattr(value, "ndim") and hasattr(value, "tolist"):  # a tensor or an array
        flat = value.reshape(-1)
        binary = (flat == 0) | (flat == 1)
        if bool(binary.all()):
            return value
        rows = [flat[~binary][:1].tolist()]
    else:
        rows = value
    for row in rows:
        for m in row:
            if not (m is True or m is False or m == 0 or m == 1):
                raise Invalid(
                    f"holds {m}: a mask is 0/1 or bool (1: the token counts); pass the "
                    f"response mask (verl: response_mask, OpenRLHF: action_mask), not weights"
                )
    return value


#: A ``(B, T)`` mask of 0/1 or bool (1: the token counts), or ``None``.
OPTIONAL_MASK = Validator(
    "a (B, T) mask of 0/1 or bool, or None", _mask, ("x", 3, [[0.5]], [[-1]], [[math.nan]])
)


def _nested(value: Any) -> list[Any]:
    if hasattr(value, "detach"):  # a torch tensor: float32 values, exactly as Python floats
        value = value.detach().float().cpu()
    return value.tolist() if hasattr(value, "tolist") else [list(row) for row in value]


@checked(logprobs=TABLE, mask=OPTIONAL_MASK)
def masked_rows(logprobs: Any, mask: Any = None) -> list[list[float]]:
    """One list of log-probs per sequence: the ``(B, T)`` ``logprobs`` where ``mask`` is true
    (``mask`` ``None``: ``logprobs`` are already one list per sequence, kept as they are)."""
    rows = _nested(logprobs)
    if mask is None:
        return [[float(x) for x in row] for row in rows]
    keep = _nested(mask)
    if len(keep) != len(rows) or any(len(m) != len(r) for m, r in zip(keep, rows, strict=True)):
        raise PrecisionConfigError(
            f"masked_rows(): the log-probs have shape ({len(rows)}, "
            f"{len(rows[0]) if rows else 0}) and the mask ({len(keep)}, "
            f"{len(keep[0]) if keep else 0}); pass the response mask of the same batch "
            f"(verl: response_mask, OpenRLHF: action_mask)."
        )
    return [
        [float(x) for x, m in zip(row, mrow, strict=True) if m]
        for row, mrow in zip(rows, keep, strict=True)
    ]


def _refuse_non_finite(where: str, name: str, rows: list[list[float]], mask: Any) -> None:
    """Refuse a NaN or infinite log-prob among the tokens that count (``rows``: after the
    ``mask``), as ``CanaryMonitor.check`` does: its k3 would be ``inf`` or NaN without a word."""
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            if not math.isfinite(value):
                if mask is not None:  # the column in the (B, T) table: the j-th one kept
                    j = [t for t, m in enumerate(_nested(mask)[i]) if m][j]
                raise PrecisionConfigError(
                    f"{where}: argument {name!r} holds {value} at (row {i}, token {j}), a token "
                    f"{'the mask counts' if mask is not None else 'that counts'}; pass finite "
                    f"log-probs of every counted token (a NaN or inf log-prob: that side's "
                    f"forward overflowed or returned none)."
                )


@checked(
    same_rows(
        "learner",
        "rollout",
        "mask",
        fix="pass both sides' log-probs of the same tokens of the same batch, and its mask",
    ),
    learner=TABLE,
    rollout=TABLE,
    mask=OPTIONAL_MASK,
)
def batch_metrics(learner: Any, rollout: Any, mask: Any = None) -> dict[str, float]:
    """The per-batch ``bitwise_equal_frac`` (the share of masked tokens whose learner and
    rollout log-probs are bit-identical) and ``k3_kl`` (the canary's k3 over them):
    verl ``(old_log_probs, rollout_log_probs, response_mask)``, OpenRLHF
    ``(action_log_probs, rollout_log_probs, action_mask)``."""
    a, b = masked_rows(learner, mask), masked_rows(rollout, mask)
    for name, rows in (("learner", a), ("rollout", b)):
        _refuse_non_finite("batch_metrics()", name, rows, mask)
    equal = bitwise_equal(a, b)  # first: it refuses two sides of different shapes by name
    k3 = token_k3(a, b)
    return {
        "bitwise_equal_frac": equal.fraction,
        "k3_kl": math.fsum(k3) / len(k3) if k3 else math.nan,
    }


@checked(learner=TABLE, rollout=TABLE, mask=OPTIONAL_MASK, reference=OPTIONAL_TABLE)
def check_canary(
    monitor: CanaryMonitor,
    step: int,
    learner: Any,
    rollout: Any,
    mask: Any = None,
    *,
    reference: Any = None,
    batch_k3: float | None = None,
) -> CanaryCheck:
    """One canary check at ``step``: ``learner``, ``rollout`` and ``reference`` (the learner in
    float32, optional) are the canary's per-token log-probs, each ``(B, T)`` tensors under
    ``mask`` or (``mask`` ``None``, or a side already given as lists of lists) one list per
    sequence, as a ``Scorer`` returns them. ``batch_k3``: this step's per-batch k3
    (``batch_metrics(...)["k3_kl"]``). Call it after the weight sync, on the driver."""

    def is_lists(side: Any) -> bool:
        return isinstance(side, Sequence) and all(isinstance(r, Sequence) for r in side)

    def rows(side: Any) -> list[list[float]]:
        return masked_rows(side, None if is_lists(side) else mask)

    sides = [s for s in (learner, rollout, reference) if s is not None]
    if mask is not None and all(is_lists(side) for side in sides):
        raise PrecisionConfigError(
            "check_canary(): a mask was given but every side is one list per sequence (a "
            "Scorer's answer, taken as it is); the mask applies to (B, T) tensors only: pass "
            "the padded tensors under it, or leave the mask out."
        )

    ref = None if reference is None else rows(reference)
    return monitor.check(step, rows(learner), rows(rollout), batch_k3=batch_k3, reference=ref)
