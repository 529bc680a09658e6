"""Bad inputs to the drift canary (precision_plugin._core.canary): each is refused with one
PrecisionConfigError that says what was asked, what was found and how to fix it; the valid
neighbour of each returns the value computed by hand."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from precision_plugin._core.canary import CanaryMonitor, canary_band, token_k3
from precision_plugin._core.canary.workers import batch_metrics, check_canary
from precision_plugin.errors import PrecisionConfigError

K3_HALF = math.expm1(0.5) - 0.5  # k3 of one token whose log-probs differ by 0.5 nats
K3_SEVEN = math.expm1(7.0) - 7.0  # ... by 7 nats


def refused(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(PrecisionConfigError) as info:
        call()
    assert str(info.value) == message


# -- 1. token_k3 of sides with different tokens -------------------------------------------------


def test_token_k3_names_the_row_and_both_lengths() -> None:
    # before: ValueError: zip() argument 2 is longer than argument 1
    refused(
        lambda: token_k3([[-1.0]], [[-1.0, -2.0]]),
        "token_k3(): learner and rollout cover different tokens (row 0: 1 vs 2 tokens); pass "
        "the same tokens on both sides.",
    )
    # before: ValueError: zip() argument 2 is longer than argument 1
    refused(
        lambda: token_k3([[-1.0]], [[-1.0], [-2.0]]),
        "token_k3(): learner and rollout cover different tokens (1 row vs 2 rows); pass the "
        "same tokens on both sides.",
    )
    assert token_k3([[-1.0], [-2.0]], [[-1.5], [-2.0]]) == [K3_HALF, 0.0]


# -- 2. and 8. check(): the reference's layout, and the layout named by rows -------------------


def test_check_refuses_a_reference_of_other_tokens() -> None:
    learner, rollout = [[-1.0, -2.0], [-0.5]], [[-1.0, -2.5], [-0.5]]
    # before: ValueError: zip() argument 2 is shorter than argument 1
    refused(
        lambda: CanaryMonitor().check(0, learner, rollout, reference=[[-1.0]]),
        "CanaryMonitor.check(step=0): the learner's and the reference's log-probs cover "
        "different tokens (2 rows vs 1 row); score the same canary sequences in float32 as the "
        "reference.",
    )
    refused(
        lambda: CanaryMonitor().check(0, learner, rollout, reference=[[-1.0], [-0.5]]),
        "CanaryMonitor.check(step=0): the learner's and the reference's log-probs cover "
        "different tokens (row 0: 2 vs 1 token); score the same canary sequences in float32 as "
        "the reference.",
    )
    check = CanaryMonitor().check(0, learner, rollout, reference=[[-1.0, -1.5], [-0.5]])
    assert check.k3 == K3_HALF / 3
    assert check.reference_k3 == (math.expm1(-0.5) + 0.5) / 3  # d = -2.0 - (-1.5)


def test_check_names_the_row_layout_of_sides_with_the_same_token_count() -> None:
    # before: "... cover different tokens (2 vs 2); ..."
    refused(
        lambda: CanaryMonitor().check(0, [[-1.0, -2.0]], [[-1.0], [-2.0]]),
        "CanaryMonitor.check(step=0): the learner's and the rollout's log-probs cover different "
        "tokens (1 row vs 2 rows); score the same canary sequences on both sides.",
    )
    assert CanaryMonitor().check(0, [[-1.0, -2.0]], [[-1.0, -2.5]]).k3 == K3_HALF / 2


# -- 3. the canary set changes between checks ---------------------------------------------------


def test_a_canary_of_other_tokens_than_the_first_check_is_refused() -> None:
    monitor = CanaryMonitor()
    monitor.check(0, [[-1.0, -2.0], [-0.5]], [[-1.0, -2.5], [-0.5]])
    # before: scored against the band of other tokens (and a later alarm: zip ValueError)
    refused(
        lambda: monitor.check(1, [[-1.0]], [[-4.0]]),
        "CanaryMonitor.check(step=1): the canary had 3 tokens (2 sequences) at step 0 and 1 "
        "token now; rescore the same canary set at every check.",
    )
    refused(
        lambda: monitor.check(1, [[-1.0], [-2.0, -0.5]], [[-1.0], [-2.0, -0.5]]),
        "CanaryMonitor.check(step=1): the canary had 3 tokens (2 sequences) at step 0 and the "
        "same 3 tokens in sequences of [1, 2] tokens now; rescore the same canary set at every "
        "check.",
    )
    again = monitor.check(5, [[-1.0, -2.0], [-0.5]], [[-1.0, -2.0], [-1.0]])
    assert again.k3 == K3_HALF / 3 and len(monitor.checks) == 2


# -- 4. an empty canary -------------------------------------------------------------------------


def test_an_empty_canary_is_refused() -> None:
    # before: accepted, k3 nan and a nan band; later checks crashed
    refused(
        lambda: CanaryMonitor().check(0, [], []),
        "CanaryMonitor.check(step=0): the canary has no token (0 sequences); pass both sides' "
        "log-probs of at least one canary token.",
    )
    refused(
        lambda: CanaryMonitor().check(0, [[], []], [[], []]),
        "CanaryMonitor.check(step=0): the canary has no token (2 sequences, all empty); pass "
        "both sides' log-probs of at least one canary token.",
    )
    # before: a nan band
    refused(
        lambda: canary_band([]),
        "canary_band(): per_token_k3 is empty; pass the floor check's k3 of at least one "
        "canary token (token_k3(learner, rollout)).",
    )
    # an empty sequence inside a canary with tokens is fine
    assert CanaryMonitor().check(0, [[-1.0, -2.0], []], [[-1.0, -2.5], []]).k3 == K3_HALF / 2


# -- 5. non-finite log-probs and k3 values ------------------------------------------------------


def test_non_finite_log_probs_are_refused_with_their_position() -> None:
    # before: the floor's k3 inf, an infinite band: blind for ever (every check in band)
    refused(
        lambda: CanaryMonitor().check(0, [[-1.0, math.nan]], [[-1.0, -2.0]]),
        "CanaryMonitor.check(step=0): the learner's log-prob at (row 0, token 1) is nan; pass "
        "finite log-probs of every canary token.",
    )
    monitor = CanaryMonitor()
    monitor.check(0, [[-1.0], [-2.0]], [[-1.0], [-2.5]])
    # before: a later check's inf went into the verdicts as if measured
    refused(
        lambda: monitor.check(5, [[-1.0], [-2.0]], [[-1.0], [-math.inf]]),
        "CanaryMonitor.check(step=5): the rollout's log-prob at (row 1, token 0) is -inf; pass "
        "finite log-probs of every canary token.",
    )
    refused(
        lambda: monitor.check(5, [[-1.0], [-2.0]], [[-1.0], [-2.5]], reference=[[math.inf], [-2]]),
        "CanaryMonitor.check(step=5): the reference's log-prob at (row 0, token 0) is inf; pass "
        "finite log-probs of every canary token.",
    )
    # before: the floor's k3 overflowed to inf: an infinite band
    refused(
        lambda: CanaryMonitor().check(0, [[-1.0, -2.0]], [[-1.0, -2000.0]]),
        "CanaryMonitor.check(step=0): at the floor check the learner's and the rollout's "
        "log-probs at (row 0, token 1) differ by more than 709 nats (k3 overflows float64), "
        "which would leave the band infinite; score the same canary tokens on both sides with "
        "the same model.",
    )
    assert monitor.check(5, [[-1.0], [-2.0]], [[-1.0], [-2.5]]).k3 == K3_HALF / 2


def test_canary_band_refuses_k3_values_no_log_probs_give() -> None:
    # before: an infinite band (blind)
    refused(
        lambda: canary_band([1.0, math.inf]),
        "canary_band(): argument 'per_token_k3' got [1.0, inf], which has inf at [1] (is not a "
        "finite number; allowed: a number >= 0 (a k3 term expm1(d) - d of finite log-probs)).",
    )
    # before: accepted (k3 >= 0 always)
    refused(
        lambda: canary_band([1.0, -1.0]),
        "canary_band(): argument 'per_token_k3' got [1.0, -1.0], which has -1.0 at [1] (is out "
        "of range; allowed: a number >= 0 (a k3 term expm1(d) - d of finite log-probs)).",
    )
    # before: the reference silently ignored (the band raw, not normalized)
    refused(
        lambda: canary_band([2.0, 2.0], reference_k3=[1.0]),
        "canary_band(): arguments 'per_token_k3' and 'reference_k3' differ in length "
        "(per_token_k3: 2, reference_k3: 1); pass the reference's k3 of the same canary tokens, "
        "one per token.",
    )
    band = canary_band([2.0, 2.0], reference_k3=[1.0, 1.0])
    assert (band.floor, band.upper, band.normalized) == (2.0, 2.0 + 1e-12, True)


# -- 6. constructor arguments -------------------------------------------------------------------


def test_monitor_arguments_are_checked_at_construction() -> None:
    # before: accepted here, refused by canary_band() at the first check
    refused(
        lambda: CanaryMonitor(alpha=2),
        "CanaryMonitor(): argument 'alpha' got 2, which is out of range; allowed: a number in "
        "[1e-09, 0.5] (a one-sided false-alarm rate).",
    )
    assert CanaryMonitor(alpha=0.5).alpha == 0.5


# -- steps --------------------------------------------------------------------------------------


def test_steps_must_increase() -> None:
    monitor = CanaryMonitor()
    monitor.check(0, [[-1.0]], [[-1.5]])
    # before: a repeated or earlier step was kept as another check
    refused(
        lambda: monitor.check(0, [[-1.0]], [[-1.5]]),
        "CanaryMonitor.check(step=0): the previous check was at step 0; check at most once "
        "per step, at increasing steps.",
    )
    # before: accepted
    refused(
        lambda: CanaryMonitor().check(-1, [[-1.0]], [[-1.5]]),
        "CanaryMonitor.check(step=-1): the step is negative; pass the optimizer step of the "
        "check (>= 0).",
    )
    assert monitor.check(1, [[-1.0]], [[-1.5]]).k3 == K3_HALF


# -- 7. the worker hook points ------------------------------------------------------------------


def test_batch_metrics_refuse_a_3d_tensor_like_1d_ones() -> None:
    # before: TypeError: float() argument must be a string or a real number, not 'list'
    refused(
        lambda: batch_metrics(torch.zeros(2, 2, 2), torch.zeros(2, 2, 2)),
        "batch_metrics(): argument 'learner' got <Tensor of shape (2, 2, 2), torch.float32>, "
        "which is not per-token log-probs per sequence; pass a (B, T) tensor or one list of "
        "floats per sequence.",
    )
    assert batch_metrics(torch.zeros(2, 2), torch.zeros(2, 2)) == {
        "bitwise_equal_frac": 1.0,
        "k3_kl": 0.0,
    }


FIX_MASK = (
    "a mask is 0/1 or bool (1: the token counts); pass the response mask (verl: "
    "response_mask, OpenRLHF: action_mask), not weights."
)


@pytest.mark.parametrize(
    ("mask", "shown", "holds"),
    [
        ([[0.5, 0.2]], "[[0.5, 0.2]]", "0.5"),
        ([[-1, 1]], "[[-1, 1]]", "-1"),
        (torch.tensor([[math.nan, 1.0]]), "<Tensor of shape (1, 2), torch.float32>", "nan"),
    ],
)
def test_batch_metrics_refuse_a_mask_of_weights(mask: Any, shown: str, holds: str) -> None:
    # before: every truthy value read as 1: k3_kl (expm1(7) - 7) / 2 as with [[1, 1]]
    refused(
        lambda: batch_metrics([[-1.0, -2.0]], [[-1.0, -9.0]], mask),
        f"batch_metrics(): argument 'mask' got {shown}, which holds {holds}: {FIX_MASK}",
    )


def test_batch_metrics_take_0_1_and_bool_masks() -> None:
    both = batch_metrics([[-1.0, -2.0]], [[-1.0, -9.0]], [[1, 1]])
    assert both == {"bitwise_equal_frac": 0.5, "k3_kl": K3_SEVEN / 2}
    first = batch_metrics([[-1.0, -2.0]], [[-1.0, -9.0]], torch.tensor([[True, False]]))
    assert first == {"bitwise_equal_frac": 1.0, "k3_kl": 0.0}


def test_check_canary_refuses_a_mask_over_lists_only() -> None:
    # before: the mask silently dropped: k3 544.3 where the same tensors give 0.0
    refused(
        lambda: check_canary(
            CanaryMonitor(), 0, [[-1.0, -2.0]], [[-1.0, -9.0]], torch.tensor([[1, 0]])
        ),
        "check_canary(): a mask was given but every side is one list per sequence (a Scorer's "
        "answer, taken as it is); the mask applies to (B, T) tensors only: pass the padded "
        "tensors under it, or leave the mask out.",
    )
    tensors = check_canary(
        CanaryMonitor(),
        0,
        torch.tensor([[-1.0, -2.0]]),
        torch.tensor([[-1.0, -9.0]]),
        torch.tensor([[1, 0]]),
    )
    assert tensors.k3 == 0.0
    lists = check_canary(CanaryMonitor(), 0, [[-1.0, -2.0]], [[-1.0, -9.0]])
    assert lists.k3 == K3_SEVEN / 2  # 544.3...
