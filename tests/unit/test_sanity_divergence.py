"""A sanity run that diverges (a learning rate far too large) is one message naming the rate,
not torch's ``probability tensor contains either inf, nan`` from deep inside generation (what
``precision-plugin sanity --learning-rate 5 --smoke`` ended in before)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.sanity.run import _refuse_divergence
from precision_plugin.sanity.schema import SanityConfig

SAMPLING = RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")


def _trainer(weight: float) -> SimpleNamespace:
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = weight
    return SimpleNamespace(model=model, state=SimpleNamespace(global_step=3))


def test_nan_probabilities_name_the_step_and_the_rate() -> None:
    config = SanityConfig(steps=6, learning_rate=5.0)
    with pytest.raises(PrecisionConfigError) as refused:
        _refuse_divergence(SAMPLING, _trainer(1.0), config, 7, "float16")
    assert str(refused.value) == (
        "learning-rate: GRPO in float16 (seed 7) diverged at step 4 of 6: the policy's sampling "
        "probabilities became NaN or inf at --learning-rate 5; pass a smaller one (default "
        "0.0002)."
    )


def test_nan_weights_are_named_whatever_the_error_says() -> None:
    config = SanityConfig(steps=6, learning_rate=0.5)
    with pytest.raises(PrecisionConfigError) as refused:
        _refuse_divergence(
            RuntimeError("shape mismatch"), _trainer(float("inf")), config, 0, "bfloat16"
        )
    assert (
        "diverged at step 4 of 6: the policy's weights became NaN or inf at --learning-rate 0.5"
        in str(refused.value)
    )


def test_another_error_with_finite_weights_is_left_alone() -> None:
    # The caller re-raises it as it was: a bug is not reported as a learning rate.
    assert (
        _refuse_divergence(
            RuntimeError("shape mismatch"), _trainer(1.0), SanityConfig(), 0, "float16"
        )
        is None
    )
