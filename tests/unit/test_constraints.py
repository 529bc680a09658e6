"""Meaning constraints declared with the type (annotated-types): each rule refuses what it
must, names the rule, and gives the property tests their bad values."""

from __future__ import annotations

import math
from typing import Annotated

import annotated_types as at
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from precision_plugin._base.constraints import (
    AtMost,
    Count,
    Each,
    Finite,
    Invalid,
    Measured,
    Ordered,
    Positive,
    Probability,
    Whole,
    constraints_of,
    relations_for,
    validator_for,
)

PROPERTY = settings(max_examples=40, deadline=1000, derandomize=True)


def refused(validator, value) -> str:
    with pytest.raises(Invalid) as err:
        validator(value)
    return str(err.value)


@pytest.mark.parametrize(
    ("hint", "good", "bad", "says"),
    [
        (Positive, [1e-300, 2.0, 7], [0.0, -1.0, math.inf, math.nan], ["> 0", "finite"]),
        (Count, [0, 3, 10**30], [-1, True, 2.5], [">= 0", "a bool", "not a whole number"]),
        (Probability, [0.0, 1.0, math.nan], [1.5, -0.1, math.inf], ["<= 1", ">= 0", "finite"]),
        (Measured, [math.nan, -3.0], [math.inf, -math.inf], ["finite"]),
        (Annotated[float, at.Interval(gt=0, le=1)], [1.0], [0.0, 1.5], ["> 0", "<= 1"]),
    ],
)
def test_each_rule_refuses_what_it_must_and_names_the_rule(hint, good, bad, says):
    check = validator_for(hint)
    assert check is not None
    for value in good:
        assert check(value) == value or math.isnan(value)
    messages = " ".join(refused(check, value) for value in bad)
    for word in says:
        assert word in messages, messages


def test_each_item_of_a_sequence_or_tensor():
    check = validator_for(Annotated[list, Each(Whole(), at.Ge(0))])
    assert check([0, 3]) == [0, 3]
    assert torch.equal(check(torch.tensor([1, 2])), torch.tensor([1, 2]))
    check(torch.tensor([4.0, 8.0]))  # integral floats are whole numbers
    assert "True (item 0), which is a bool" in refused(check, [True, 2])
    assert "-1 (item 1), which breaks the rule >= 0" in refused(check, [1, -1])
    assert "torch.bool tensor" in refused(check, torch.tensor([True, False]))
    assert "item 1 = 2.5" in refused(check, torch.tensor([1.0, 2.5]))
    finite = validator_for(Annotated[list, Each(Finite())])
    assert "item 2 = inf" in refused(finite, torch.tensor([0.0, 1.0, math.inf]))
    assert "item 1 inf" in refused(finite, [0.0, math.inf]) or "item 1" in refused(
        finite, [0.0, math.inf]
    )


def test_relations_order_two_parameters_and_fit_a_count_in_its_total():
    (order,) = relations_for("high", Annotated[float, Ordered("low", ">=")])
    order.check({"low": 1.0, "high": 2.0})
    order.check({"low": math.nan, "high": 2.0})  # not measured: no order to break
    with pytest.raises(Invalid, match=r"out of order \(high=1.0, low=2.0\); the rule: high >= low"):
        order.check({"low": 2.0, "high": 1.0})
    (fit,) = relations_for("clipped", Annotated[int, AtMost("lengths", sum, "the tokens")])
    fit.check({"clipped": 7, "lengths": [3, 4]})
    with pytest.raises(Invalid, match=r"clipped=8 is more than the tokens \(7\)"):
        fit.check({"clipped": 8, "lengths": [3, 4]})


def test_constraints_are_found_inside_optional_and_none_is_declared_nowhere():
    assert constraints_of(Annotated[float, at.Gt(0)] | None) == [at.Gt(0)]
    assert validator_for(float) is None and relations_for("x", float) == []


@PROPERTY
@given(st.data())
def test_the_declared_bad_values_are_refused_and_bounds_drawn_from_them_too(data):
    hint = data.draw(st.sampled_from([Positive, Count, Probability]))
    check = validator_for(hint)
    for value in check.bad:
        refused(check, value)
    low, high, integer = check.bounds
    number = st.integers if integer else st.floats
    if low is not None:
        below = data.draw(
            number(max_value=math.ceil(low) - 1)
            if integer
            else number(max_value=low, exclude_max=True, allow_nan=False)
        )
        refused(check, below) if not (hint is Positive and below == low) else None
    if high is not None:
        above = data.draw(number(min_value=high, exclude_min=True, allow_nan=False))
        refused(check, above)
