"""Inputs the attribution statistics cannot give a meaningful figure for are refused.

An estimate over no token, or over a non-finite log-ratio, used to come back as NaN (or a total
of 0 over 0 tokens) without a word; an unknown cause name was skipped. Each refusal is pinned
to its full message, next to a valid neighbour whose value is worked out by hand.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.probe.attribution.decompose import K3, decompose, k3_interval
from precision_plugin.probe.attribution.fixes import CAUSE_TABLE, FirstChange, first_change

FINITE_FIX = (
    "leave out the tokens whose log-ratio is not finite (a token one side gives probability 0, "
    "or a log-prob the engine did not return), as the probe does"
)


def _no_token(what: str, found: str) -> str:
    return (
        f"{what} holds no token ({found}), expected the log-ratios of at least one token "
        f"(fix: pass the per-sequence log-ratios of the tokens measured)."
    )


def _not_finite(what: str, where: str, value: str) -> str:
    return f"{what} item {where} is {value}, expected a finite log-ratio (fix: {FINITE_FIX})."


K3_ARG = "k3_interval(): argument 'log_ratios'"


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([], _no_token(K3_ARG, "no sequence")),
        ([[]], _no_token(K3_ARG, "1 empty sequence")),
        ([[], []], _no_token(K3_ARG, "2 empty sequences")),
        ([[math.nan]], _not_finite(K3_ARG, "[0][0]", "nan")),
        ([[0.1], [0.2, math.inf]], _not_finite(K3_ARG, "[1][1]", "inf")),
        ([[-math.inf]], _not_finite(K3_ARG, "[0][0]", "-inf")),
    ],
)
def test_k3_interval_refuses_no_token_and_a_non_finite_log_ratio(
    rows: list[list[float]], message: str
) -> None:
    with pytest.raises(PrecisionConfigError, match=re.escape(message) + "$"):
        k3_interval(rows)


def test_k3_interval_of_one_token_is_its_k3_term() -> None:
    # k3 per token is e^-d - 1 + d; one sequence gives no interval. An empty sequence beside
    # it (every token of it left out) changes nothing.
    want = math.expm1(-0.5) + 0.5
    got = k3_interval([[], [0.5]])
    assert got.value == want
    assert math.isnan(got.low) and math.isnan(got.high)
    assert isinstance(got, K3)


DECOMPOSE_TOTAL = "decompose(): argument 'total'"


@pytest.mark.parametrize(
    ("total", "parts", "message"),
    [
        ([], {}, _no_token(DECOMPOSE_TOTAL, "no sequence")),
        ([[]], {"a": [[]]}, _no_token(DECOMPOSE_TOTAL, "1 empty sequence")),
        ([[math.nan]], {"a": [[1.0]]}, _not_finite(DECOMPOSE_TOTAL, "[0][0]", "nan")),
        ([[1.0, -math.inf]], {}, _not_finite(DECOMPOSE_TOTAL, "[0][1]", "-inf")),
        (
            [[1.0], [2.0]],
            {"a": [[0.5], [math.inf]]},
            _not_finite("decompose(): cause 'a'", "[1][0]", "inf"),
        ),
        ([[1.0]], {"a": [[math.nan]]}, _not_finite("decompose(): cause 'a'", "[0][0]", "nan")),
    ],
)
def test_decompose_refuses_no_token_and_a_non_finite_log_ratio(
    total: list[list[float]], parts: dict[str, list[list[float]]], message: str
) -> None:
    with pytest.raises(PrecisionConfigError, match=re.escape(message) + "$"):
        decompose(total, parts)


def test_decompose_of_one_token_by_hand() -> None:
    # d = 2, d_a = 1: total 2^2/2 = 2, a's part 1/2, no interaction (one cause), residual
    # (4 - 1)/2 = 1.5. The empty first sequence holds no token and changes nothing.
    got = decompose([[], [2.0]], {"a": [[], [1.0]]})
    assert (got.total, got.parts, got.interaction, got.residual, got.tokens) == (
        2.0,
        {"a": 0.5},
        0.0,
        1.5,
        1,
    )
    assert got.share(got.parts["a"]) == 0.25


def _row(share: float) -> dict[str, Any]:
    return {"share": share, "k3": 1e-3, "in_total": True}


def test_first_change_refuses_an_unknown_cause_naming_the_known_ones() -> None:
    message = (
        "first_change(): argument 'rows' names the cause 'kvcache' under 'bfloat16', expected "
        "one of dtype, decode, batch, lm_head, sampling, rope, kv_cache, router, stale_weights "
        "(fix: key each dtype's rows by the attribution's cause ids)."
    )
    with pytest.raises(PrecisionConfigError, match=re.escape(message) + "$"):
        first_change({"bfloat16": {"kv_cache": _row(0.2), "kvcache": _row(0.5)}})
    # float32 is read only when alone, but an unknown cause under it is refused all the same.
    with pytest.raises(PrecisionConfigError, match=re.escape("'kvcache' under 'float32'")):
        first_change({"float32": {"kvcache": _row(0.5)}, "bfloat16": {"kv_cache": _row(0.2)}})
    got = first_change({"bfloat16": {"kv_cache": _row(0.2)}})
    assert got == FirstChange("bfloat16", "kv_cache", 0.2, 1e-3, CAUSE_TABLE["kv_cache"].fixes)


def test_a_nan_share_is_a_total_of_zero_and_names_nothing() -> None:
    # Both sides agree on every token: the total is 0 and every share NaN (not an error).
    split = decompose([[0.0, 0.0]], {"kv_cache": [[0.0, 0.0]]})
    share = split.share(split.parts["kv_cache"])
    assert split.total == 0.0 and math.isnan(share)
    assert first_change({"float32": {"kv_cache": _row(share)}}) is None
    got = first_change({"float16": {"kv_cache": _row(share)}, "bfloat16": {"rope": _row(0.3)}})
    assert got == FirstChange("bfloat16", "rope", 0.3, 1e-3, CAUSE_TABLE["rope"].fixes)
