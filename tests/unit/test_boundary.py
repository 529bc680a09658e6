"""The boundary mechanism itself (``precision_plugin._base.boundary``): what ``@checked`` accepts,
refuses, converts and says. The whole public API is exercised in test_public_api.py."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import torch

from precision_plugin import PrecisionConfigError, PrecisionPolicy
from precision_plugin._base.boundary import (
    at_least,
    boundary_of,
    checked,
    dtype_like,
    dtype_name,
    duck,
    each,
    gpu_capability,
    in_range,
    numbers_1d,
    one_of,
    policy_field,
    same_length,
    same_shape,
    torch_module,
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
        (
            {"policy": 5},
            ("'policy'", "int 5", "a PrecisionPolicy, a dict of its keys, a dtype name or None"),
        ),
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


def test_relations_check_parameters_against_each_other() -> None:
    @checked(
        same_length("lengths", "sums", fix="one of each per sequence"),
        lengths=numbers_1d("a token count", low=0),
        sums=numbers_1d("a sum"),
    )
    def fit(lengths: Any, sums: Any, extra: Any = None) -> Any:
        return lengths, sums

    lengths, sums = fit([1, 2], (0.5, -0.5))
    assert lengths.dtype == torch.float64 and sums.tolist() == [0.5, -0.5]  # converted
    with pytest.raises(PrecisionConfigError) as info:
        fit([1, 2, 3], [0.1])
    assert str(info.value) == (
        "fit(): arguments 'lengths' and 'sums' differ in length (lengths: 3, sums: 1); one of "
        "each per sequence."
    )
    # Each parameter's own check comes first, and names that parameter alone.
    with pytest.raises(PrecisionConfigError, match=r"^fit\(\): argument 'lengths' got \[-1\]"):
        fit([-1], [0.1, 0.2])
    with pytest.raises(
        PrecisionConfigError, match=r"argument 'sums' got 'ab', which is not a list"
    ):
        fit([1], "ab")

    @checked(same_shape("a", "b", "mask", fix="the same tokens"))
    def pair(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        return None

    pair(torch.zeros(2, 3), torch.zeros(2, 3))  # mask None: not compared
    with pytest.raises(PrecisionConfigError) as info:
        pair(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3, 2))
    assert "arguments 'a', 'b' and 'mask' differ in shape (a: (2, 3), b: (2, 3), mask: (3, 2))" in (
        str(info.value)
    )
    with pytest.raises(TypeError, match="no parameter"):

        @checked(same_length("x", "nope", fix=""))
        def f(x: list[int]) -> None:
            return None


def test_a_validator_can_take_another_type_than_the_annotation() -> None:
    """The parameters validated by dtype_name take a torch.dtype, as the policy does."""

    @checked(dtype=dtype_name)
    def run(dtype: str | None = None) -> str | None:
        return dtype

    assert run(torch.float16) == "float16" and run("bf16") == "bfloat16"
    with pytest.raises(PrecisionConfigError) as info:
        run(5)
    assert str(info.value) == (
        "run(): argument 'dtype' got int 5, expected a str, a torch.dtype or None (fix: pass a "
        "str, a torch.dtype or None as dtype)."
    )
    with pytest.raises(PrecisionConfigError, match=r"torch\.int8 is not a supported precision"):
        run(torch.int8)


def test_more_validators_alone() -> None:
    with pytest.raises(ValueError, match=r"did you mean 'verl'\?"):
        one_of("verl", "TRL")("VERL")  # the case differs
    with pytest.raises(ValueError, match=r"has -1 at \[1\] \(is out of range"):
        each(at_least(0))([3, -1])
    assert each(at_least(0))([0, 2]) == [0, 2]
    with pytest.raises(ValueError, match=r"is not a torch\.nn\.Module"):
        torch_module("model")
    assert torch_module(MODEL) is MODEL
    with pytest.raises(ValueError, match="holds nan; every item must be a number >= 0"):
        numbers_1d("a count", low=0)([1.0, math.nan])
    with pytest.raises(ValueError, match=r"has shape \(1, 1\)"):
        numbers_1d("a count")([[1.0]])
    assert dtype_like(torch.float64) is torch.float64 and dtype_like("float64") == "float64"
    with pytest.raises(ValueError, match="is not a dtype"):
        dtype_like(3)
