"""The probe's length check reads the model's text config, as the scorer and the engine do."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.probe.run import _check_positions


def _model(limit: Any, *, composite: bool = False) -> Any:
    text = SimpleNamespace(max_position_embeddings=limit)
    if not composite:
        return SimpleNamespace(config=text)
    # a vision-language config: the text model's limit sits in its text config only
    return SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: text))


PROMPTS = [[1] * 5, [1] * 9, [1] * 9, [1] * 3]  # the longest, 9 tokens, first at prompt 2


@pytest.mark.parametrize("composite", [False, True])
def test_a_completion_that_reaches_the_limit_exactly_is_accepted(composite: bool) -> None:
    _check_positions(_model(16, composite=composite), PROMPTS, 7)


@pytest.mark.parametrize("composite", [False, True])
def test_one_token_past_the_limit_is_refused_with_the_budget_that_fits(composite: bool) -> None:
    with pytest.raises(PrecisionConfigError) as caught:
        _check_positions(_model(16, composite=composite), PROMPTS, 8)
    assert str(caught.value) == (
        "max-new-tokens: 8 plus the longest prompt's 9 tokens exceeds the model's "
        "max_position_embeddings=16; pass --max-new-tokens 7 or less, or shorter prompts."
    )


@pytest.mark.parametrize("limit", [9, 5])
def test_a_prompt_as_long_as_the_limit_is_refused_and_named(limit: int) -> None:
    with pytest.raises(PrecisionConfigError) as caught:
        _check_positions(_model(limit, composite=True), PROMPTS, 1)
    assert str(caught.value) == (
        f"prompts: prompt 2 is 9 tokens long, and the model reads at most "
        f"max_position_embeddings={limit} tokens, prompt and completion together; "
        f"shorten it to fewer than {limit} tokens (the probe uses prompts as written)."
    )


def test_a_prompt_one_under_the_limit_leaves_room_for_one_token() -> None:
    _check_positions(_model(10), PROMPTS, 1)
    with pytest.raises(PrecisionConfigError, match="pass --max-new-tokens 1 or less"):
        _check_positions(_model(10), PROMPTS, 2)


@pytest.mark.parametrize("limit", [None, 0, -4, True, 2.5, "16"])
def test_a_config_that_names_no_limit_is_not_checked(limit: Any) -> None:
    _check_positions(_model(limit), PROMPTS, 10**6)
