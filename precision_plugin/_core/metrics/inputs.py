"""The inputs of the mismatch and consequence metrics: coercion and validators of per-token
log-probs, masks and per-sequence (length, log-ratio sum) pairs, shared by
[`mismatch`][precision_plugin._core.metrics.mismatch],
[`drift`][precision_plugin._core.metrics.drift],
[`shard_sums`][precision_plugin._core.metrics.shard_sums] and
[`consequence`][precision_plugin._core.metrics.consequence].
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import annotated_types as at
import torch

from precision_plugin._base.boundary import Invalid, Validator, numbers_1d, same_length, same_shape
from precision_plugin._base.constraints import Each, Whole
from precision_plugin.errors import PrecisionConfigError


def _none_to_nan(x: Any) -> Any:
    """Replace ``None`` (a token an engine returned no log-prob for) by NaN in nested lists."""
    if x is None:
        return math.nan
    if isinstance(x, (list, tuple)):
        return [_none_to_nan(v) for v in x]
    return x


#: A log-prob above this is not one (probabilities passed by mistake?): a log-softmax never
#: rounds a log-prob above 0 by more than a few ulps.
LOGPROB_MAX = 0.01


def _as_2d(x: Any) -> torch.Tensor:
    """``x`` as a float64 ``[batch, seq]`` tensor (``[seq]`` becomes one row)."""
    try:
        if isinstance(x, torch.Tensor):
            t = x.to(torch.float64)
        else:  # lists and arrays straight to float64: torch would round floats to float32 first
            t = torch.as_tensor(_none_to_nan(x), dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise Invalid(
            f"is not a rectangular array of numbers ({exc}); pass a [batch, seq] tensor, "
            f"padded, with a mask of the real tokens"
        ) from None
    if t.dim() not in (1, 2):
        raise Invalid(
            f"has shape {tuple(t.shape)}; pass [batch, seq] or [seq] (the log-probs of the "
            f"sampled tokens, not the full [.., vocab] distributions)"
        )
    return t.unsqueeze(0) if t.dim() == 1 else t


#: One token count per sequence: whole numbers >= 0 (``True`` is no length).
TokenCounts = Annotated[Any, Each(Whole(), at.Ge(0))]
#: The drift's inputs: one token count and one log-ratio sum per sequence.
_LENGTHS = numbers_1d("a sequence's token count", low=0)
_SUMS = numbers_1d("a sequence's sum of log π − log μ")
_PER_SEQUENCE = same_length(
    "lengths", "sums", fix="pass one token count and one log-ratio sum per sequence"
)


def _log_probs(x: Any) -> torch.Tensor:
    t = _as_2d(x)
    high = t.nan_to_num(nan=-math.inf, posinf=math.inf).max() if t.numel() else None
    if high is not None and float(high) > LOGPROB_MAX:
        raise Invalid(
            f"holds {float(high):.4g}: no log-probability is above 0 (were probabilities "
            f"passed?); pass log-probs, e.g. probs.log()"
        )
    return t


#: The log-probs of the sampled tokens: ``[batch, seq]`` or ``[seq]``, <= 0, NaN/None where
#: an engine returned none; converted to a float64 2-D tensor.
log_probs_arg = Validator(
    "log-probs of the sampled tokens, [batch, seq] or [seq]",
    _log_probs,
    ([[0.5, 0.25]], [[-0.1], [-0.2, -0.3]], [[[-0.1]]], "x", None),
)


def _mask(x: Any) -> torch.Tensor:
    t = _as_2d(x)
    if t.numel() and not bool(((t == 0) | (t == 1)).all()):
        bad = t[~((t == 0) | (t == 1))][0].item()
        raise Invalid(
            f"holds {bad:g}: a mask is 0/1 or bool (1: the token counts); pass e.g. "
            f"attention_mask or completion_mask, not weights"
        )
    return t


#: A mask of the tokens that count (bool or 0/1), of the log-probs' shape; converted to a 2-D
#: tensor.
mask_arg = Validator(
    "a [batch, seq] mask of the tokens that count",
    _mask,
    ([[1], [1, 0]], [[[1]]], "x", [[2.0]], [[0.5]], [[math.nan]]),
)
#: The log-probs of the same tokens on both sides, and a mask of their shape.
SAME_TOKENS = same_shape(
    "train_logprobs",
    "rollout_logprobs",
    "mask",
    fix="pass the log-probs of the same tokens, and a mask of their shape",
)


def _named_2d(x: Any, name: str, caller: str) -> torch.Tensor:
    """``_as_2d`` for an internal caller: the error names ``caller``'s argument."""
    try:
        return _as_2d(x)
    except Invalid as exc:
        raise PrecisionConfigError(f"{caller}(): argument {name!r} {exc}.") from None
