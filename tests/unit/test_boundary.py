"""The boundary mechanism itself (``precision_plugin.boundary``): what ``@checked`` accepts,
refuses, converts and says. The whole public API is exercised in test_public_api.py."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import torch

from precision_plugin import PrecisionConfigError, PrecisionPolicy
from precision_plugin.boundary import (
    at_least,
    boundary_of,
    checked,
    duck,
    gpu_capability,
    in_range,
    one_of,
    policy_field,
    version_text,
)


@checked(
    every=at_least(1),
    strictness=policy_field("strictness"),
    margin=policy_field("overflow.margin_bits"),
)
def sample(
    model: torch.nn.Module,
    patterns: Iterable[str] = (),
    *,
    every: int = 10,
    strictness: str = "warn",
    margin: float | None = None,
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    mode: Literal["a", "b"] = "a",
    rows: Sequence[Sequence[float]] = (),
) -> dict[str, Any]:
    return dict(locals())


MODEL = torch.nn.Linear(2, 2)


def message(call) -> str:
    with pytest.raises(PrecisionConfigError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("sample(): ")
    return text


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"model": None}, ("'model'", "NoneType None", "torch.nn.Module")),
        ({"patterns": "lm_head"}, ("'patterns'", "one character at a time", "['lm_head']")),
        ({"patterns": ["a", 3]}, ("'patterns'", "item [1] is int 3", "a str")),
        ({"every": 0}, ("'every'", "got 0", "an integer >= 1")),
        ({"every": True}, ("'every'", "bool True")),
        ({"every": 2.5}, ("'every'", "float 2.5")),
        ({"strictness": "strict"}, ("'strictness'", "'warn', 'error'")),
        ({"margin": -1}, ("'margin'", "overflow.margin_bits", "[0, 16]")),
        ({"margin": math.nan}, ("'margin'", "not a finite number")),
        ({"policy": "fp8"}, ("'policy'", "fp8", "float16")),
        ({"policy": 5}, ("'policy'", "int 5", "a PrecisionPolicy, a dict of its keys, a dtype name or None")),
        ({"policy": {"dtyp": "fp16"}}, ("'policy'", "Did you mean 'dtype'")),
        ({"mode": "c"}, ("'mode'", "one of 'a', 'b'")),
        ({"rows": [[1.0], [2.0, "x"]]}, ("'rows'", "item [1][1] is str 'x'", "a float")),
        ({"rows": [1.0]}, ("'rows'", "item [0] is float 1.0")),
        ({"evry": 3}, ("unexpected keyword argument 'evry'", "Did you mean 'every'")),
    ],
)
def test_a_wrong_argument_is_one_line_naming_the_parameter(kwargs, words) -> None:
    kwargs = {"model": MODEL, **kwargs}
    text = message(lambda: sample(**kwargs))
    for word in words:
        assert word in text, text


def test_missing_argument_shows_the_call() -> None:
    text = message(lambda: sample())
    assert "missing a required argument: 'model'" in text
    assert "sample(model, patterns=(), *, every=10" in text


def test_good_arguments_pass_and_are_normalised() -> None:
    out = sample(MODEL, ["x"], every=1, margin=2, policy="bf16", rows=[[1, 2.5]])
    assert out["policy"] == PrecisionPolicy(dtype="bfloat16")
    assert out["margin"] == 2.0 and isinstance(out["margin"], float)
    assert out["patterns"] == ["x"] and out["every"] == 1
    # Defaults and None for a None default are the function's own: no validator runs.
    assert sample(MODEL, margin=None, policy=None)["policy"] is None
    # An iterator is accepted as an iterable (its items are not consumed to check them).
    assert list(sample(MODEL, iter(["a"]))["patterns"]) == ["a"]


def test_int_is_a_float_but_bool_is_not_a_number() -> None:
    @checked
    def f(x: float, n: int = 0) -> float:
        return x

    assert f(3) == 3
    for bad in ({"x": True}, {"x": 1.0, "n": False}, {"x": "1"}):
        with pytest.raises(PrecisionConfigError):
            f(**bad)


def test_validators_alone() -> None:
    assert in_range(0, 16)(16) == 16
    for bad in in_range(0, 16).bad + at_least(1).bad:
        with pytest.raises(ValueError):
            (in_range(0, 16) if isinstance(bad, float) else at_least(1))(bad)
    with pytest.raises(ValueError, match="did you mean 'warn'"):
        one_of("warn", "error")("wran")
    with pytest.raises(ValueError, match="has no generate"):
        duck("generate", what="an engine")(object())
    with pytest.raises(ValueError, match="not a version number"):
        version_text("vLLM")("banana")
    assert version_text("vLLM")("0.10.1") == "0.10.1"
    with pytest.raises(ValueError, match=r"\(major, minor\)"):
        gpu_capability("9.0")
    assert gpu_capability((9, 0)) == (9, 0) and gpu_capability(None) is None


def test_a_class_checks_init_and_its_public_methods() -> None:
    @checked(size=at_least(1))
    @dataclass
    class Box:
        size: int

        def grow(self, by: int) -> int:
            return self.size + by

        @classmethod
        def make(cls, size: int) -> Box:
            return cls(size)

        def _private(self, x: int) -> int:
            return x

    assert Box(2).grow(3) == 5 and Box.make(4).size == 4
    assert Box(1)._private("not checked") == "not checked"
    with pytest.raises(PrecisionConfigError, match=r"^Box\(\): argument 'size' got 0"):
        Box(0)
    with pytest.raises(PrecisionConfigError, match=r"^Box.grow\(\): argument 'by' got str"):
        Box(1).grow("3")
    with pytest.raises(PrecisionConfigError, match=r"make\(\): argument 'size'"):
        Box.make(None)
    assert boundary_of(Box) is not None and boundary_of(Box.grow) is not None


def test_a_framework_method_override_is_left_to_the_framework() -> None:
    @checked
    class Layer(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # torch calls it
            return x

        def scale(self, by: float) -> float:
            return by

    assert boundary_of(Layer.forward) is None
    assert boundary_of(Layer.scale) is not None


def test_a_validator_for_an_unknown_parameter_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="no parameter"):

        @checked(nope=at_least(1))
        def f(x: int) -> int:
            return x
