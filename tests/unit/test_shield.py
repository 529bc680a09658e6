"""Training-time code never stops training except on purpose (``precision_plugin._base.shield``), and
the telemetry inside TRL's loss step is its first user."""

from __future__ import annotations

import logging
import types

import pytest
import torch

from precision_plugin import PrecisionConfigError, PrecisionMismatchError, PrecisionPolicy
from precision_plugin._base.shield import shielded, stops_training
from precision_plugin.errors import ForwardOverflowError, LossScaleAtMinimumError
from precision_plugin.trl import telemetry


def _overflow() -> ForwardOverflowError:
    return ForwardOverflowError(
        "x", module="m", module_class="L", step=0, input_max=1.0, kind="inf"
    )


@pytest.mark.parametrize(
    ("error", "strictness", "stops"),
    [
        (RuntimeError("plugin bug"), "warn", False),
        (RuntimeError("plugin bug"), "error", False),
        (PrecisionConfigError("bad shapes"), "warn", False),
        (PrecisionConfigError("bad shapes"), "error", True),
        (PrecisionMismatchError("refused"), "warn", True),
        (LossScaleAtMinimumError("stuck"), "warn", True),
        (_overflow(), "warn", True),
        (KeyboardInterrupt(), "warn", True),
        (SystemExit(1), "warn", True),
    ],
)
def test_what_stops_training(error, strictness, stops, caplog) -> None:
    assert stops_training(error, strictness) is stops
    ran_after = []
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        if stops:
            with pytest.raises(type(error)), shielded("the check", strictness):
                raise error
        else:
            with shielded("the check", strictness):
                raise error
            ran_after.append(True)
    assert ran_after == ([] if stops else [True])
    assert ("the check is skipped" in caplog.text) is not stops


def test_the_warning_is_given_once_per_kind(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        for _ in range(3):
            with shielded("metric A"):
                raise ValueError("a")
        with shielded("metric B"):
            raise ValueError("b")
    assert [r.message.split(" is skipped")[0] for r in caplog.records] == [
        "precision_plugin: metric A",
        "precision_plugin: metric B",
    ]


def _trainer() -> types.SimpleNamespace:
    return types.SimpleNamespace(model=types.SimpleNamespace(training=True))


def test_a_telemetry_shape_mismatch_never_reaches_the_loss_step(caplog) -> None:
    """TRL's tensors of different shapes (issue 20, class 8): the loss is computed and returned,
    the metric is skipped with one warning, later batches still count."""
    trainer, calls = _trainer(), []

    def original(self, model, inputs):
        calls.append(inputs)
        return torch.tensor(1.5)

    def inputs(width_old: int) -> dict[str, torch.Tensor]:
        return {
            "sampling_per_token_logps": torch.full((2, 3), -0.5),
            "old_per_token_logps": torch.full((2, width_old), -0.4),
            "completion_mask": torch.ones(2, 3),
        }

    policy = PrecisionPolicy()
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        for _ in range(2):
            loss = telemetry.compute_loss(policy, original, trainer, None, inputs(4))
            assert float(loss) == 1.5
    assert len(calls) == 2
    warned = [r for r in caplog.records if "mismatch telemetry" in r.message]
    assert len(warned) == 1 and "shapes" in warned[0].message
    assert telemetry.flush(trainer) == {}  # nothing was counted from the bad batches
    # A good batch afterwards is measured: 6 tokens, |log π − log μ| = 0.1 each.
    telemetry.compute_loss(policy, original, trainer, None, inputs(3))
    metrics = telemetry.flush(trainer)
    assert metrics["tokens"] == 6 and metrics["logp_abs_diff_mean"] == pytest.approx(0.1)


def test_a_strict_policy_still_stops_on_a_telemetry_config_error() -> None:
    trainer = _trainer()
    inputs = {
        "sampling_per_token_logps": torch.full((2, 3), -0.5),
        "old_per_token_logps": torch.full((2, 4), -0.4),
        "completion_mask": torch.ones(2, 3),
    }
    with pytest.raises(PrecisionConfigError, match="shapes"):
        telemetry.compute_loss(
            PrecisionPolicy(strictness="error"), lambda *a: 0.0, trainer, None, inputs
        )
